package idempotency_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestReadmeSnippetsCompile builds every complete program (a ```go block that
// starts with "package main") in the README files, so the documentation
// cannot drift from the API. The programs are vetted in a module of their
// own in a temporary directory, which requires this one, and the modules
// of this repository that the programs import (brokers, adapters), through
// replace directives and starts from their go.sum files, so nothing is
// downloaded when the module cache holds their dependencies.
func TestReadmeSnippetsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds programs with the go command")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not found: the README snippets are built with it")
	}
	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)```go\n(package main\n.*?)```")
	files, _ := filepath.Glob("*/README.md")
	files = append([]string{"README.md"}, files...)
	type snippet struct {
		file string
		n    int
		src  []byte
	}
	var snippets []snippet
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range block.FindAllSubmatch(text, -1) {
			snippets = append(snippets, snippet{f, i + 1, m[1]})
		}
	}
	if len(snippets) < 2 {
		t.Fatalf("found %d snippets, want at least the two quick starts", len(snippets))
	}
	var all []byte
	for _, s := range snippets {
		all = append(all, s.src...)
	}
	dir := snippetModule(t, root, all)
	for i, s := range snippets {
		pkg := fmt.Sprintf("snippet%d", i+1)
		if err := os.Mkdir(filepath.Join(dir, pkg), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, pkg, "main.go"), s.src, 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(goBin, "vet", "-mod=mod", "./"+pkg)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s snippet %d does not compile:\n%s\n%s", s.file, s.n, out, s.src)
		}
	}
}

// snippetModule makes a module in a temporary directory that requires this
// module and every module of the repository that src imports, each
// replaced by its directory, with the highest go version of theirs and
// their go.sum files, and returns the directory.
func snippetModule(t *testing.T, root string, src []byte) string {
	t.Helper()
	const library = "github.com/go-idempotency/idempotency"
	dirs := []string{root}
	mods, _ := filepath.Glob(filepath.Join(root, "*", "*", "go.mod"))
	more, _ := filepath.Glob(filepath.Join(root, "*", "go.mod"))
	for _, m := range append(more, mods...) {
		sub, _ := filepath.Rel(root, filepath.Dir(m))
		if bytes.Contains(src, []byte(`"`+library+"/"+filepath.ToSlash(sub)+`"`)) {
			dirs = append(dirs, filepath.Dir(m))
		}
	}
	goLine := regexp.MustCompile(`(?m)^go (\S+)`)
	var version string
	var requires, replaces, sums []byte
	for _, d := range dirs {
		gomod, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		v := goLine.FindSubmatch(gomod)
		if v == nil {
			t.Fatalf("no go line in %s", filepath.Join(d, "go.mod"))
		}
		if version == "" || newer(string(v[1]), version) {
			version = string(v[1])
		}
		path := library
		if sub, _ := filepath.Rel(root, d); sub != "." {
			path += "/" + filepath.ToSlash(sub)
		}
		requires = fmt.Appendf(requires, "require %s v0.0.0\n", path)
		replaces = fmt.Appendf(replaces, "replace %s => %q\n", path, d)
		sum, err := os.ReadFile(filepath.Join(d, "go.sum"))
		if err != nil {
			t.Fatal(err)
		}
		sums = append(sums, sum...)
	}
	dir := t.TempDir()
	mod := fmt.Sprintf("module readme\n\ngo %s\n\n%s\n%s", version, requires, replaces)
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(mod), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sums, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// newer reports whether go version a (a go line's "1.26.0") is later than b.
func newer(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(as), len(bs)) {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x > y
		}
	}
	return false
}
