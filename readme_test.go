package idempotency_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// TestReadmeSnippetsCompile builds every complete program (a ```go block that
// starts with "package main") in the README files, so the documentation
// cannot drift from the API.
func TestReadmeSnippetsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds programs with the go command")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not found")
	}
	block := regexp.MustCompile("(?s)```go\n(package main\n.*?)```")
	files, _ := filepath.Glob("*/README.md")
	files = append([]string{"README.md"}, files...)
	n := 0
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range block.FindAllSubmatch(text, -1) {
			// A directory inside the module (so its imports resolve) that
			// ./... patterns ignore.
			dir, err := os.MkdirTemp(".", "_readme")
			if err != nil {
				t.Fatal(err)
			}
			defer os.RemoveAll(dir)
			if err := os.WriteFile(filepath.Join(dir, "main.go"), m[1], 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(goBin, "vet", "./"+dir).CombinedOutput()
			if err != nil {
				t.Errorf("%s snippet %d does not compile:\n%s\n%s", f, i+1, out, m[1])
			}
			n++
		}
	}
	if n < 2 {
		t.Fatalf("found %d snippets, want at least the two quick starts", n)
	}
}
