package idemprom_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// TestReadmeSnippetsCompile vets every complete program (a ```go block
// that starts with "package main") in README.md, within this module, so
// that the documentation cannot drift from the API.
func TestReadmeSnippetsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds programs with the go command")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not found")
	}
	text, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```go\n(package main\n.*?)```").FindAllSubmatch(text, -1)
	if len(blocks) == 0 {
		t.Fatal("README.md has no complete program")
	}
	for i, m := range blocks {
		// A directory inside the module (so that its imports resolve)
		// that ./... patterns ignore.
		dir, err := os.MkdirTemp(".", "_readme")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if err := os.WriteFile(filepath.Join(dir, "main.go"), m[1], 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(goBin, "vet", "./"+dir).CombinedOutput(); err != nil {
			t.Errorf("README.md program %d does not compile:\n%s\n%s", i+1, out, m[1])
		}
		if out, err := exec.Command(filepath.Join(filepath.Dir(goBin), "gofmt"), "-l", dir).CombinedOutput(); err != nil || len(out) != 0 {
			t.Errorf("README.md program %d is not gofmt'd (%v): %s", i+1, err, out)
		}
	}
}
