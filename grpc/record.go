package idemgrpc

import (
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/go-idempotency/idempotency"
)

// outcome is what a call produced, as its record stores it and a replay
// returns it: the response message or the error's status, and the header
// and trailer metadata the handler set.
type outcome struct {
	response any         // nil for an error (and for a nil response)
	status   *spb.Status // code OK for a response
	header   metadata.MD
	trailer  metadata.MD
	// omitted: the record was stored without its body, so only the status
	// survives: its code, and its message unless the headers were omitted
	// too.
	omitted bool
}

// The record of an outcome is an idempotency.Response, so that what a store
// keeps when it cannot keep everything is the outcome itself:
//
//   - Status: the outcome's code, mapped onto an HTTP status (httpStatuses).
//     Every store keeps it, whatever else it drops.
//   - Header: Grpc-Status, the code in decimal, and Grpc-Message, the
//     status message percent-encoded byte by byte as gRPC's HTTP/2 wire
//     encodes it (so that invalid UTF-8 survives), cut to its first
//     maxHeaderMessage bytes. A store at its bound keeps them when it has
//     room for them (HeaderOmitted otherwise).
//   - Body: the outcome in full (below). It is marked omitted
//     (BodyOmitted) when it is over the Runner's cap or a store's bound,
//     and when it cannot be marshalled: invalid UTF-8 in the status
//     message or in a string field of the response, a response that is not
//     a protocol buffer message.
//
// Records written before the code was kept outside the body (Status 200,
// Content-Type application/octet-stream, no Grpc-Status) are read too.
const (
	headerStatus  = "Grpc-Status"
	headerMessage = "Grpc-Message"
	// legacyContentType is the Content-Type of a record whose body alone
	// holds the outcome.
	legacyContentType = "application/octet-stream"
	// maxHeaderMessage bounds the message kept in Grpc-Message, in bytes
	// before encoding; the body keeps it whole.
	maxHeaderMessage = 1024
)

// The body of a record is a protocol buffer message of its own, written
// with protowire in a fixed order and with deterministic marshalling, so
// that equal outcomes are equal bytes:
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

// httpStatuses maps each gRPC code onto the HTTP status of its record:
// Google's canonical mapping (google/rpc/code.proto) where it gives each
// code a status of its own, and where it gives several codes one status,
// that status to the code it names best and a status of their own to the
// others: FailedPrecondition 412 and OutOfRange 416 (not 400), Aborted 424
// (not 409), Unknown 520 and DataLoss 530 (not 500; both unassigned). A
// code outside these 17 is recorded as Unknown's status, and kept exactly
// in Grpc-Status.
var httpStatuses = [...]int{
	codes.OK:                 http.StatusOK,                           // 200
	codes.Canceled:           499,                                     // Client Closed Request
	codes.Unknown:            520,                                     // unassigned
	codes.InvalidArgument:    http.StatusBadRequest,                   // 400
	codes.DeadlineExceeded:   http.StatusGatewayTimeout,               // 504
	codes.NotFound:           http.StatusNotFound,                     // 404
	codes.AlreadyExists:      http.StatusConflict,                     // 409
	codes.PermissionDenied:   http.StatusForbidden,                    // 403
	codes.ResourceExhausted:  http.StatusTooManyRequests,              // 429
	codes.FailedPrecondition: http.StatusPreconditionFailed,           // 412
	codes.Aborted:            http.StatusFailedDependency,             // 424
	codes.OutOfRange:         http.StatusRequestedRangeNotSatisfiable, // 416
	codes.Unimplemented:      http.StatusNotImplemented,               // 501
	codes.Internal:           http.StatusInternalServerError,          // 500
	codes.Unavailable:        http.StatusServiceUnavailable,           // 503
	codes.DataLoss:           530,                                     // unassigned
	codes.Unauthenticated:    http.StatusUnauthorized,                 // 401
}

// httpStatus returns the HTTP status that records code c.
func httpStatus(c codes.Code) int {
	if int(c) < len(httpStatuses) {
		return httpStatuses[c]
	}
	return httpStatuses[codes.Unknown]
}

// codeOf returns the code recorded as the HTTP status s.
func codeOf(s int) (codes.Code, bool) {
	for c, status := range httpStatuses {
		if status == s {
			return codes.Code(c), true
		}
	}
	return 0, false
}

var deterministic = proto.MarshalOptions{Deterministic: true}

// errUnreadable wraps the errors of a stored outcome that cannot be read.
var errUnreadable = errors.New("idemgrpc: stored outcome unreadable")

// record returns the record of o. It never fails: a body that cannot be
// marshalled is left out, and the record marked so.
func (o *outcome) record() *idempotency.Response {
	code := codes.Code(o.status.GetCode())
	r := &idempotency.Response{
		Status: httpStatus(code),
		Header: http.Header{headerStatus: {strconv.FormatUint(uint64(code), 10)}},
	}
	if msg := o.status.GetMessage(); msg != "" {
		r.Header[headerMessage] = []string{encodeMessage(cutMessage(msg, maxHeaderMessage))}
	}
	if body, err := o.marshal(); err == nil {
		r.Body = body
	} else {
		r.BodyOmitted = true
	}
	return r
}

// readRecord returns the outcome a record stores: whole, or, for a record
// stored without its body, its status as far as it survived.
func readRecord(r *idempotency.Response) (*outcome, error) {
	if r == nil {
		return nil, fmt.Errorf("%w: no record", errUnreadable)
	}
	code, exact, err := recordedCode(r)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUnreadable, err)
	}
	if r.BodyOmitted || r.HeaderOmitted {
		st := &spb.Status{Code: int32(code)}
		switch {
		case !r.HeaderOmitted:
			st.Message = decodeMessage(r.Header.Get(headerMessage))
		case code != codes.OK:
			st.Message = fmt.Sprintf("idemgrpc: the call with this idempotency key ran and answered %v; its message was not stored", code)
		}
		return &outcome{status: st, omitted: true}, nil
	}
	o, err := unmarshalOutcome(r.Body)
	if err != nil {
		return nil, err
	}
	if got := codes.Code(o.status.GetCode()); exact && got != code {
		return nil, fmt.Errorf("%w: the body holds code %v, the headers %v", errUnreadable, got, code)
	}
	return o, nil
}

// recordedCode returns the code a record keeps outside its body: exactly,
// from Grpc-Status, or from the HTTP status alone when its headers were
// omitted. A record written before the code was kept outside the body has
// Status 200 and its code in the body only (exact is false).
func recordedCode(r *idempotency.Response) (code codes.Code, exact bool, err error) {
	if v := r.Header.Get(headerStatus); v != "" {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil || httpStatus(codes.Code(n)) != r.Status {
			return 0, false, fmt.Errorf("%s %q does not match status %d", headerStatus, v, r.Status)
		}
		return codes.Code(n), true, nil
	}
	if !r.HeaderOmitted && r.Header.Get("Content-Type") != legacyContentType {
		return 0, false, fmt.Errorf("no %s header", headerStatus)
	}
	code, ok := codeOf(r.Status)
	if !ok {
		return 0, false, fmt.Errorf("status %d records no gRPC code", r.Status)
	}
	return code, false, nil
}

// encodeMessage percent-encodes msg as gRPC's HTTP/2 wire does the
// grpc-message header, byte by byte: each byte outside printable ASCII, and
// '%', as %XX.
func encodeMessage(msg string) string {
	var b strings.Builder
	for i := range len(msg) {
		if c := msg[i]; c >= ' ' && c <= '~' && c != '%' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// decodeMessage reverses encodeMessage. A '%' not followed by two hex
// digits stands for itself, as gRPC reads it.
func decodeMessage(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(n))
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// cutMessage returns msg's first n bytes at most, not cutting a UTF-8
// character in two.
func cutMessage(msg string, n int) string {
	if len(msg) <= n {
		return msg
	}
	for i := n; i > n-utf8.UTFMax && i > 0; i-- {
		if utf8.RuneStart(msg[i]) {
			return msg[:i]
		}
	}
	return msg[:n]
}

// marshal returns the body of o's record. It is never empty: the status is
// always written.
func (o *outcome) marshal() ([]byte, error) {
	var b []byte
	if o.response != nil {
		m, ok := o.response.(proto.Message)
		if !ok {
			return nil, fmt.Errorf("idemgrpc: the response is a %T, not a protocol buffer message", o.response)
		}
		a := new(anypb.Any)
		if err := anypb.MarshalFrom(a, m, deterministic); err != nil {
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

// unmarshalOutcome decodes the body of a record. The response's type is
// looked up in the global registry, where generated code registers every
// message.
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
