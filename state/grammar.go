package state

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The caps of the grammar, in bytes (see ValidScope, ValidMachine,
// ValidID and ValidState).
const (
	MaxScopeBytes   = 128
	MaxMachineBytes = 64
	MaxIDBytes      = 256
	MaxStateBytes   = 64
	// DefaultMaxDataBytes caps a record's data unless WithMaxDataBytes
	// sets another cap.
	DefaultMaxDataBytes = 64 << 10
	// MaxVersion is the highest version a record reaches: its events are
	// numbered by version in the outbox, whose sequences are 32-bit.
	MaxVersion = 1<<31 - 1
)

// ValidScope returns nil when scope is a scope: 1 to MaxScopeBytes bytes
// of UTF-8 without control characters. The scope is the tenant the record
// belongs to (a user, an account, an organisation): records of two scopes
// never meet, nor do their events. A single-tenant application gives one
// constant scope.
func ValidScope(scope string) error {
	return text("scope", scope, MaxScopeBytes, "")
}

// ValidMachine returns nil when machine is a machine name: 1 to
// MaxMachineBytes bytes of labels joined by dots, each a lowercase ASCII
// letter followed by lowercase letters, digits, '_' or '-'
// ("payments.payment", "onepony.task"). The name is the family of records
// the caller owns, and the last part of its events' topic, which is why it
// takes nothing a broker's subject or routing key would refuse.
func ValidMachine(machine string) error {
	if machine == "" || len(machine) > MaxMachineBytes {
		return invalid("machine", "%q is not 1 to %d bytes", clip(machine), MaxMachineBytes)
	}
	for label := range strings.SplitSeq(machine, ".") {
		if label == "" || label[0] < 'a' || label[0] > 'z' {
			return invalid("machine", "%q: each dot-separated part starts with a lowercase letter", clip(machine))
		}
		for i := range len(label) {
			if c := label[i]; !lower(c) && !digit(c) && c != '_' && c != '-' {
				return invalid("machine", "%q: byte %q is not a lowercase letter, a digit, '_', '-' or '.'", clip(machine), c)
			}
		}
	}
	return nil
}

// ValidID returns nil when id is a record's id: 1 to MaxIDBytes bytes of
// UTF-8 without '/' or control characters ("pay_123", "acme:t_123").
func ValidID(id string) error {
	return text("id", id, MaxIDBytes, "/")
}

// ValidState returns nil when s is a state: 1 to MaxStateBytes bytes, an
// ASCII letter followed by ASCII letters, digits, '_' or '-'
// ("authorized", "in_review", "step-2"). States are compared byte for
// byte: "Captured" and "captured" are two states.
func ValidState(s string) error { return validState("state", s) }

// validState is ValidState naming the argument field.
func validState(field, s string) error {
	if s == "" || len(s) > MaxStateBytes {
		return invalid(field, "%q is not 1 to %d bytes", clip(s), MaxStateBytes)
	}
	if !letter(s[0]) {
		return invalid(field, "%q does not start with a letter", clip(s))
	}
	for i := range len(s) {
		if c := s[i]; !letter(c) && !digit(c) && c != '_' && c != '-' {
			return invalid(field, "%q: byte %q is not a letter, a digit, '_' or '-'", clip(s), c)
		}
	}
	return nil
}

// validData returns nil when data is JSON of at most max bytes (0: no
// cap), as a record's data must be.
func validData(data []byte, max int) error {
	switch {
	case max > 0 && len(data) > max:
		return invalid("data", "%d bytes, over the cap of %d (WithMaxDataBytes)", len(data), max)
	case !utf8.Valid(data):
		return invalid("data", "not valid UTF-8")
	case !json.Valid(data):
		return invalid("data", "not a JSON text")
	}
	return nil
}

// validRef returns nil when each of ref's names follows its grammar.
func validRef(ref Ref) error {
	if err := ValidScope(ref.Scope); err != nil {
		return err
	}
	if err := ValidMachine(ref.Machine); err != nil {
		return err
	}
	return ValidID(ref.ID)
}

// validChange returns nil when c is a change a transition can make.
func validChange(c Change, maxData int) error {
	if err := validState("from", c.From); err != nil {
		return err
	}
	if err := validState("to", c.To); err != nil {
		return err
	}
	if c.ExpectedVersion < 1 || c.ExpectedVersion >= MaxVersion {
		return invalid("expected_version", "%d is not from 1 to %d", c.ExpectedVersion, MaxVersion-1)
	}
	if c.Data != nil {
		return validData(c.Data, maxData)
	}
	return nil
}

// text returns nil when s is 1 to max bytes of UTF-8 without control
// characters or any byte of banned.
func text(field, s string, max int, banned string) error {
	switch {
	case s == "" || len(s) > max:
		return invalid(field, "%q is not 1 to %d bytes", clip(s), max)
	case !utf8.ValidString(s):
		return invalid(field, "%q is not valid UTF-8", clip(s))
	case banned != "" && strings.ContainsAny(s, banned):
		return invalid(field, "%q holds %q", clip(s), banned)
	case strings.ContainsFunc(s, unicode.IsControl):
		return invalid(field, "%q holds a control character", clip(s))
	}
	return nil
}

func lower(c byte) bool  { return 'a' <= c && c <= 'z' }
func letter(c byte) bool { return lower(c) || 'A' <= c && c <= 'Z' }
func digit(c byte) bool  { return '0' <= c && c <= '9' }

// clip shortens s for an error message: its first 64 bytes, and "..."
// when there were more.
func clip(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// invalid returns an *InvalidArgumentError for field.
func invalid(field, format string, args ...any) error {
	return &InvalidArgumentError{Field: field, Reason: fmt.Sprintf(format, args...)}
}
