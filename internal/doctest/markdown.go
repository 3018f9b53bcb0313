package doctest

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A snippet is a ```go block of a Markdown file, with the declarations it
// assumes when it is not a whole program.
type snippet struct {
	file string // the Markdown file's path
	line int    // the line of the block's first line of Go
	src  string

	// assumes holds the Go of the block that follows the snippet inside
	// <details><summary>Assumes ...</summary>: imports and declarations
	// of the names that the summary lists in <code> elements (names).
	assumes     string
	assumesLine int
	names       []string
}

var (
	// fence opens or closes a code block, possibly indented or quoted
	// (> ```go): group 1 is what precedes it, group 2 its language.
	fence = regexp.MustCompile("^([ \t>]*)```(\\S*)\\s*$")
	// summary introduces the declarations that the snippet above assumes.
	summary = regexp.MustCompile(`^<details><summary>Assumes (.+)</summary>$`)
	// codeName is a name the summary lists.
	codeName = regexp.MustCompile(`<code>([\pL_][\pL\pN_]*)</code>`)
)

// snippets returns the ```go blocks of the Markdown file at path, each
// followed by the block of declarations it assumes, if any.
func snippets(path string) ([]snippet, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(data), "\n")
	var (
		found    []snippet
		lastText string // the last line of text outside a code block
	)
	for i := 0; i < len(lines); i++ {
		m := fence.FindStringSubmatch(lines[i])
		if m == nil {
			if text := strings.TrimSpace(strings.TrimLeft(lines[i], " \t>")); text != "" {
				lastText = text
			}
			continue
		}
		prefix, lang, start := m[1], m[2], i+1
		var body []string
		closed := false
		for i++; i < len(lines); i++ {
			line := lines[i]
			if strings.TrimSpace(line) == strings.TrimSpace(prefix) {
				line = "" // a blank line of a quoted block: ">"
			} else {
				line = strings.TrimPrefix(line, prefix)
			}
			if strings.TrimSpace(line) == "```" {
				closed = true
				break
			}
			body = append(body, line)
		}
		if !closed {
			return nil, fmt.Errorf("%s:%d: the code block is not closed", path, start)
		}
		if lang != "go" {
			lastText = ""
			continue
		}
		src := strings.Join(body, "\n") + "\n"
		if sm := summary.FindStringSubmatch(lastText); sm != nil {
			if len(found) == 0 || found[len(found)-1].assumes != "" {
				return nil, fmt.Errorf("%s:%d: declarations assumed by no snippet: they follow the snippet that assumes them", path, start)
			}
			s := &found[len(found)-1]
			s.assumes, s.assumesLine = src, start+1
			for _, n := range codeName.FindAllStringSubmatch(sm[1], -1) {
				s.names = append(s.names, n[1])
			}
		} else {
			found = append(found, snippet{file: path, line: start + 1, src: src})
		}
		lastText = ""
	}
	return found, nil
}

// hasGo reports whether the Markdown file at path holds a ```go block.
func hasGo(path string) (bool, error) {
	found, err := snippets(path)
	return len(found) > 0, err
}

// MarkdownFiles returns the Markdown files of the module whose root is
// dir: those below it, except in directories that hold another module,
// are named testdata, or start with "." or "_".
func MarkdownFiles(t testing.TB, dir string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != dir && (ignored(d.Name()) || exists(filepath.Join(path, "go.mod"))) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// HasGo reports whether the Markdown file at path holds a ```go block.
func HasGo(t testing.TB, path string) bool {
	t.Helper()
	ok, err := hasGo(path)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// ignored reports whether the go command ignores a directory of this name
// (and the repository holds no module there).
func ignored(name string) bool {
	return name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
