package doctest

import (
	"fmt"
	"go/parser"
	"go/token"
	"go/version"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Module writes files (by path, "dir/main.go") in a new module in a
// temporary directory, and returns the directory. The module requires
// the modules of the repository whose packages the files import, each
// replaced by its directory, and for an import of a module outside the
// repository, the first of the repository's modules that requires it; it
// starts from their go.sum files and takes the highest of their go lines,
// so that nothing is downloaded when the module cache holds what they
// need. Files that import the stand-ins of generated code
// (example.com/payments/gen/...) get them.
func Module(t testing.TB, files map[string][]byte) string {
	t.Helper()
	repo := Repository(t)
	dir := t.TempDir()
	all := maps.Clone(files)
	for name, src := range files {
		for _, p := range imports(t, name, src) {
			gen, ok := strings.CutPrefix(p, appPath+"/gen/")
			if !ok {
				continue
			}
			standIns := filepath.Join(repo.Root, "internal", "doctest", "testdata", "gen", filepath.FromSlash(gen))
			entries, err := os.ReadDir(standIns)
			if err != nil {
				t.Fatalf("%s imports %s, which has no stand-in: %v", name, p, err)
			}
			for _, e := range entries {
				src, err := os.ReadFile(filepath.Join(standIns, e.Name()))
				if err != nil {
					t.Fatal(err)
				}
				all["gen/"+gen+"/"+e.Name()] = src
			}
		}
	}

	var required []*GoMod
	need := func(m *GoMod) {
		if m != nil && !slices.Contains(required, m) {
			required = append(required, m)
		}
	}
	need(repo.owner(rootPath))
	for name, src := range all {
		for _, p := range imports(t, name, src) {
			switch first, _, _ := strings.Cut(p, "/"); {
			case !strings.Contains(first, "."), strings.HasPrefix(p, appPath+"/"):
				// The standard library, or the module itself.
			case repo.owner(p) != nil:
				need(repo.owner(p))
			default:
				need(repo.requirer(p))
			}
		}
	}

	var goVersion string
	var requires, replaces strings.Builder
	var sums []byte
	for _, m := range required {
		if version.Compare("go"+m.Go, "go"+goVersion) > 0 {
			goVersion = m.Go
		}
		fmt.Fprintf(&requires, "require %s v0.0.0\n", m.Module.Path)
		fmt.Fprintf(&replaces, "replace %s => %s\n", m.Module.Path, strconv.Quote(m.Dir))
		sum, err := os.ReadFile(filepath.Join(m.Dir, "go.sum"))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		sums = append(sums, sum...)
	}
	all["go.mod"] = fmt.Appendf(nil, "module %s\n\ngo %s\n\n%s\n%s", appPath, goVersion, requires.String(), replaces.String())
	all["go.sum"] = sums
	for name, src := range all {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, src, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// imports returns the import paths of the Go file src, or none for
// another file.
func imports(t testing.TB, name string, src []byte) []string {
	t.Helper()
	if !strings.HasSuffix(name, ".go") {
		return nil
	}
	f, err := parser.ParseFile(token.NewFileSet(), name, src, parser.ImportsOnly)
	if err != nil {
		return nil // the compiler will say what is wrong
	}
	var paths []string
	for _, spec := range f.Imports {
		p, _ := strconv.Unquote(spec.Path.Value)
		paths = append(paths, p)
	}
	return paths
}
