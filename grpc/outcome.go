package idemgrpc

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// outcome is what a call produced, as its record stores it and a replay
// returns it: the response message or the error's status, and the header
// and trailer metadata the handler set.
type outcome struct {
	response proto.Message // nil for an error (and for a nil response)
	status   *spb.Status   // code OK for a response
	header   metadata.MD
	trailer  metadata.MD
}

// The stored form of an outcome is a protocol buffer message of its own,
// written with protowire in a fixed order and with deterministic
// marshalling, so that equal outcomes are equal bytes:
//
//	message Outcome {
//	  google.protobuf.Any response = 1; // absent for an error
//	  google.rpc.Status status = 2;     // always present; code 0 (OK) for a response
//	  repeated Pair header = 3;         // keys in order, each key's values in order
//	  repeated Pair trailer = 4;
//	}
//	message Pair {
//	  string key = 1;
//	  bytes value = 2;
//	}
const (
	fieldResponse protowire.Number = 1
	fieldStatus   protowire.Number = 2
	fieldHeader   protowire.Number = 3
	fieldTrailer  protowire.Number = 4

	fieldPairKey   protowire.Number = 1
	fieldPairValue protowire.Number = 2
)

var deterministic = proto.MarshalOptions{Deterministic: true}

// errUnreadable wraps the errors of a stored outcome that cannot be decoded.
var errUnreadable = errors.New("idemgrpc: stored outcome unreadable")

// marshal returns the stored form of o. It is never empty: the status is
// always written.
func (o *outcome) marshal() ([]byte, error) {
	var b []byte
	if o.response != nil {
		a := new(anypb.Any)
		if err := anypb.MarshalFrom(a, o.response, deterministic); err != nil {
			return nil, fmt.Errorf("idemgrpc: marshal the response: %w", err)
		}
		var err error
		if b, err = appendMessage(b, fieldResponse, a); err != nil {
			return nil, err
		}
	}
	b, err := appendMessage(b, fieldStatus, o.status)
	if err != nil {
		return nil, err
	}
	b = appendMetadata(b, fieldHeader, o.header)
	b = appendMetadata(b, fieldTrailer, o.trailer)
	return b, nil
}

func appendMessage(b []byte, num protowire.Number, m proto.Message) ([]byte, error) {
	v, err := deterministic.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("idemgrpc: marshal the outcome: %w", err)
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v), nil
}

func appendMetadata(b []byte, num protowire.Number, md metadata.MD) []byte {
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		for _, v := range md[k] {
			var pair []byte
			pair = protowire.AppendTag(pair, fieldPairKey, protowire.BytesType)
			pair = protowire.AppendString(pair, strings.ToLower(k))
			pair = protowire.AppendTag(pair, fieldPairValue, protowire.BytesType)
			pair = protowire.AppendString(pair, v)
			b = protowire.AppendTag(b, num, protowire.BytesType)
			b = protowire.AppendBytes(b, pair)
		}
	}
	return b
}

// unmarshalOutcome decodes a stored outcome. The response's type is looked
// up in the global registry, where generated code registers every message.
func unmarshalOutcome(b []byte) (*outcome, error) {
	o := &outcome{header: metadata.MD{}, trailer: metadata.MD{}}
	err := eachField(b, func(num protowire.Number, v []byte) error {
		switch num {
		case fieldResponse:
			a := new(anypb.Any)
			if err := proto.Unmarshal(v, a); err != nil {
				return err
			}
			m, err := a.UnmarshalNew()
			if err != nil {
				return err
			}
			o.response = m
		case fieldStatus:
			o.status = new(spb.Status)
			return proto.Unmarshal(v, o.status)
		case fieldHeader, fieldTrailer:
			md := o.header
			if num == fieldTrailer {
				md = o.trailer
			}
			var key, value string
			err := eachField(v, func(num protowire.Number, v []byte) error {
				switch num {
				case fieldPairKey:
					key = string(v)
				case fieldPairValue:
					value = string(v)
				}
				return nil
			})
			md[key] = append(md[key], value)
			return err
		}
		return nil
	})
	if err == nil && o.status == nil {
		err = errors.New("no status")
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUnreadable, err)
	}
	return o, nil
}

// eachField calls fn with each length-delimited field of the message b,
// the only kind an outcome has.
func eachField(b []byte, fn func(num protowire.Number, v []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if typ != protowire.BytesType {
			return fmt.Errorf("field %d has wire type %d", num, typ)
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := fn(num, v); err != nil {
			return err
		}
	}
	return nil
}
