package outbox_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/go-idempotency/idempotency/outbox"
)

// TestMessageGrammar: Validate accepts what NATS subjects and RabbitMQ
// routing keys both take, and refuses the rest with an error wrapping
// ErrInvalidMessage that names the rule.
func TestMessageGrammar(t *testing.T) {
	ok := []outbox.Message{
		{Topic: "orders.created"},
		{Topic: "a"},
		{Topic: strings.Repeat("a", outbox.MaxTopicLen)},
		{Topic: "!#$%&'()+,-/:;<=?@[]^_`{|}~"},
		{Topic: "t", Headers: map[string]string{"Content-Type": "application/json", "x!#$%&'*+-.^_`|~9": "é ünïcode\ttab"}},
		{Topic: "t", Headers: map[string]string{strings.Repeat("h", outbox.MaxHeaderNameLen): ""}},
		{Topic: "t", Headers: map[string]string{"big": strings.Repeat("v", outbox.MaxHeadersSize-3)}},
		{Topic: "t", OrderingKey: strings.Repeat("é", outbox.MaxOrderingKeyLen/2)},
		{Topic: "t", Payload: make([]byte, outbox.MaxPayloadSize)},
		{Topic: "t", Payload: []byte{0, 0xff, '\n'}},
	}
	for _, m := range ok {
		if err := m.Validate(); err != nil {
			t.Errorf("%.80q: %v", m.Topic, err)
		}
	}
	for _, c := range []struct {
		m    outbox.Message
		rule string
	}{
		{outbox.Message{}, "no topic"},
		{outbox.Message{Topic: "a b"}, "not visible ASCII"},
		{outbox.Message{Topic: "a\tb"}, "not visible ASCII"},
		{outbox.Message{Topic: "né"}, "not visible ASCII"},
		{outbox.Message{Topic: "a\x7f"}, "not visible ASCII"},
		{outbox.Message{Topic: "orders.*"}, "wildcards"},
		{outbox.Message{Topic: "orders.>"}, "wildcards"},
		{outbox.Message{Topic: "a*b"}, "wildcards"},
		{outbox.Message{Topic: ".a"}, "empty token"},
		{outbox.Message{Topic: "a."}, "empty token"},
		{outbox.Message{Topic: "a..b"}, "empty token"},
		{outbox.Message{Topic: strings.Repeat("a", outbox.MaxTopicLen+1)}, "over 255 (MaxTopicLen)"},
		{outbox.Message{Topic: "t", Headers: map[string]string{"": "v"}}, "header name"},
		{outbox.Message{Topic: "t", Headers: map[string]string{"Bad Name": "v"}}, `header name "Bad Name" is not 1 to 128 bytes of RFC 9110 token characters`},
		{outbox.Message{Topic: "t", Headers: map[string]string{"a:b": "v"}}, "header name"},
		{outbox.Message{Topic: "t", Headers: map[string]string{strings.Repeat("h", outbox.MaxHeaderNameLen+1): ""}}, "header name"},
		{outbox.Message{Topic: "t", Headers: map[string]string{"h": "a\r\nInjected: 1"}}, "header h: the value holds CR, LF or NUL"},
		{outbox.Message{Topic: "t", Headers: map[string]string{"h": "a\x00"}}, "CR, LF or NUL"},
		{outbox.Message{Topic: "t", Headers: map[string]string{"h": "\xff"}}, "not valid UTF-8"},
		{outbox.Message{Topic: "t", Headers: map[string]string{"big": strings.Repeat("v", outbox.MaxHeadersSize)}}, "over 65536 (MaxHeadersSize)"},
		{outbox.Message{Topic: "t", OrderingKey: strings.Repeat("k", outbox.MaxOrderingKeyLen+1)}, "MaxOrderingKeyLen"},
		{outbox.Message{Topic: "t", OrderingKey: "\xff"}, "the ordering key is not valid UTF-8"},
		{outbox.Message{Topic: "t", OrderingKey: "a\x00"}, "NUL"},
		{outbox.Message{Topic: "t", Payload: make([]byte, outbox.MaxPayloadSize+1)}, "over 1048576 (MaxPayloadSize)"},
	} {
		err := c.m.Validate()
		if !errors.Is(err, outbox.ErrInvalidMessage) || !strings.Contains(err.Error(), c.rule) {
			t.Errorf("%.40q %v: %v, want ErrInvalidMessage and %q", c.m.Topic, c.m.Headers, err, c.rule)
		}
	}
}

// FuzzMessage checks Validate against the grammar written out byte by
// byte: what it accepts NATS and RabbitMQ accept (a topic of visible ASCII
// without wildcards or empty tokens, header names of token characters,
// values without line breaks), and what it refuses wraps
// ErrInvalidMessage. The seed corpus is testdata/fuzz/FuzzMessage.
func FuzzMessage(f *testing.F) {
	f.Add("orders.created", "Content-Type", "application/json", "acct-1", 10)
	f.Fuzz(func(t *testing.T, topic, name, value, key string, payload int) {
		m := outbox.Message{Topic: topic, Headers: map[string]string{name: value}, OrderingKey: key, Payload: make([]byte, min(max(payload, 0), outbox.MaxPayloadSize+1))}
		err := m.Validate()
		if err != nil {
			if !errors.Is(err, outbox.ErrInvalidMessage) {
				t.Fatalf("%v does not wrap ErrInvalidMessage", err)
			}
			return
		}
		if len(topic) == 0 || len(topic) > 255 {
			t.Fatalf("accepted a topic of %d bytes", len(topic))
		}
		for i := range len(topic) {
			if c := topic[i]; c <= ' ' || c > '~' || c == '*' || c == '>' {
				t.Fatalf("accepted the topic %q with byte %q", topic, c)
			}
		}
		for _, token := range strings.Split(topic, ".") {
			if token == "" {
				t.Fatalf("accepted the topic %q with an empty token", topic)
			}
		}
		if name == "" || len(name) > 128 || strings.ContainsFunc(name, func(r rune) bool {
			return !(r < utf8.RuneSelf && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r)))
		}) {
			t.Fatalf("accepted the header name %q", name)
		}
		if strings.ContainsAny(value, "\r\n\x00") || !utf8.ValidString(value) || len(name)+len(value) > outbox.MaxHeadersSize {
			t.Fatalf("accepted the header value %q", value)
		}
		if !utf8.ValidString(key) || strings.IndexByte(key, 0) >= 0 || len(key) > outbox.MaxOrderingKeyLen || len(m.Payload) > outbox.MaxPayloadSize {
			t.Fatalf("accepted the ordering key %q or a payload of %d bytes", key, len(m.Payload))
		}
		// Accepted, the headers are stored as JSON (a jsonb column) and
		// come back as they were.
		b, err := json.Marshal(m.Headers)
		var back map[string]string
		if err != nil || json.Unmarshal(b, &back) != nil || back[name] != value || len(back) != 1 {
			t.Fatalf("the headers %q do not round-trip through JSON: %s, %v", m.Headers, b, err)
		}
	})
}
