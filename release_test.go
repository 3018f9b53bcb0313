package idempotency_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/go-idempotency/idempotency/internal/doctest"
)

// TestReleaseModules compares RELEASING.md's table of modules with go.work
// and every go.mod of the repository (see releaseProblems), so that the
// release notes say how each module resolves the others when it is tagged.
func TestReleaseModules(t *testing.T) {
	repo := doctest.Repository(t)
	notes, err := os.ReadFile(filepath.Join(repo.Root, "RELEASING.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range releaseProblems(repo, string(notes)) {
		t.Error(p)
	}
}

// TestReleaseModulesDisagree breaks the repository's modules or
// RELEASING.md in one way at a time, in memory, and expects a problem
// naming what was broken.
func TestReleaseModulesDisagree(t *testing.T) {
	repo := doctest.Repository(t)
	data, err := os.ReadFile(filepath.Join(repo.Root, "RELEASING.md"))
	if err != nil {
		t.Fatal(err)
	}
	notes := string(data)
	if p := releaseProblems(repo, notes); len(p) > 0 {
		t.Fatalf("the repository and RELEASING.md disagree already (TestReleaseModules says how): %v", p)
	}
	module := func(r *doctest.Repo, rel string) *doctest.GoMod {
		for i := range r.Modules {
			if r.Modules[i].Rel == rel {
				return &r.Modules[i]
			}
		}
		t.Fatalf("no module %s", rel)
		return nil
	}
	for _, tc := range []struct {
		name    string
		breakIt func(r *doctest.Repo) string // returns the notes to check
		want    string                       // in one of the problems
	}{{
		name: "a requirement of the root at another version",
		breakIt: func(r *doctest.Repo) string {
			m := module(r, "grpc")
			for i := range m.Require {
				if m.Require[i].Path == rootModulePath {
					m.Require[i].Version = "v0.3.0"
				}
			}
			return notes
		},
		want: "grpc requires . v0.3.0",
	}, {
		name: "a requirement the table does not name",
		breakIt: func(r *doctest.Repo) string {
			return strings.Replace(notes, "| `.` v0.0.0, `brokers/nats` v0.0.0 |", "| `.` v0.0.0 |", 1)
		},
		want: "examples/payments-consumer requires brokers/nats v0.0.0",
	}, {
		name: "a module the table does not list",
		breakIt: func(r *doctest.Repo) string {
			return regexp.MustCompile("(?m)^\\| `adapters/otel` .*\n").ReplaceAllString(notes, "")
		},
		want: "adapters/otel",
	}, {
		name: "a module go.work does not use",
		breakIt: func(r *doctest.Repo) string {
			r.Work.Use = slices.DeleteFunc(r.Work.Use, func(u struct{ DiskPath string }) bool { return u.DiskPath == "./brokers/nats" })
			return notes
		},
		want: "go.work",
	}, {
		name: "another go line",
		breakIt: func(r *doctest.Repo) string {
			module(r, "adapters/prometheus").Go = "1.25.0"
			return notes
		},
		want: "adapters/prometheus says go 1.25.0",
	}, {
		name: "a requirement without its replace",
		breakIt: func(r *doctest.Repo) string {
			module(r, "brokers/rabbitmq").Replace = nil
			return notes
		},
		want: "brokers/rabbitmq requires . and has no replace",
	}, {
		name: "a released module that requires an unreleased one",
		breakIt: func(r *doctest.Repo) string {
			m := module(r, "grpc")
			m.Require = append(m.Require, m.Require[0])
			m.Require[len(m.Require)-1].Path = rootModulePath + "/benchmarks"
			m.Replace = append(m.Replace, m.Replace[0])
			m.Replace[len(m.Replace)-1].Old.Path = rootModulePath + "/benchmarks"
			m.Replace[len(m.Replace)-1].New.Path = "../benchmarks"
			return strings.Replace(notes, "| `grpc` | yes | `grpc/v0.X.Y` | 2 | `.` v0.0.0 |", "| `grpc` | yes | `grpc/v0.X.Y` | 2 | `.` v0.0.0, `benchmarks` v0.0.0 |", 1)
		},
		want: "grpc is released before benchmarks",
	}, {
		name: "a step out of order",
		breakIt: func(r *doctest.Repo) string {
			return strings.Replace(notes, "| `grpc` | yes | `grpc/v0.X.Y` | 2 |", "| `grpc` | yes | `grpc/v0.X.Y` | 1 |", 1)
		},
		want: "grpc is released at step 1, want 2",
	}, {
		name: "a step that is not one after a released module it requires besides the root",
		breakIt: func(r *doctest.Repo) string {
			return strings.Replace(notes, "| `cmd/idemctl` | yes | `cmd/idemctl/v0.X.Y` | 3 |", "| `cmd/idemctl` | yes | `cmd/idemctl/v0.X.Y` | 2 |", 1)
		},
		want: "cmd/idemctl is released at step 2, want 3",
	}, {
		name: "a tag without the module's directory",
		breakIt: func(r *doctest.Repo) string {
			return strings.Replace(notes, "`brokers/nats/v0.X.Y`", "`nats/v0.X.Y`", 1)
		},
		want: "tag `nats/v0.X.Y`",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			broken := cloneRepo(t, repo)
			problems := releaseProblems(broken, tc.breakIt(broken))
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }) {
				t.Errorf("no problem says %q: %q", tc.want, problems)
			}
		})
	}
}

func cloneRepo(t *testing.T, r *doctest.Repo) *doctest.Repo {
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var c doctest.Repo
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	return &c
}

const rootModulePath = "github.com/go-idempotency/idempotency"

// releaseRow is a row of RELEASING.md's table of modules.
type releaseRow struct {
	released bool
	tag      string            // without the backquotes; "" when not released
	step     int               // 0 when not released
	requires map[string]string // version by module directory
}

var (
	// tableRow is a row of the table: | `dir` | released | tag | step | requires |.
	tableRow = regexp.MustCompile("(?m)^\\| `([^`]+)` \\|([^|]*)\\|([^|]*)\\|([^|]*)\\|([^|]*)\\|\\s*$")
	// required is one entry of the last column: `dir` version.
	required = regexp.MustCompile("^`([^`]+)` (v\\d+\\.\\d+\\.\\d+)$")
	// goLine is the go line that RELEASING.md says every module has.
	goLine = regexp.MustCompile("says `go (1\\.\\d+(?:\\.\\d+)?)`")
	// released tags are the directory (none for the root), then v0.X.Y
	// or a version.
	version = regexp.MustCompile(`^v(\d+\.\d+\.\d+|0\.X\.Y)$`)
)

// releaseProblems returns where RELEASING.md (notes) and the repository's
// modules disagree: its table must list exactly the modules that have a
// go.mod, which go.work must use; each module's path must be the root's
// path and its directory; its requirements on the repository's modules
// (the version included) must be those the table names, each with a
// replace to the required module's directory; a released module must
// require only released ones, and its step be one more than the highest
// of theirs (1 for one that requires none); its tag must be its directory
// and a version; and every go.mod and go.work must say the go line that
// RELEASING.md names.
func releaseProblems(repo *doctest.Repo, notes string) []string {
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	rows := map[string]releaseRow{}
	for _, m := range tableRow.FindAllStringSubmatch(notes, -1) {
		dir := m[1]
		row := releaseRow{requires: map[string]string{}}
		switch strings.TrimSpace(m[2]) {
		case "yes":
			row.released = true
		case "no":
		default:
			fail("RELEASING.md: module %s: released is %q, want yes or no", dir, strings.TrimSpace(m[2]))
		}
		if row.released {
			row.tag = strings.Trim(strings.TrimSpace(m[3]), "`")
			n, err := strconv.Atoi(strings.TrimSpace(m[4]))
			if err != nil || n < 1 {
				fail("RELEASING.md: module %s: step %q, want a number from 1", dir, strings.TrimSpace(m[4]))
			}
			row.step = n
		} else if strings.TrimSpace(m[3]) != "–" || strings.TrimSpace(m[4]) != "–" {
			fail("RELEASING.md: module %s is not released: its tag and step are –", dir)
		}
		if list := strings.TrimSpace(m[5]); list != "" {
			for _, entry := range strings.Split(list, ", ") {
				r := required.FindStringSubmatch(entry)
				if r == nil {
					fail("RELEASING.md: module %s requires %q, want `directory` vX.Y.Z", dir, entry)
					continue
				}
				row.requires[r[1]] = r[2]
			}
		}
		if _, dup := rows[dir]; dup {
			fail("RELEASING.md: module %s is listed twice", dir)
		}
		rows[dir] = row
	}
	if len(rows) == 0 {
		fail("RELEASING.md has no table of modules")
		return problems
	}

	// The same modules everywhere: go.mod files, go.work, the table.
	byDir := map[string]*doctest.GoMod{}
	for i := range repo.Modules {
		byDir[repo.Modules[i].Rel] = &repo.Modules[i]
	}
	var work []string
	if repo.Work == nil {
		fail("the repository has no go.work")
	} else {
		for _, u := range repo.Work.Use {
			work = append(work, path.Clean(u.DiskPath))
		}
	}
	for dir := range byDir {
		if _, ok := rows[dir]; !ok {
			fail("module %s has a go.mod, and RELEASING.md's table does not list it", dir)
		}
		if repo.Work != nil && !slices.Contains(work, dir) {
			fail("module %s has a go.mod, and go.work does not use it", dir)
		}
	}
	for dir := range rows {
		if byDir[dir] == nil {
			fail("RELEASING.md lists module %s, which has no go.mod", dir)
		}
	}
	for _, dir := range work {
		if byDir[dir] == nil {
			fail("go.work uses %s, which has no go.mod", dir)
		}
	}

	// One go line.
	var want string
	if m := goLine.FindStringSubmatch(notes); m == nil {
		fail("RELEASING.md does not say the go line of the modules (says `go 1.N.0`)")
	} else {
		want = m[1]
	}
	if repo.Work != nil && want != "" && repo.Work.Go != want {
		fail("go.work says go %s, and RELEASING.md go %s", repo.Work.Go, want)
	}

	dirOf := func(modulePath string) (string, bool) {
		if modulePath == rootModulePath {
			return ".", true
		}
		dir, ok := strings.CutPrefix(modulePath, rootModulePath+"/")
		return dir, ok
	}
	for _, m := range repo.Modules {
		dir := m.Rel
		row, listed := rows[dir]
		if want != "" && m.Go != want {
			fail("module %s says go %s, and RELEASING.md go %s", dir, m.Go, want)
		}
		if wantPath := path.Join(rootModulePath, dir); m.Module.Path != wantPath {
			fail("module %s is named %s, want %s (the repository's path and its directory)", dir, m.Module.Path, wantPath)
		}

		// Its requirements on the repository's modules, and their replaces.
		got := map[string]string{}
		for _, r := range m.Require {
			rdir, ok := dirOf(r.Path)
			if !ok {
				continue
			}
			got[rdir] = r.Version
			replaced := false
			for _, rep := range m.Replace {
				if rep.Old.Path == r.Path && rep.Old.Version == "" &&
					filepath.Clean(filepath.Join(m.Dir, rep.New.Path)) == filepath.Join(repo.Root, filepath.FromSlash(rdir)) {
					replaced = true
				}
			}
			if !replaced {
				fail("module %s requires %s and has no replace of it (every version) by its directory, %s", dir, rdir, relPath(dir, rdir))
			}
		}
		if !listed {
			continue
		}
		for rdir, v := range got {
			if row.requires[rdir] != v {
				fail("module %s requires %s %s, and RELEASING.md says %q", dir, rdir, v, row.requires[rdir])
			}
		}
		for rdir, v := range row.requires {
			if _, ok := got[rdir]; !ok {
				fail("RELEASING.md says module %s requires %s %s, and its go.mod does not", dir, rdir, v)
			}
		}

		// Its tag and its step.
		if !row.released {
			continue
		}
		wantTag := dir + "/"
		if dir == "." {
			wantTag = ""
		}
		if v, ok := strings.CutPrefix(row.tag, wantTag); !ok || !version.MatchString(v) {
			fail("RELEASING.md: module %s has tag `%s`, want `%sv0.X.Y` (its directory, then the version)", dir, row.tag, wantTag)
		}
		step := 1
		for rdir := range got {
			r, ok := rows[rdir]
			switch {
			case !ok:
			case !r.released:
				fail("RELEASING.md: module %s is released before %s, which it requires and which is not released", dir, rdir)
			default:
				step = max(step, r.step+1)
			}
		}
		if row.step != step {
			fail("RELEASING.md: module %s is released at step %d, want %d: one after the modules it requires", dir, row.step, step)
		}
	}
	slices.Sort(problems)
	return problems
}

// relPath is the path from directory from to directory to, both relative
// to the repository's root.
func relPath(from, to string) string {
	rel, err := filepath.Rel(filepath.FromSlash(from), filepath.FromSlash(to))
	if err != nil {
		return to
	}
	return filepath.ToSlash(rel)
}
