package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
)

// mainEnv makes the test binary run idemctl's main instead of the tests,
// so that a test can check the exit status of the real process.
const mainEnv = "IDEMCTL_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) == "1" {
		main()
	}
	redis.SetLogger(quietLogger{})
	os.Exit(m.Run())
}

// result is what one run of idemctl printed and returned.
type result struct {
	stdout, stderr string
	code           int
}

// idemctl runs idemctl in process with args and the environment env (and
// nothing of the test's own environment).
func idemctl(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code := run(ctx, args, &stdout, &stderr, func(k string) string { return env[k] })
	return result{stdout.String(), stderr.String(), code}
}

// want fails t unless r exited with code.
func (r result) want(t *testing.T, code int) result {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit status %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.stdout, r.stderr)
	}
	return r
}

// contains fails t unless the output holds every one of subs.
func (r result) contains(t *testing.T, subs ...string) result {
	t.Helper()
	for _, s := range subs {
		if !strings.Contains(r.stdout, s) && !strings.Contains(r.stderr, s) {
			t.Errorf("output lacks %q\nstdout:\n%s\nstderr:\n%s", s, r.stdout, r.stderr)
		}
	}
	return r
}

// decode decodes the JSON stdout into v.
func (r result) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, r.stdout)
	}
}

// jsonLines decodes stdout as one JSON object per line.
func (r result) jsonLines(t *testing.T) []recordJSON {
	t.Helper()
	var out []recordJSON
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		if line == "" {
			continue
		}
		var j recordJSON
		if err := json.Unmarshal([]byte(line), &j); err != nil {
			t.Fatalf("line %q is not JSON: %v", line, err)
		}
		out = append(out, j)
	}
	return out
}

// lines fails t unless stdout has, for each of want, a line whose first
// columns (two spaces or more apart) are want's, the last one as a prefix.
func (r result) lines(t *testing.T, want [][]string) result {
	t.Helper()
	for _, cells := range want {
		if !hasRow(r.stdout, cells) {
			t.Errorf("no line %q in\n%s", cells, r.stdout)
		}
	}
	return r
}

// columns splits a line of a table into its columns.
var columns = regexp.MustCompile(`\s{2,}`)

func hasRow(out string, want []string) bool {
	for line := range strings.Lines(out) {
		got := columns.Split(strings.TrimSpace(line), -1)
		if len(got) < len(want) {
			continue
		}
		n := len(want) - 1
		if slices.Equal(got[:n], want[:n]) && strings.HasPrefix(got[n], want[n]) {
			return true
		}
	}
	return false
}

// rows returns list's table rows (without the header line).
func (r result) rows() []string {
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) <= 1 {
		return nil
	}
	return lines[1:]
}

func TestHelp(t *testing.T) {
	idemctl(t, nil, "-h").want(t, exitOK).contains(t, "Usage:", "Exit status:", "RUNBOOK.md")
	idemctl(t, nil, "help").want(t, exitOK).contains(t, "Commands:")
	for _, c := range commands {
		r := idemctl(t, nil, c.name, "-h").want(t, exitOK)
		r.contains(t, "Usage: idemctl "+c.name, "Examples:\n  idemctl ", "idemctl "+c.name+" -", "Flags:")
		if r.stderr != "" {
			t.Errorf("%s -h wrote to stderr: %s", c.name, r.stderr)
		}
		top := idemctl(t, nil, "-h").stdout
		if !strings.Contains(top, "  "+c.name+" ") {
			t.Errorf("the top-level help does not list %s", c.name)
		}
		idemctl(t, nil, "help", c.name).want(t, exitOK).contains(t, "Usage: idemctl "+c.name, "Flags:\n  -")
	}
	idemctl(t, nil).want(t, exitUsage).contains(t, "Commands:")
	idemctl(t, nil, "frobnicate").want(t, exitUsage).contains(t, `unknown command "frobnicate"`)
	idemctl(t, nil, "list", "-nope").want(t, exitUsage).contains(t, "flag provided but not defined: -nope", "idemctl list -h")
}

func TestKey(t *testing.T) {
	sk := idempotency.StorageKey("user-42", "8e03978e")
	r := idemctl(t, nil, "key", "-scope", "user-42", "-key", "8e03978e").want(t, exitOK)
	r.contains(t, "storage key    "+sk, "redis key      idempotency:"+sk, `"idempotency_records" WHERE key = '`+sk+`'`)

	// A quoted key is parsed as the middleware parses it.
	r = idemctl(t, nil, "key", "-key", `"a\"b"`, "-prefix", "api:", "-table", "billing.idem", "-json").want(t, exitOK)
	var out map[string]string
	r.decode(t, &out)
	want := idempotency.StorageKey("", `a"b`)
	if out["storage_key"] != want || out["redis_key"] != "api:"+want || out["redis_channel"] != "api:"+want+":changed" {
		t.Errorf("key -json: %v, want storage key %s", out, want)
	}
	if !strings.Contains(out["postgres_query"], `"billing"."idem"`) {
		t.Errorf("postgres_query %q", out["postgres_query"])
	}

	idemctl(t, nil, "key", "-scope", "x").want(t, exitUsage).contains(t, "-key is required")
	idemctl(t, nil, "key", "-key", "a b").want(t, exitUsage).contains(t, "invalid key")
	idemctl(t, nil, "key", "-key", "ab", "-table", "a.b.c").want(t, exitUsage).contains(t, "more than two parts")
}

func TestStoreChoice(t *testing.T) {
	sk := idempotency.StorageKey("", "k")
	idemctl(t, nil, "inspect", sk).want(t, exitUsage).contains(t, "no store")
	idemctl(t, map[string]string{"REDIS_URL": "redis://127.0.0.1:1", "DATABASE_URL": "postgres://x@127.0.0.1:1/x"}, "inspect", sk).
		want(t, exitUsage).contains(t, "both REDIS_URL (or REDIS_ADDR) and DATABASE_URL are set")
	idemctl(t, nil, "inspect", "-redis", "127.0.0.1:1", "-postgres", "postgres://x@127.0.0.1:1/x", sk).
		want(t, exitUsage).contains(t, "both Redis and PostgreSQL")
	idemctl(t, nil, "inspect", "-sentinel", "127.0.0.1:1", sk).want(t, exitUsage).contains(t, "-sentinel needs -master")
	idemctl(t, nil, "inspect", "-redis", "127.0.0.1:1,127.0.0.1:2", sk).want(t, exitUsage).contains(t, "add -cluster")
	idemctl(t, nil, "inspect", "-postgres", "postgres://x@127.0.0.1:1/x", "-table", "1bad", sk).want(t, exitUsage).contains(t, "not an identifier")

	// Naming the record.
	idemctl(t, nil, "inspect", "-redis", "127.0.0.1:1").want(t, exitUsage).contains(t, "name a record")
	idemctl(t, nil, "inspect", "-redis", "127.0.0.1:1", "-key", "k", sk).want(t, exitUsage).contains(t, "not both")
	idemctl(t, nil, "inspect", "-redis", "127.0.0.1:1", "not-a-key").want(t, exitUsage).contains(t, "is not a storage key")
	idemctl(t, nil, "inspect", "-redis", "127.0.0.1:1", "-scope", "s", sk).want(t, exitUsage).contains(t, "-scope goes with -key")
	idemctl(t, nil, "list", "-redis", "127.0.0.1:1", "-state", "sleeping").want(t, exitUsage).contains(t, `-state "sleeping"`)

	// A server that is not there is an error, not a missing record.
	idemctl(t, nil, "inspect", "-redis", "127.0.0.1:1", "-timeout", "2s", sk).want(t, exitFailure)
}

func TestTargetForms(t *testing.T) {
	sk := idempotency.StorageKey("s", "k")
	tg := target{}
	for _, arg := range []string{sk, "idempotency:" + sk} {
		got, err := tg.storageKey([]string{arg}, "idempotency:")
		if err != nil || got != sk {
			t.Errorf("storageKey(%q) = %q, %v; want %s", arg, got, err, sk)
		}
	}
	if _, err := tg.storageKey([]string{strings.ToUpper(sk)}, "idempotency:"); err == nil {
		t.Error("an upper-case storage key was taken")
	}
}

func TestRemovalRules(t *testing.T) {
	live, out := 3*time.Second, -3*time.Second
	cases := []struct {
		rule removal
		rec  record
		ok   bool
	}{
		{removal{}, record{State: stateInProgress, LeaseLeft: &out, Epoch: 1}, true},
		{removal{}, record{State: stateInProgress, LeaseLeft: &live, Epoch: 1}, false},
		{removal{force: true}, record{State: stateInProgress, LeaseLeft: &live, Epoch: 1}, true},
		{removal{}, record{State: stateComplete, Epoch: 1}, false},
		{removal{force: true}, record{State: stateComplete, Epoch: 1}, true},
		{removal{}, record{State: stateCorrupt, Problem: "x"}, false},
		{removal{force: true}, record{State: stateCorrupt, Problem: "x"}, true},
		{removal{}, record{State: stateExpired, Epoch: 1}, true},
		{removal{release: true}, record{State: stateInProgress, LeaseLeft: &out, Epoch: 1}, true},
		{removal{release: true, force: true}, record{State: stateComplete, Epoch: 1}, false},
		{removal{release: true, force: true}, record{State: stateCorrupt}, false},
		{removal{release: true, force: true}, record{State: stateInProgress, LeaseLeft: &live, Epoch: 1}, true},
		{removal{epoch: 2, force: true}, record{State: stateInProgress, LeaseLeft: &out, Epoch: 3}, false},
		{removal{epoch: 3}, record{State: stateInProgress, LeaseLeft: &out, Epoch: 3}, true},
	}
	for i, c := range cases {
		err := c.rule.judge(&c.rec)
		if (err == nil) != c.ok {
			t.Errorf("case %d: %+v on %s: %v, want allowed %v", i, c.rule, c.rec.State, err, c.ok)
		}
		if err != nil && !errors.Is(err, errRefused) {
			t.Errorf("case %d: %v does not wrap errRefused", i, err)
		}
	}
}

func TestPreview(t *testing.T) {
	var b bytes.Buffer
	writePreview(&b, []byte("{\"a\":1}\nline two"))
	if b.String() != "  | {\"a\":1}\n  | line two\n" {
		t.Errorf("text preview %q", b.String())
	}
	b.Reset()
	writePreview(&b, []byte{0x00, 0xff, 'A', 0x1b})
	if !strings.HasPrefix(b.String(), "  00000000  00 ff 41 1b") {
		t.Errorf("binary preview %q", b.String())
	}
	if got := safe("ok value"); got != "ok value" {
		t.Errorf("safe(%q) = %q", "ok value", got)
	}
	if got := safe("bad\x1b[2Jvalue"); got != `"bad\x1b[2Jvalue"` {
		t.Errorf("safe of an escape sequence = %q", got)
	}
}

func TestHuman(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                                     "0s",
		850 * time.Millisecond:                "850ms",
		9887 * time.Millisecond:               "9.887s",
		-19560 * time.Millisecond:             "-19.56s",
		5*time.Minute + 3400*time.Millisecond: "5m3s",
		time.Hour:                             "1h0m",
		24*time.Hour - 61*time.Second:         "23h59m",
		3*time.Hour + 20*time.Second:          "3h0m",
	} {
		if got := human(d); got != want {
			t.Errorf("human(%v) = %q, want %q", d, got, want)
		}
	}
}

// TestExitStatusOfProcess runs the real binary: main passes run's status
// to the operating system.
func TestExitStatusOfProcess(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "key", "-key", "a b")
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitUsage {
		t.Fatalf("exit: %v, want status %d\n%s", err, exitUsage, out)
	}
	if !strings.Contains(string(out), "invalid key") {
		t.Errorf("output %q", out)
	}
}
