package outbox

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// The caps of a Message's grammar (see Message).
const (
	// MaxTopicLen is the longest topic, in bytes: RabbitMQ's longest
	// routing key.
	MaxTopicLen = 255
	// MaxHeaderNameLen is the longest header name, in bytes.
	MaxHeaderNameLen = 128
	// MaxHeadersSize bounds a message's headers, names and values, in
	// bytes: 64 KiB.
	MaxHeadersSize = 64 << 10
	// MaxOrderingKeyLen is the longest ordering key, in bytes.
	MaxOrderingKeyLen = 1024
	// MaxPayloadSize is the largest payload, in bytes: 1 MiB, the default
	// largest message of a NATS server (max_payload); a broker set lower
	// refuses what is over its own limit at the publish.
	MaxPayloadSize = 1 << 20
)

// Validate returns nil when m follows the grammar written beside Message,
// or an error wrapping ErrInvalidMessage that names the rule m breaks.
// Enqueue validates every message before it writes any.
func (m Message) Validate() error {
	if problem := m.problem(); problem != "" {
		return fmt.Errorf("%w: %s", ErrInvalidMessage, problem)
	}
	return nil
}

// problem returns the rule of the grammar m breaks, or "".
func (m Message) problem() string {
	if p := topicProblem(m.Topic); p != "" {
		return p
	}
	names := make([]string, 0, len(m.Headers))
	size := 0
	for k, v := range m.Headers {
		names = append(names, k)
		size += len(k) + len(v)
	}
	slices.Sort(names) // the same header named every time
	for _, k := range names {
		if !token(k) {
			return fmt.Sprintf("header name %.64q is not 1 to %d bytes of RFC 9110 token characters (letters, digits and !#$%%&'*+-.^_`|~)", k, MaxHeaderNameLen)
		}
		v := m.Headers[k]
		if strings.ContainsAny(v, "\r\n\x00") {
			return fmt.Sprintf("header %s: the value holds CR, LF or NUL", k)
		}
		if !utf8.ValidString(v) {
			return fmt.Sprintf("header %s: the value is not valid UTF-8", k)
		}
	}
	if size > MaxHeadersSize {
		return fmt.Sprintf("the headers are %d bytes, over %d (MaxHeadersSize)", size, MaxHeadersSize)
	}
	switch k := m.OrderingKey; {
	case len(k) > MaxOrderingKeyLen:
		return fmt.Sprintf("the ordering key is %d bytes, over %d (MaxOrderingKeyLen)", len(k), MaxOrderingKeyLen)
	case !utf8.ValidString(k):
		return "the ordering key is not valid UTF-8"
	case strings.IndexByte(k, 0) >= 0:
		return "the ordering key holds a NUL byte"
	}
	if len(m.Payload) > MaxPayloadSize {
		return fmt.Sprintf("the payload is %d bytes, over %d (MaxPayloadSize)", len(m.Payload), MaxPayloadSize)
	}
	return ""
}

// topicProblem returns the rule of the grammar topic breaks, or "".
func topicProblem(topic string) string {
	switch {
	case topic == "":
		return "no topic"
	case len(topic) > MaxTopicLen:
		return fmt.Sprintf("the topic is %d bytes, over %d (MaxTopicLen)", len(topic), MaxTopicLen)
	}
	for i := range len(topic) {
		switch c := topic[i]; {
		case c <= ' ' || c > '~':
			return fmt.Sprintf("topic %.64q: byte %d is not visible ASCII (a space, a control character or not ASCII)", topic, i)
		case c == '*' || c == '>':
			return fmt.Sprintf("topic %.64q: '*' and '>' are wildcards, which no broker publishes to", topic)
		}
	}
	if slices.Contains(strings.Split(topic, "."), "") {
		return fmt.Sprintf("topic %.64q: an empty token (a leading, trailing or doubled '.')", topic)
	}
	return ""
}

// token reports whether s is 1 to MaxHeaderNameLen bytes of RFC 9110 token
// characters (tchar).
func token(s string) bool {
	if s == "" || len(s) > MaxHeaderNameLen {
		return false
	}
	for i := range len(s) {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
