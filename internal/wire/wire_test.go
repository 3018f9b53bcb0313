package wire

import (
	"encoding/binary"
	"errors"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/go-idempotency/idempotency"
)

func TestCodecRoundTrip(t *testing.T) {
	for _, resp := range []*idempotency.Response{
		{Status: 200},
		{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"ok":true}`)},
		{Status: 599, Header: http.Header{"X-Empty": {}, "X-Multi": {"", "a", strings.Repeat("v", 300)}}, Body: []byte{0, 0xff}},
		{Status: 413, Header: http.Header{"A": {"1"}}, BodyOmitted: true},
	} {
		meta, err := encodeMeta(resp)
		if err != nil {
			t.Fatal(err)
		}
		body := string(resp.Body)
		got, err := Decode(string(meta), body)
		if err != nil {
			t.Fatalf("Decode(encode(%+v)): %v", resp, err)
		}
		if !reflect.DeepEqual(got, resp) {
			t.Fatalf("round trip: got %+v, want %+v", got, resp)
		}
	}
}

func TestCodecDeterministic(t *testing.T) {
	resp := &idempotency.Response{Status: 200, Header: http.Header{"B": {"2"}, "A": {"1"}, "C": {"3"}}}
	first, _ := encodeMeta(resp)
	for i := 0; i < 20; i++ {
		again, _ := encodeMeta(resp)
		if string(again) != string(first) {
			t.Fatal("encoding depends on map order")
		}
	}
}

func TestCodecCompact(t *testing.T) {
	resp := &idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}}
	meta, _ := encodeMeta(resp)
	// version, status (2 bytes), flags, count, name len, name, value count,
	// value len, value.
	if want := 1 + 2 + 1 + 1 + 1 + len("Content-Type") + 1 + 1 + len("application/json"); len(meta) != want {
		t.Fatalf("meta is %d bytes, want %d", len(meta), want)
	}
}

// TestAppendMetaExact: a block built from nothing is allocated at its exact
// size, so a store that keeps it keeps no slack beyond the allocator's.
func TestAppendMetaExact(t *testing.T) {
	long := strings.Repeat("v", 200) // a two-byte length
	for _, resp := range []*idempotency.Response{
		{Status: 200},
		{Status: 599, Header: http.Header{"Content-Type": {"application/json"}, "X-Long": {long, ""}, "X-None": {}}},
	} {
		meta, err := AppendMeta(nil, resp)
		if err != nil {
			t.Fatal(err)
		}
		// The allocator rounds up to its size class, and no further.
		if want := cap(slices.Grow([]byte(nil), len(meta))); cap(meta) != want {
			t.Errorf("%d-byte block has capacity %d, want %d", len(meta), cap(meta), want)
		}
	}
	for _, x := range []uint64{0, 1, 127, 128, 16383, 16384, 1<<63 - 1, 1<<64 - 1} {
		if got, want := uvarintLen(x), len(binary.AppendUvarint(nil, x)); got != want {
			t.Errorf("uvarintLen(%d) = %d, want %d", x, got, want)
		}
	}
}

// TestAppendMetaRejects: a response without a valid status has no block,
// and the error says why.
func TestAppendMetaRejects(t *testing.T) {
	for _, resp := range []*idempotency.Response{nil, {Status: 199}, {Status: 600}} {
		if _, err := AppendMeta(nil, resp); !errors.Is(err, ErrUnstorable) {
			t.Errorf("AppendMeta(%+v) = %v, want ErrUnstorable", resp, err)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	good, _ := encodeMeta(&idempotency.Response{Status: 200, Header: http.Header{"A": {"b"}}})
	for name, tc := range map[string]struct{ meta, body string }{
		"empty":             {"", ""},
		"unknown version":   {"\x02" + string(good[1:]), ""},
		"truncated":         {string(good[:len(good)-1]), ""},
		"trailing bytes":    {string(good) + "x", ""},
		"status low":        {"\x01\x63\x00\x00", ""},
		"status high":       {"\x01\xd8\x04\x00\x00", ""},
		"varint overflow":   {"\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f", ""},
		"unknown flags":     {"\x01\xc8\x01\x02\x00", ""},
		"huge count":        {"\x01\xc8\x01\x00\xff\xff\xff\xff\x0f", ""},
		"huge string":       {"\x01\xc8\x01\x00\x01\xff\xff\x03A", ""},
		"empty name":        {"\x01\xc8\x01\x00\x01\x00\x00", ""},
		"duplicate name":    {"\x01\xc8\x01\x00\x02\x01A\x00\x01A\x00", ""},
		"omitted with body": {"\x01\xc8\x01\x01\x00", "body"},
	} {
		_, err := Decode(tc.meta, tc.body)
		if !errors.Is(err, idempotency.ErrCorruptRecord) {
			t.Errorf("%s: decode = %v, want ErrCorruptRecord", name, err)
		}
	}
}

// FuzzDecodeMeta feeds arbitrary meta blocks and bodies to the decoder: it
// must never panic, must wrap ErrCorruptRecord on failure, and what it
// accepts must encode back to the same bytes (the format has one spelling).
func FuzzDecodeMeta(f *testing.F) {
	for _, resp := range []*idempotency.Response{
		{Status: 200},
		{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "X": {"1", "2"}}, Body: []byte("{}")},
		{Status: 500, Header: http.Header{"A": {}}, BodyOmitted: true},
	} {
		meta, _ := encodeMeta(resp)
		f.Add(meta, resp.Body)
	}
	f.Add([]byte("\x01\xc8\x01\x00\x02\x01A\x00\x01A\x00"), []byte(nil))
	f.Add([]byte{}, []byte("x"))
	f.Fuzz(func(t *testing.T, meta, body []byte) {
		resp, err := Decode(string(meta), string(body))
		if err != nil {
			if !errors.Is(err, idempotency.ErrCorruptRecord) {
				t.Fatalf("error %v does not wrap ErrCorruptRecord", err)
			}
			if resp != nil {
				t.Fatal("response returned with an error")
			}
			return
		}
		if resp.Status < 200 || resp.Status > 599 {
			t.Fatalf("accepted status %d", resp.Status)
		}
		again, err := encodeMeta(resp)
		if err != nil {
			t.Fatalf("re-encoding an accepted record: %v", err)
		}
		if string(again) != string(meta) {
			// Only a non-canonical order of names may differ.
			back, err := Decode(string(again), string(body))
			if err != nil || !reflect.DeepEqual(back, resp) {
				t.Fatalf("re-encoded record decodes differently: %v", err)
			}
		}
	})
}

// TestDecodeHeadersDoNotAlias checks that the headers decoded from one
// array of values stay independent: appending a value to one header leaves
// every other header as stored.
func TestDecodeHeadersDoNotAlias(t *testing.T) {
	stored := &idempotency.Response{
		Status: http.StatusOK,
		Header: http.Header{
			"A-One":   {"a"},
			"B-Many":  {"b1", "b2", "b3"},
			"C-One":   {"c"},
			"D-Empty": {},
		},
	}
	meta, err := encodeMeta(stored)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(string(meta), "")
	if err != nil {
		t.Fatal(err)
	}
	for name := range got.Header {
		got.Header[name] = append(got.Header[name], "appended to "+name)
	}
	for name, values := range stored.Header {
		want := append(append([]string(nil), values...), "appended to "+name)
		if !slices.Equal(got.Header[name], want) {
			t.Errorf("%s = %q, want %q", name, got.Header[name], want)
		}
	}
}

// encodeMeta is AppendMeta into a new block.
func encodeMeta(resp *idempotency.Response) ([]byte, error) { return AppendMeta(nil, resp) }

// TestDecodeOwned checks that DecodeOwned rebuilds what Decode does from
// the same bytes, without copying the body, and refuses what Decode
// refuses.
func TestDecodeOwned(t *testing.T) {
	resp := &idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":7}`)}
	meta, err := encodeMeta(resp)
	if err != nil {
		t.Fatal(err)
	}
	body := slices.Clone(resp.Body)
	got, err := DecodeOwned(meta, body)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, resp) {
		t.Fatalf("DecodeOwned = %+v, want %+v", got, resp)
	}
	if &got.Body[0] != &body[0] {
		t.Error("DecodeOwned copied the body it was handed")
	}
	if empty, err := DecodeOwned(meta[:len(meta):len(meta)], nil); err != nil || empty.Body != nil {
		t.Errorf("DecodeOwned with no body = %+v, %v; want a nil Body", empty, err)
	}
	if _, err := DecodeOwned(nil, body); !errors.Is(err, idempotency.ErrCorruptRecord) {
		t.Errorf("DecodeOwned of an empty meta block: %v, want ErrCorruptRecord", err)
	}
}
