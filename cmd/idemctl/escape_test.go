package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-idempotency/idempotency"
)

// hostile are strings that must not reach a terminal as they are, each with
// its Go escape as idemctl shows it within quotes.
var hostile = []struct {
	name, raw, quoted string
}{
	{"CR", "\r", `\r`},
	{"VT", "\v", `\v`},
	{"FF", "\f", `\f`},
	{"NEL", "\u0085", `\u0085`},
	{"RLO", "\u202e", `\u202e`},
	{"LRI", "\u2066", `\u2066`},
	{"RLM", "\u200f", `\u200f`},
	{"ALM", "\u061c", `\u061c`},
	{"CSI", "\x1b[2J", `\x1b[2J`},
	{"LSEP", "\u2028", `\u2028`},
	{"invalid UTF-8", "\xff\xfe", `\xff\xfe`},
}

// checkShown fails t for every character of out that would reach a
// terminal as it is although it is neither graphic nor a newline.
func checkShown(t *testing.T, out string) {
	t.Helper()
	for i := 0; i < len(out); {
		r, n := utf8.DecodeRuneInString(out[i:])
		if (r == utf8.RuneError && n == 1) || (r != '\n' && !unicode.IsGraphic(r)) {
			line := out[strings.LastIndexByte(out[:i], '\n')+1:]
			line, _, _ = strings.Cut(line, "\n")
			t.Errorf("raw %q in the output, in the line %q", out[i:i+n], line)
		}
		i += n
	}
}

// hostileResponse is a response whose header name, header value and body
// hold s: the body is JSON of three lines, s in the second.
func hostileResponse(s string) *idempotency.Response {
	return &idempotency.Response{
		Status: http.StatusOK,
		Header: http.Header{"X-Note": {"a" + s + "b"}, "X-Odd" + s: {"v"}},
		Body:   []byte("{\n  \"note\": \"a" + s + "b\"\n}\n"),
	}
}

// wantShown is what inspect prints of hostileResponse(raw).
func wantShown(raw, quoted string) []string {
	want := []string{`  X-Note: "a` + quoted + `b"`, `  "X-Odd` + quoted + `": v`}
	if !utf8.ValidString(raw) {
		return append(want, "  00000000  7b 0a 20 20 22 6e 6f 74  65 22 3a 20 22 61 ff fe")
	}
	return append(want, "  | {", `  ! "  \"note\": \"a`+quoted+`b\""`, "  | }")
}

func TestEscapeInspectRedis(t *testing.T) {
	f := newRedisFixture(t)
	for _, h := range hostile {
		t.Run(h.name, func(t *testing.T) {
			resp := hostileResponse(h.raw)
			sk := complete(t, f.store, "", "hostile-"+h.name, resp, time.Hour)

			r := f.run(t, "inspect", sk).want(t, exitOK)
			checkShown(t, r.stdout)
			r.contains(t, wantShown(h.raw, h.quoted)...)

			r = f.run(t, "inspect", sk, "-json").want(t, exitOK)
			checkShown(t, r.stdout)
			var j recordJSON
			r.decode(t, &j)
			if !utf8.ValidString(h.raw) {
				return // encoding/json writes invalid UTF-8 as U+FFFD
			}
			if got := j.Headers["X-Note"]; len(got) != 1 || got[0] != resp.Header.Get("X-Note") {
				t.Errorf("-json header X-Note %q, want %q", got, resp.Header.Get("X-Note"))
			}
			if _, ok := j.Headers["X-Odd"+h.raw]; !ok {
				t.Errorf("-json headers %q lack %q", j.Headers, "X-Odd"+h.raw)
			}
			if j.BodyPreview == nil {
				t.Errorf("-json without body_preview, want %q", resp.Body)
			} else if *j.BodyPreview != string(resp.Body) {
				t.Errorf("-json body_preview %q, want %q", *j.BodyPreview, resp.Body)
			}
		})
	}
}

func TestEscapeListPostgres(t *testing.T) {
	f := newPGFixture(t)
	var keys []string
	for i, h := range hostile {
		if !utf8.ValidString(h.raw) {
			continue // a text column holds UTF-8 only
		}
		sk, _ := hold(t, f.store, "", fmt.Sprint("hostile-", i), time.Minute, time.Hour)
		key := "k" + h.raw + "k"
		f.exec(t, "UPDATE idempotency_records SET key = $2 WHERE key = $1", sk, key)
		keys = append(keys, key)
	}

	r := f.run(t, "list").want(t, exitOK)
	checkShown(t, r.stdout+r.stderr)
	var quoted []string
	for _, h := range hostile {
		if utf8.ValidString(h.raw) {
			quoted = append(quoted, `"k`+h.quoted+`k"`)
		}
	}
	if got := keysOf(r.rows()); !sameSet(got, quoted) {
		t.Errorf("list shows the keys %q, want %q", got, quoted)
	}

	r = f.run(t, "list", "-json").want(t, exitOK)
	checkShown(t, r.stdout)
	var got []string
	for _, j := range r.jsonLines(t) {
		got = append(got, j.StorageKey)
	}
	if !sameSet(got, keys) {
		t.Errorf("list -json keys %q, want %q", got, keys)
	}
}

func TestEscapeWriteText(t *testing.T) {
	for _, h := range hostile {
		t.Run(h.name, func(t *testing.T) {
			resp := hostileResponse(h.raw)
			rec := &record{
				Key: "k" + h.raw, Location: "l" + h.raw, State: stateCorrupt, Problem: "p" + h.raw, Token: "t" + h.raw,
				Status: resp.Status, Header: resp.Header, BodyLen: int64(len(resp.Body)), Body: resp.Body,
			}
			var b bytes.Buffer
			rec.writeText(&b)
			out := b.String()
			checkShown(t, out)
			for _, want := range append(wantShown(h.raw, h.quoted),
				`storage key  "k`+h.quoted+`"`, `location     "l`+h.quoted+`"`,
				`state        corrupt: "p`+h.quoted+`"`, `token        "t`+h.quoted+`"`) {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}

			var stdout, stderr bytes.Buffer
			tw := newTabWriter(&stdout)
			writeRow(tw, rec)
			tw.Flush()
			checkShown(t, stdout.String())
			if want := `"k` + h.quoted + `"`; !strings.HasPrefix(stdout.String(), want) {
				t.Errorf("list row %q does not start with %q", stdout.String(), want)
			}

			err := removal{}.judge(rec)
			if err == nil || !strings.Contains(err.Error(), `"p`+h.quoted+`"`) {
				t.Errorf("judge: %v, want the reason quoted", err)
			}
			checkShown(t, fmt.Sprint(err))

			(&cli{stdout: &stdout, stderr: &stderr}).fail(inspectCmd, errors.New("read "+h.raw))
			checkShown(t, stderr.String())
		})
	}
}

func TestEscapePreviewLines(t *testing.T) {
	cases := []struct{ body, want string }{
		{"{\n\t\"id\": \"ch_1\",\n\t\"amount\": 1999\n}\n",
			"  | {\n  |     \"id\": \"ch_1\",\n  |     \"amount\": 1999\n  | }\n"},
		{"crlf\r\nlines\r\n\r\nend", "  | crlf\n  | lines\n  | \n  | end\n"},
		{"héllo wörld, 你好 🙂\u00a0!", "  | héllo wörld, 你好 🙂\u00a0!\n"},
		{"a\rb\ncarriage return last\r", "  ! \"a\\rb\"\n  ! \"carriage return last\\r\"\n"},
		{"one\ttab \x1b[31mred\n", "  ! \"one\\ttab \\x1b[31mred\"\n"},
		{"tag \U000e0041 and del \x7f", "  ! \"tag \\U000e0041 and del \\x7f\"\n"},
	}
	for _, c := range cases {
		var b bytes.Buffer
		writePreview(&b, []byte(c.body))
		if b.String() != c.want {
			t.Errorf("preview of %q:\n%s\nwant:\n%s", c.body, b.String(), c.want)
		}
		checkShown(t, b.String())
	}
}

func TestEscapeJSON(t *testing.T) {
	var all []string
	for _, h := range hostile {
		if utf8.ValidString(h.raw) {
			all = append(all, "x"+h.raw+"y")
		}
	}
	all = append(all, "tag \U000e0041, del \x7f, C1 \u009b, BOM \ufeff", "plain <é> & 🙂")
	var b bytes.Buffer
	if err := writeJSON(&b, all); err != nil {
		t.Fatal(err)
	}
	checkShown(t, strings.TrimSuffix(b.String(), "\n"))
	for _, want := range []string{`\u0085`, `\u202e`, `\u2066`, `\u200f`, `\u061c`, `\u2028`, `\u001b[2J`, `\udb40\udc41`, `\u007f`, `\u009b`, `\ufeff`, `é`, `🙂`} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("JSON lacks %s: %s", want, b.String())
		}
	}
	var back []string
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, b.String())
	}
	if strings.Join(back, "|") != strings.Join(all, "|") {
		t.Errorf("JSON decodes to %q, want %q", back, all)
	}
}
