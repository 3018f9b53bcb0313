// Package sqltext checks the keys and lease tokens that the SQL stores
// (pgstore, sqlitestore) keep in text columns.
package sqltext

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxLen bounds a key or token, in bytes. The middleware's keys are 64
// bytes and its tokens 32.
const MaxLen = 1024

// Check refuses what a text column cannot hold or the stores do not take:
// empty, longer than MaxLen, not UTF-8, or holding a NUL byte. The error
// opens with pkg ("pgstore") and names the value as what ("key").
func Check(pkg, what, v string) error {
	switch {
	case v == "":
		return fmt.Errorf("%s: empty %s", pkg, what)
	case len(v) > MaxLen:
		return fmt.Errorf("%s: %s of %d bytes is longer than %d", pkg, what, len(v), MaxLen)
	case !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0:
		return fmt.Errorf("%s: %s is not UTF-8 text without NUL bytes", pkg, what)
	}
	return nil
}
