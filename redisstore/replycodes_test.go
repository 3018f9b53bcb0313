package redisstore

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// TestReplyCodes: the header of each script lists its replies under
// "Reply", one line per code, "--   {N, ...}   name: meaning", where name is
// the Go constant for N. Each line must name one of the script's constants
// with the value N, and each constant must have its line.
func TestReplyCodes(t *testing.T) {
	fenced := map[string]int64{"fencedOK": fencedOK, "fencedLost": fencedLost, "replyCorrupt": replyCorrupt}
	for _, sc := range []struct {
		name, src string
		codes     map[string]int64
	}{
		{"acquire.lua", acquireSrc, map[string]int64{
			"acquireAcquired": acquireAcquired, "acquireStolen": acquireStolen,
			"acquireCompleted": acquireCompleted, "acquireInFlight": acquireInFlight,
			"acquireMismatch": acquireMismatch,
			"replyCorrupt":    replyCorrupt,
		}},
		{"complete.lua", completeSrc, fenced},
		{"extend.lua", extendSrc, fenced},
		{"release.lua", releaseSrc, fenced},
		{"watch.lua", watchSrc, map[string]int64{
			"watchMarked": watchMarked, "watchNoRecord": watchNoRecord, "replyCorrupt": replyCorrupt,
		}},
	} {
		got, err := headerCodes(sc.src)
		if err != nil {
			t.Errorf("%s: %v", sc.name, err)
			continue
		}
		if !reflect.DeepEqual(got, sc.codes) {
			t.Errorf("%s: its header lists the codes %v, the Go constants are %v", sc.name, got, sc.codes)
		}
	}
}

// headerCodes returns the replies listed in a script's header: the lines
// "--   {N...}   name: ..." from the line that opens with "-- Reply" to the
// next line that is not a comment or is an empty one, as name → N.
func headerCodes(src string) (map[string]int64, error) {
	codes := map[string]int64{}
	seen := map[int64]string{}
	in := false
	for line := range strings.Lines(src) {
		line = strings.TrimRight(line, "\n")
		if !in {
			in = strings.HasPrefix(line, "-- Reply")
			continue
		}
		text, comment := strings.CutPrefix(line, "--")
		text = strings.TrimSpace(text)
		if !comment || text == "" {
			break
		}
		if !strings.HasPrefix(text, "{") {
			continue // the description of the line above, continued
		}
		reply, rest, ok := strings.Cut(text, "}")
		name, _, named := strings.Cut(strings.TrimSpace(rest), ":")
		if !ok || !named || strings.ContainsAny(name, " \t") {
			return nil, fmt.Errorf("%q: want {N, ...} name: meaning", line)
		}
		num, _, _ := strings.Cut(strings.TrimPrefix(reply, "{"), ",")
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%q: the code is not an integer", line)
		}
		if _, dup := codes[name]; dup {
			return nil, fmt.Errorf("%q names %s again", line, name)
		}
		if other, dup := seen[n]; dup {
			return nil, fmt.Errorf("%q repeats the code of %s", line, other)
		}
		codes[name], seen[n] = n, name
	}
	if len(codes) == 0 {
		return nil, errors.New(`no reply lines after "-- Reply"`)
	}
	return codes, nil
}
