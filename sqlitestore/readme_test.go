package sqlitestore_test

import (
	"testing"

	"github.com/go-idempotency/idempotency/internal/doctest"
)

// TestReadmeSnippetsCompile compiles the Go of this module's Markdown
// files: every program, and every fragment with the declarations it
// assumes (see package doctest), so that the documentation cannot drift
// from the API.
func TestReadmeSnippetsCompile(t *testing.T) {
	doctest.CheckGo(t)
}
