// Package redisrecord is the layout of a redisstore record on the Go side:
// the names and encodings that the store's scripts (acquire.lua,
// complete.lua, extend.lua, release.lua, watch.lua) write and read, for the
// store, idemctl and the tests that plant or read records. A change of the
// layout touches those scripts and this file.
//
// A record is a hash at the store's prefix and the storage key (see
// redisstore/README.md, Record layout). Its field h, the head, is
//
//	<state><token length>:<token><epoch>:<lease end>:<fingerprint>
//
// with the state InProgress, Watched or Complete; the holder's lease token
// (the completer's, once complete) after its decimal length; the epoch, 1
// for the first lease and +1 for each steal; the lease's end in Unix
// milliseconds on the server's clock (both 1 to 15 decimal digits without
// a leading zero); and the fingerprint, raw bytes, to the end. A COMPLETE
// record also holds its payload in the field PayloadField(fingerprint):
// the length of the meta block as a uvarint, the meta block
// (internal/wire) and the body.
package redisrecord

import (
	"encoding/binary"
	"errors"
	"strconv"
	"strings"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/wire"
)

// HeadField is the name of a record's head.
const HeadField = "h"

// The states a head opens with.
const (
	InProgress byte = 'p'
	Watched    byte = 'P' // in progress, and a waiter watches it: its complete or release publishes
	Complete   byte = 'c'
)

// MaxEpoch is the largest epoch, and the latest lease end, that a head
// holds: 15 digits. Lua numbers are doubles, exact for integers below 2^53,
// so the scripts' arithmetic on them stays exact.
const MaxEpoch = 999_999_999_999_999

// Head is a record's head, decoded.
type Head struct {
	State       byte
	Token       string
	Epoch       int64
	LeaseEnd    int64 // Unix milliseconds on the server's clock
	Fingerprint string
}

// InProgress reports whether h is the head of a record in progress,
// watched or not.
func (h Head) InProgress() bool { return h.State == InProgress || h.State == Watched }

// String returns h as the scripts write it.
func (h Head) String() string {
	return string(h.State) + TokenTag(h.Token) + strconv.FormatInt(h.Epoch, 10) + ":" +
		strconv.FormatInt(h.LeaseEnd, 10) + ":" + h.Fingerprint
}

// The errors of ParseHead, worded as acquire.lua reports the same heads.
var (
	errStateOrToken = errors.New("field h: malformed state or token length")
	errEpochOrEnd   = errors.New("field h: malformed epoch or lease end")
)

// ParseHead decodes a head as strictly as acquire.lua reads it: a head it
// would report as corrupt is an error with acquire.lua's words.
func ParseHead(h string) (Head, error) {
	if h == "" || (h[0] != InProgress && h[0] != Watched && h[0] != Complete) {
		return Head{}, errStateOrToken
	}
	tl, rest, ok := strings.Cut(h[1:], ":")
	if !ok || !digits(tl, 9) {
		return Head{}, errStateOrToken
	}
	n, _ := strconv.Atoi(tl)
	if n > len(rest) {
		return Head{}, errEpochOrEnd
	}
	hd := Head{State: h[0], Token: rest[:n]}
	e, rest, ok1 := strings.Cut(rest[n:], ":")
	d, fp, ok2 := strings.Cut(rest, ":")
	if !ok1 || !ok2 || !digits(e, 15) || !digits(d, 15) {
		return Head{}, errEpochOrEnd
	}
	hd.Epoch, _ = strconv.ParseInt(e, 10, 64)
	hd.LeaseEnd, _ = strconv.ParseInt(d, 10, 64)
	hd.Fingerprint = fp
	return hd, nil
}

// digits reports whether v is 1 to n decimal digits without a leading
// zero.
func digits(v string, n int) bool {
	return v != "" && len(v) <= n && v[0] != '0' && strings.Trim(v, "0123456789") == ""
}

// TokenTag returns token as a head spells it after its state:
// <length>:<token>. A head opens with its state and this tag, so the fenced
// scripts compare one substring; a decimal length followed by ":" is never
// a prefix of another, so equal tags mean equal tokens.
func TokenTag(token string) string { return strconv.Itoa(len(token)) + ":" + token }

// PayloadField returns the name of the payload field of a COMPLETE record
// made by a request with fingerprint fp, so that a replay is one HGET of
// the field its own fingerprint names.
func PayloadField(fp string) string { return "c" + fp }

// Channel returns the pub/sub channel of the record at recordKey, on which
// complete and release announce a watched record's change.
func Channel(recordKey string) string { return recordKey + ":changed" }

// AppendPayload appends the payload of resp to b: the length of its meta
// block as a uvarint, the meta block (wire.AppendMeta) and the body (none
// when BodyOmitted or HeaderOmitted).
func AppendPayload(b []byte, resp *idempotency.Response) ([]byte, error) {
	meta, err := wire.AppendMeta(nil, resp)
	if err != nil {
		return nil, err
	}
	body := resp.Body
	if resp.BodyOmitted || resp.HeaderOmitted {
		body = nil
	}
	b = binary.AppendUvarint(b, uint64(len(meta)))
	b = append(b, meta...)
	return append(b, body...), nil
}

// MetaBounds returns where the meta block lies in a payload of size bytes,
// p[start:end], given p, its first bytes (at least binary.MaxVarintLen64 of
// them, or all). end may lie past the end of p. The uvarint is read from a
// copy of those first bytes only, never of the body.
func MetaBounds(p string, size int) (start, end int, err error) {
	n, k := binary.Uvarint([]byte(p[:min(len(p), binary.MaxVarintLen64)]))
	if k <= 0 || n > uint64(size-k) {
		return 0, 0, errors.New("payload: malformed meta length")
	}
	return k, k + int(n), nil
}

// SplitPayload returns the meta block and the body of the payload p.
func SplitPayload(p string) (meta, body string, err error) {
	start, end, err := MetaBounds(p, len(p))
	if err != nil {
		return "", "", err
	}
	return p[start:end], p[end:], nil
}
