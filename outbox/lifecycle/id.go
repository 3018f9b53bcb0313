package lifecycle

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MessageID returns the ID of the message at seq (from 1) among the
// messages of the record with storage key storageKey: "<storage
// key>/<seq>" (outbox.ID).
func MessageID(storageKey string, seq int) string { return storageKey + "/" + strconv.Itoa(seq) }

// ErrInvalidID is wrapped by the errors of ParseMessageID.
var ErrInvalidID = errors.New("outbox: invalid message ID")

// ParseMessageID splits a message ID made by MessageID into its storage
// key and sequence. It returns an error wrapping ErrInvalidID for anything
// else.
func ParseMessageID(id string) (storageKey string, seq int, err error) {
	i := strings.LastIndexByte(id, '/')
	if i <= 0 {
		return "", 0, fmt.Errorf("%w: %q is not <storage key>/<sequence>", ErrInvalidID, id)
	}
	seq, err = strconv.Atoi(id[i+1:])
	if err != nil || seq < 1 || seq > 1<<31-1 || strconv.Itoa(seq) != id[i+1:] {
		return "", 0, fmt.Errorf("%w: %q does not end in a sequence from 1", ErrInvalidID, id)
	}
	return id[:i], seq, nil
}
