package doctest

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestProblems checks testdata/snippets.md, whose headings say which
// snippets are wrong, and expects a problem at the line of each of those
// and of no other.
func TestProblems(t *testing.T) {
	goBin := goCommand(t)
	md, err := filepath.Abs(filepath.Join("testdata", "snippets.md"))
	if err != nil {
		t.Fatal(err)
	}
	want := wrongSnippets(t, md)
	if len(want) < 5 {
		t.Fatalf("%s marks %d snippets wrong, want at least 5", md, len(want))
	}

	var got []int
	at := regexp.MustCompile(`^` + regexp.QuoteMeta(md) + `:(\d+): `)
	for _, p := range problems(t, goBin, []string{md}) {
		m := at.FindStringSubmatch(p)
		if m == nil {
			t.Errorf("a problem without its place: %s", p)
			continue
		}
		line, _ := strconv.Atoi(m[1])
		if !slices.Contains(want, line) {
			t.Errorf("a problem with a right snippet: %s", p)
		}
		got = append(got, line)
	}
	for _, line := range want {
		if !slices.Contains(got, line) {
			t.Errorf("%s:%d: no problem found with a wrong snippet", md, line)
		}
	}
}

// wrongSnippets returns the first line of Go of each snippet under a
// heading that starts with "## wrong".
func wrongSnippets(t *testing.T, md string) []int {
	f, err := os.Open(md)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []int
	wrong := false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		switch line := sc.Text(); {
		case strings.HasPrefix(line, "## "):
			wrong = strings.HasPrefix(line, "## wrong")
		case wrong && line == "```go":
			lines = append(lines, n+1)
			wrong = false // its assumed declarations follow
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}

// TestSource checks how a fragment is wrapped: statements in main, with
// their variables used; the imports its packages need, and those it
// declares; a blank import for a block of imports alone.
func TestSource(t *testing.T) {
	for _, tc := range []struct {
		name      string
		s         snippet
		want, not []string
	}{{
		name: "statements",
		s:    snippet{file: "README.md", line: 10, src: "client := redis.NewClient(nil)\nstore := redisstore.New(client)\n"},
		want: []string{"\tredis \"github.com/redis/go-redis/v9\"\n", `"github.com/go-idempotency/idempotency/redisstore"`,
			"func main() {\n//line README.md:10:1\nclient :=", "\t_ = client\n\t_ = store\n}"},
		not: []string{`"github.com/go-idempotency/idempotency/client"`}, // client is a variable here
	}, {
		name: "assumed",
		s: snippet{file: "README.md", line: 10, src: "pb.RegisterPaymentsServer(srv, payments{})\n",
			assumes:     "import pb \"example.com/payments/gen/paymentspb\"\n\nvar srv *grpc.Server\n\ntype payments struct{ pb.UnimplementedPaymentsServer }\n",
			assumesLine: 14, names: []string{"pb", "srv", "payments"}},
		want: []string{"\tpb \"example.com/payments/gen/paymentspb\"\n", `"google.golang.org/grpc"`,
			"//line README.md:14:1\n\n\nvar srv *grpc.Server"},
	}, {
		name: "imports alone",
		s:    snippet{file: "README.md", line: 3, src: "import (\n\t\"github.com/go-idempotency/idempotency\"\n)\n"},
		want: []string{"\t_ \"github.com/go-idempotency/idempotency\"\n", "func main() {}"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			src, err := tc.s.source()
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(src), w) {
					t.Errorf("no %q in\n%s", w, src)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(string(src), n) {
					t.Errorf("%q in\n%s", n, src)
				}
			}
		})
	}
}
