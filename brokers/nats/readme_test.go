package idemnats_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// fragmentMain declares what the README's fragment for the library's
// README uses, around it.
const fragmentMain = `package main

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency"
	idemnats "github.com/go-idempotency/idempotency/brokers/nats"
)

type Receipt struct{ ID string }

func charge(ctx context.Context, order []byte) (Receipt, error) { return Receipt{}, nil }

func main() {
	var (
		store    idempotency.Store
		consumer jetstream.Consumer
		ctx      = context.Background()
	)
%s
	_ = err
}
`

// TestReadmeCompiles vets the README's programs (```go blocks that start
// with "package main"), and its quoted fragment inside fragmentMain, in a
// module of their own that requires this one through a replace directive
// and starts from its go.sum, so that nothing is downloaded.
func TestReadmeCompiles(t *testing.T) {
	if testing.Short() {
		t.Skip("builds programs with the go command")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not found")
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var sources []string
	for _, m := range regexp.MustCompile("(?s)\n```go\n(package main\n.*?)```").FindAllSubmatch(readme, -1) {
		sources = append(sources, string(m[1]))
	}
	quoted := regexp.MustCompile("(?s)\n> ```go\n(.*?)> ```").FindAllSubmatch(readme, -1)
	if len(sources) != 1 || len(quoted) != 1 {
		t.Fatalf("%d programs and %d quoted fragments, want 1 and 1", len(sources), len(quoted))
	}
	fragment := regexp.MustCompile("(?m)^> ?").ReplaceAllString(string(quoted[0][1]), "\t")
	sources = append(sources, fmt.Sprintf(fragmentMain, fragment))

	dir := t.TempDir()
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	gomod := fmt.Sprintf(`module readme

go 1.26.0

require (
	github.com/go-idempotency/idempotency v0.0.0
	github.com/go-idempotency/idempotency/brokers/nats v0.0.0
)

replace github.com/go-idempotency/idempotency => %s

replace github.com/go-idempotency/idempotency/brokers/nats => %s
`, filepath.Dir(filepath.Dir(here)), here)
	gosum, err := os.ReadFile("go.sum")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"go.mod": gomod, "go.sum": string(gosum)}
	for i, src := range sources {
		files[fmt.Sprintf("snippet%d/main.go", i+1)] = src
	}
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(goBin, "vet", "-mod=mod", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOPROXY=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the README's Go does not compile:\n%s\n%s", out, strings.Join(sources, "\n----\n"))
	}
}
