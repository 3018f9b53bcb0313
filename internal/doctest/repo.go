package doctest

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// A Repo is the repository's modules.
type Repo struct {
	Root    string // the root module's directory
	Modules []GoMod
	Work    *GoWork // the root's go.work; nil without one
}

// GoMod is what a module's go.mod says, as go mod edit -json reads it.
type GoMod struct {
	Dir       string // the module's directory
	Rel       string // its directory relative to the root's, with slashes: "." for the root
	Module    struct{ Path string }
	Go        string
	Toolchain string
	Require   []struct {
		Path     string
		Version  string
		Indirect bool
	}
	Replace []struct {
		Old struct{ Path, Version string }
		New struct{ Path, Version string }
	}
}

// GoWork is what go.work says, as go work edit -json reads it.
type GoWork struct {
	Go  string
	Use []struct{ DiskPath string }
}

// Repository returns the modules of the repository around the current
// directory: the root module is the first go.mod above it that declares
// the repository's root path, and the others are found below it (except
// in testdata and directories that start with "." or "_"), sorted by
// directory, the root first; and the root's go.work.
func Repository(t testing.TB) *Repo {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not found: go.mod files are read with it")
	}
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	rootModule := regexp.MustCompile(`(?m)^module ` + regexp.QuoteMeta(rootPath) + `\s*$`)
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && rootModule.Match(data) {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no module %s above the current directory", rootPath)
		}
		dir = parent
	}
	repo := &Repo{Root: dir}
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != dir && ignored(d.Name()) {
			return filepath.SkipDir
		}
		if d.Name() != "go.mod" || d.IsDir() {
			return nil
		}
		out, err := exec.Command(goBin, "mod", "edit", "-json", path).Output()
		if err != nil {
			return fmt.Errorf("go mod edit -json %s: %w", path, err)
		}
		m := GoMod{Dir: filepath.Dir(path)}
		if err := json.Unmarshal(out, &m); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		rel, err := filepath.Rel(dir, m.Dir)
		if err != nil {
			return err
		}
		m.Rel = filepath.ToSlash(rel)
		repo.Modules = append(repo.Modules, m)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The root's directory is a prefix of the others': it comes first.
	slices.SortFunc(repo.Modules, func(a, b GoMod) int { return strings.Compare(a.Dir, b.Dir) })

	if work := filepath.Join(dir, "go.work"); exists(work) {
		out, err := exec.Command(goBin, "work", "edit", "-json", work).Output()
		if err != nil {
			t.Fatalf("go work edit -json %s: %v", work, err)
		}
		repo.Work = new(GoWork)
		if err := json.Unmarshal(out, repo.Work); err != nil {
			t.Fatalf("%s: %v", work, err)
		}
	}
	return repo
}

// owner returns the module of the repository that holds the package at
// import path p, or nil.
func (r *Repo) owner(p string) *GoMod {
	var best *GoMod
	for i, m := range r.Modules {
		if (p == m.Module.Path || strings.HasPrefix(p, m.Module.Path+"/")) && (best == nil || len(m.Module.Path) > len(best.Module.Path)) {
			best = &r.Modules[i]
		}
	}
	return best
}

// requirer returns the first module of the repository whose go.mod
// requires the module that provides import path p, or nil.
func (r *Repo) requirer(p string) *GoMod {
	for i, m := range r.Modules {
		for _, req := range m.Require {
			if p == req.Path || strings.HasPrefix(p, req.Path+"/") {
				return &r.Modules[i]
			}
		}
	}
	return nil
}
