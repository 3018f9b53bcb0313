package main

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Record states as idemctl shows them: the stores' two, and the ones a
// store's reader cannot take at face value.
const (
	stateInProgress = "in_progress"
	stateComplete   = "complete"
	stateCorrupt    = "corrupt" // not a record the store can read
	stateExpired    = "expired" // PostgreSQL: past expires_at, not yet purged
)

// record is one record as idemctl shows it.
type record struct {
	Key      string // storage key
	Location string // Redis key, or table
	State    string
	Problem  string // why the record is corrupt
	Unread   string // what idemctl did not read of a readable record (list reads a bounded prefix)

	Epoch       int64
	Token       string
	Fingerprint []byte
	LeaseEnd    time.Time      // on the server's clock; zero when unknown
	LeaseLeft   *time.Duration // in progress: negative once the lease ran out
	ExpiresIn   *time.Duration // nil: no expiry (or unknown)
	Age         *time.Duration // since acquired (or stolen) or completed, from the TTL; list only
	Updated     *time.Duration // PostgreSQL: since an edge last wrote the row
	Watched     bool

	Status      int
	Header      http.Header
	BodyOmitted bool
	BodyLen     int64
	Body        []byte // the first bytes of the body, up to the preview limit

	ServerTime time.Time
}

// leaseLive reports whether the record's lease has not run out.
func (r *record) leaseLive() bool { return r.LeaseLeft != nil && *r.LeaseLeft > 0 }

// recordJSON is the JSON form of a record.
type recordJSON struct {
	StorageKey        string      `json:"storage_key"`
	Location          string      `json:"location"`
	State             string      `json:"state"`
	Problem           string      `json:"problem,omitempty"`
	Unread            string      `json:"unread,omitempty"`
	Epoch             int64       `json:"epoch,omitempty"`
	Token             string      `json:"token,omitempty"`
	Fingerprint       string      `json:"fingerprint_hex,omitempty"`
	LeaseEnd          *time.Time  `json:"lease_end,omitempty"`
	LeaseLeftMS       *int64      `json:"lease_left_ms,omitempty"`
	ExpiresInMS       *int64      `json:"expires_in_ms,omitempty"`
	AgeMS             *int64      `json:"age_ms,omitempty"`
	UpdatedMS         *int64      `json:"updated_ms_ago,omitempty"`
	Watched           bool        `json:"watched"`
	Status            int         `json:"status,omitempty"`
	Headers           http.Header `json:"headers,omitempty"`
	BodyOmitted       bool        `json:"body_omitted,omitempty"`
	BodyBytes         int64       `json:"body_bytes"`
	BodyPreview       *string     `json:"body_preview,omitempty"`
	BodyPreviewBase64 string      `json:"body_preview_base64,omitempty"`
	ServerTime        time.Time   `json:"server_time"`
}

func ms(d *time.Duration) *int64 {
	if d == nil {
		return nil
	}
	v := d.Milliseconds()
	return &v
}

func (r *record) json() recordJSON {
	j := recordJSON{
		StorageKey: r.Key, Location: r.Location, State: r.State, Problem: r.Problem, Unread: r.Unread,
		Epoch: r.Epoch, Token: r.Token, Fingerprint: hex.EncodeToString(r.Fingerprint),
		LeaseLeftMS: ms(r.LeaseLeft), ExpiresInMS: ms(r.ExpiresIn), AgeMS: ms(r.Age), UpdatedMS: ms(r.Updated),
		Watched: r.Watched, Status: r.Status, Headers: r.Header, BodyOmitted: r.BodyOmitted,
		BodyBytes: r.BodyLen, ServerTime: r.ServerTime,
	}
	if !r.LeaseEnd.IsZero() {
		t := r.LeaseEnd
		j.LeaseEnd = &t
	}
	if len(r.Body) > 0 {
		j.BodyPreviewBase64 = base64.StdEncoding.EncodeToString(r.Body)
		if utf8.Valid(r.Body) {
			s := string(r.Body)
			j.BodyPreview = &s
		}
	}
	return j
}

// printJSON writes v to stdout as JSON, and returns exitOK, or cmd's
// failure when it cannot.
func (c *cli) printJSON(cmd *command, v any) int {
	if err := writeJSON(c.stdout, v); err != nil {
		return c.fail(cmd, err)
	}
	return exitOK
}

// writeJSON writes v as one line of JSON, escaping the characters that a
// terminal would not show as they are (see escapeJSON).
func writeJSON(w io.Writer, v any) error {
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(v); err != nil {
		return err
	}
	_, err := w.Write(escapeJSON(b.Bytes()))
	return err
}

// escapeJSON returns the JSON text b with a \u escape for every character
// that is not graphic (unicode.IsGraphic) and that encoding/json leaves as
// it is: DEL, the C1 controls such as U+0085, and format characters such as
// the bidi controls. (encoding/json escapes those below U+0020, and U+2028
// and U+2029, itself.) In JSON text such a character can only be within a
// string, where its escape decodes to the same character.
func escapeJSON(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		switch {
		case r < utf8.RuneSelf && r != 0x7f, unicode.IsGraphic(r):
			out = append(out, b[:n]...)
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		default:
			out = fmt.Appendf(out, `\u%04x`, r)
		}
		b = b[n:]
	}
	return out
}

// writeText writes r for people.
func (r *record) writeText(w io.Writer) {
	line := func(name, format string, args ...any) {
		fmt.Fprintln(w, strings.TrimRight(fmt.Sprintf("%-12s %s", name, fmt.Sprintf(format, args...)), " "))
	}
	line("storage key", "%s", safe(r.Key))
	line("location", "%s", safe(r.Location))
	state := r.State
	if r.Problem != "" {
		state += ": " + safe(r.Problem)
	}
	line("state", "%s", state)
	if r.Unread != "" {
		line("unread", "%s", r.Unread)
	}
	if r.Epoch > 0 {
		line("epoch", "%d", r.Epoch)
	}
	if r.Token != "" {
		line("token", "%s", safe(r.Token))
	}
	if len(r.Fingerprint) > 0 {
		line("fingerprint", "%s", hex.EncodeToString(r.Fingerprint))
	}
	if r.State == stateInProgress || (r.State == stateExpired && r.LeaseLeft != nil) {
		line("lease", "%s", describeLease(r))
	}
	if r.ExpiresIn != nil {
		what := "expires in"
		if r.State == stateExpired {
			line("expired", "%s ago (absent to requests; the next purge deletes the row)", human(-*r.ExpiresIn))
		} else {
			line(what, "%s", human(*r.ExpiresIn))
		}
	} else if r.State != stateExpired {
		line("expires in", "never (no expiry set)")
	}
	if r.Updated != nil {
		line("updated", "%s ago", human(*r.Updated))
	}
	line("watched", "%s", yesNo(r.Watched))
	if r.Status != 0 {
		line("status", "%d %s", r.Status, http.StatusText(r.Status))
		names := slices.Sorted(maps.Keys(r.Header))
		if len(names) == 0 {
			line("headers", "none")
		} else {
			line("headers", "")
		}
		for _, k := range names {
			for _, v := range r.Header[k] {
				fmt.Fprintf(w, "  %s: %s\n", safe(k), safe(v))
			}
		}
		switch {
		case r.BodyOmitted:
			line("body", "omitted (over the cap, or not known whole): replays send an empty body")
		case r.BodyLen == 0:
			line("body", "empty")
		default:
			shown := ""
			if int64(len(r.Body)) < r.BodyLen {
				shown = fmt.Sprintf(", first %d shown", len(r.Body))
			}
			line("body", "%d bytes%s", r.BodyLen, shown)
			writePreview(w, r.Body)
		}
	}
}

// describeLease says when the record's lease ends or ended.
func describeLease(r *record) string {
	if r.LeaseLeft == nil {
		return "unknown"
	}
	at := ""
	if !r.LeaseEnd.IsZero() {
		at = " (" + r.LeaseEnd.UTC().Format("2006-01-02T15:04:05.000Z") + " on the server's clock)"
	}
	if left := *r.LeaseLeft; left > 0 {
		return "live, " + human(left) + " left" + at
	}
	return "ran out " + human(-*r.LeaseLeft) + " ago" + at
}

// writePreview writes body indented. A body of UTF-8 text is written line
// by line (without the "\n" or "\r\n" that ends a line): after "|" with
// its tabs expanded when the line is graphic, else Go-quoted after "!". Any
// other body (not UTF-8, or holding a NUL byte) is written as a hex dump.
func writePreview(w io.Writer, body []byte) {
	if !utf8.Valid(body) || bytes.IndexByte(body, 0) >= 0 {
		for _, l := range strings.Split(strings.TrimRight(hex.Dump(body), "\n"), "\n") {
			fmt.Fprintf(w, "  %s\n", l)
		}
		return
	}
	for l := range strings.Lines(string(body)) {
		line, crlf := strings.CutSuffix(l, "\r\n")
		if !crlf {
			line = strings.TrimSuffix(l, "\n")
		}
		if text := strings.ReplaceAll(line, "\t", "    "); graphic(text) {
			fmt.Fprintf(w, "  | %s\n", text)
		} else {
			fmt.Fprintf(w, "  ! %s\n", strconv.QuoteToGraphic(line))
		}
	}
}

// graphic reports whether s is UTF-8 of graphic characters only
// (unicode.IsGraphic: letters, marks, numbers, punctuation, symbols and
// spaces), which a terminal shows as they are on one line: no control or
// format character, no line or paragraph separator.
func graphic(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsGraphic(r) })
}

// safe returns s as it is when it is graphic, else Go-quoted
// (strconv.QuoteToGraphic), so that no byte of a record can move a
// terminal's cursor or reorder what it shows.
func safe(s string) string {
	if graphic(s) {
		return s
	}
	return strconv.QuoteToGraphic(s)
}

func yesNo(b bool) string {
	if b {
		return "yes (a waiter is notified when the record completes or is released)"
	}
	return "no"
}

// human renders d for people, less precisely the longer it is: 850ms,
// 9.887s, 5m3s, 23h59m.
func human(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + human(-d)
	case d < time.Minute:
		d = d.Round(time.Millisecond)
	case d < time.Hour:
		d = d.Round(time.Second)
	default:
		d = d.Round(time.Minute)
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	return s
}

// removal is what delete and release may remove.
type removal struct {
	release bool  // release: only a record in progress
	force   bool  // remove what the rules below refuse (release: but never a COMPLETE one)
	epoch   int64 // when > 0, only a record at this epoch
}

// errRefused wraps the reasons a removal rule refused a change.
var errRefused = errors.New("refused")

// errNotFound says there is no record.
var errNotFound = errors.New("no such record")

// judge returns nil when the rule lets r be removed, else an error
// wrapping errRefused that says why. r must not be nil.
func (u removal) judge(r *record) error {
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", errRefused, fmt.Sprintf(format, args...))
	}
	if u.epoch > 0 && r.Epoch != u.epoch {
		return refuse("the record is at epoch %d, not %d: it changed since you looked; inspect it again", r.Epoch, u.epoch)
	}
	if u.release && r.State != stateInProgress {
		return refuse("release acts on IN_PROGRESS records only, and this one is %s (delete removes others, with -force where needed)", r.State)
	}
	if r.State == stateExpired {
		return nil
	}
	if !u.force {
		switch r.State {
		case stateComplete:
			return refuse("the record is COMPLETE: deleting it makes the next duplicate run the handler again instead of replaying; add -force if that is what you want")
		case stateCorrupt:
			return refuse("the record is unreadable (%s); requests for it get 500 record_unreadable; deleting it lets the next one run the handler; add -force if that is what you want", safe(r.Problem))
		case stateInProgress:
			if r.leaseLive() {
				return refuse("the lease is live (%s left): its handler may still be running, and removing the record lets a duplicate run beside it; wait for the lease to run out, or add -force once you know the owner is gone", human(*r.LeaseLeft))
			}
		}
	}
	return nil
}
