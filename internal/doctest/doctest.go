// Package doctest checks the repository's documentation against its code.
//
// CheckGo, which the tests of each module call, compiles the Go of the
// module's Markdown files, so that the documentation cannot drift from the
// API: it vets every ```go block in a module of its own. A block that
// starts with "package main" is a program, compiled as it is. Any other
// block is a fragment: it is compiled inside a file that declares what it
// assumes, which the Markdown file shows right after it, folded:
//
//	```go
//	srv := grpc.NewServer(grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(runner)))
//	```
//
//	<details><summary>Assumes <code>runner</code></summary>
//
//	```go
//	var runner *idempotency.Runner
//	```
//
//	</details>
//
// The summary names every declaration of the folded block, and nothing
// else. Statements go in main, declarations at the top level; the packages
// a fragment uses by their usual names (idempotency, grpc, redis, ...) are
// imported for it, and the folded block imports any other. A fragment may
// import the stand-ins of generated code in testdata/gen (as
// example.com/payments/gen/...), which are copied beside it. Every block
// must also be as gofmt formats it.
//
// Repository reads the repository's modules (every go.mod, and go.work),
// which the root module's tests compare with RELEASING.md.
package doctest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/format"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const (
	// rootPath is the path of the repository's root module.
	rootPath = "github.com/go-idempotency/idempotency"
	// appPath is the path of the module that CheckGo compiles snippets in;
	// the stand-ins of testdata/gen are its gen/ packages.
	appPath = "example.com/payments"
)

// CheckGo vets every ```go block of the Markdown files of the module in the
// current directory (the directory of the calling test's package, which
// must be the module's root), in its directories that are not modules of
// their own, testdata or ignored by the go command. It fails t for each
// block that does not compile, that go vet finds fault with, that is not
// as gofmt formats it, or whose assumed declarations disagree with their
// summary. It skips t under -short and without the go command.
func CheckGo(t *testing.T) {
	goBin := goCommand(t)
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if !exists(filepath.Join(here, "go.mod")) {
		t.Fatalf("CheckGo runs in a module's root directory, and %s holds no go.mod", here)
	}
	for _, p := range problems(t, goBin, MarkdownFiles(t, here)) {
		t.Error(p)
	}
}

// problems returns what is wrong with the ```go blocks of the Markdown
// files mds, one problem per block, in their order.
func problems(t *testing.T, goBin string, mds []string) []string {
	t.Helper()
	var found []snippet
	for _, md := range mds {
		s, err := snippets(md)
		if err != nil {
			t.Fatal(err)
		}
		found = append(found, s...)
	}
	if len(found) == 0 {
		t.Fatalf("no ```go block in %v", mds)
	}

	var list []string
	files := map[string][]byte{}
	var pkgs []string // the snippets' package directories, in their order
	for i, s := range found {
		where := fmt.Sprintf("%s:%d", s.file, s.line)
		for _, block := range []struct{ src, what string }{{s.src, "the snippet"}, {s.assumes, "its assumed declarations"}} {
			if formatted, err := format.Source([]byte(block.src)); err == nil && !bytes.Equal(formatted, []byte(block.src)) {
				list = append(list, fmt.Sprintf("%s: gofmt would change %s to:\n%s", where, block.what, formatted))
			}
		}
		src, err := s.source()
		if err != nil {
			list = append(list, fmt.Sprintf("%s: %v\n%s", where, err, s.src))
			continue
		}
		pkg := fmt.Sprintf("snippet%d", i+1)
		files[pkg+"/main.go"] = src
		pkgs = append(pkgs, pkg)
	}
	failed := compile(t, goBin, Module(t, files), pkgs)
	for i, s := range found {
		pkg := fmt.Sprintf("snippet%d", i+1)
		if msgs, ok := failed[pkg]; ok {
			list = append(list, fmt.Sprintf("%s:%d: the snippet does not compile, or go vet finds fault with it:\n%s\nas compiled, in %s:\n%s",
				s.file, s.line, msgs, pkg, numbered(files[pkg+"/main.go"])))
		}
	}
	return list
}

// compile builds and then vets the packages pkgs (directories) of the
// module in dir, and returns what the compiler or go vet says of each
// package that fails.
func compile(t *testing.T, goBin, dir string, pkgs []string) map[string]string {
	t.Helper()
	run := func(args ...string) (string, error) {
		cmd := exec.Command(goBin, args...)
		cmd.Dir = dir
		cmd.Env = goEnv()
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	failed := map[string]string{}

	// go build names every error, under a "# path" line for each package;
	// go vet would stop at a package's first.
	out, err := run(append([]string{"build", "-o", os.DevNull}, dirs(pkgs)...)...)
	if err != nil {
		for _, part := range strings.Split("\n"+out, "\n# ")[1:] {
			path, msgs, _ := strings.Cut(part, "\n")
			if pkg, ok := strings.CutPrefix(path, appPath+"/"); ok && slices.Contains(pkgs, pkg) {
				failed[pkg] += msgs
			}
		}
		if len(failed) == 0 {
			t.Fatalf("go build: %v\n%s", err, out)
		}
	}

	var built []string
	for _, pkg := range pkgs {
		if _, ok := failed[pkg]; !ok {
			built = append(built, pkg)
		}
	}
	if len(built) == 0 {
		return failed
	}
	out, err = run(append([]string{"vet", "-json"}, dirs(built)...)...)
	if err != nil {
		t.Fatalf("go vet: %v\n%s", err, out)
	}
	// A stream of JSON objects: {"path": {"analyzer": [findings]}}.
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var found map[string]map[string][]struct{ Posn, Message string }
		if err := dec.Decode(&found); err != nil {
			t.Fatalf("go vet -json: %v\n%s", err, out)
		}
		for path, analyzers := range found {
			pkg := strings.TrimPrefix(path, appPath+"/")
			for analyzer, findings := range analyzers {
				for _, f := range findings {
					failed[pkg] += fmt.Sprintf("%s: %s (vet: %s)\n", f.Posn, f.Message, analyzer)
				}
			}
		}
	}
	return failed
}

// dirs returns the patterns of the packages in directories pkgs.
func dirs(pkgs []string) []string {
	patterns := make([]string, len(pkgs))
	for i, pkg := range pkgs {
		patterns[i] = "./" + pkg
	}
	return patterns
}

// numbered returns src with its lines numbered.
func numbered(src []byte) string {
	var b strings.Builder
	for i, line := range strings.Split(strings.TrimSuffix(string(src), "\n"), "\n") {
		fmt.Fprintf(&b, "%4d  %s\n", i+1, line)
	}
	return b.String()
}

// goCommand returns the path of the go command, skipping t under -short
// or without it.
func goCommand(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the Markdown files' Go with the go command")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not found: the Markdown files' Go is built with it")
	}
	return goBin
}

// goEnv is the environment of the go commands run in a Module: the
// module's own go.mod, completed as its imports need.
func goEnv() []string {
	return append(os.Environ(), "GOWORK=off", "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -mod=mod"))
}
