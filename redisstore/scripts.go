package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"
)

// One Lua script per edge of the record's state machine. Each touches only
// the record's own key, so that it runs on a Cluster; judges leases on the
// server's clock (its TIME against the lease's end in the head, see
// internal/redisrecord); and replies with an array that opens with a code
// (the constants below). Script.Run sends EVALSHA and falls back to EVAL when
// the server answers NOSCRIPT (a restarted or failed-over server has an
// empty script cache).
//
// complete.lua, extend.lua and release.lua open with the flags line
// "#!lua flags=allow-oom", so that Redis 7 and later run them on a server
// at maxmemory: a record whose handler ran can still be completed, its
// lease extended, or released. (With a flags line Redis 7 also treats the
// script as a write script: it refuses it on a read-only replica up front,
// and checks the keys it touches more strictly, which these pass: each
// touches only the key it declares.) acquire.lua has no flags line: a
// server at maxmemory runs its read-only paths and refuses its writes.
//
// complete.lua is also sent with the flags line "#!lua" alone
// (completeDenyOOMScript), for a payload over WithMaxmemoryAllowance: Redis
// 7 refuses that script at maxmemory before it runs ("OOM command not
// allowed ..."), and Complete then stores a marked payload, the status with
// or without the headers, with the allow-oom script instead (see
// Store.Complete). So a large payload is written only while the server is
// below maxmemory, which it may cross by that payload's size, as any write
// command may. Both variants have the same plain script.
//
// Servers before Redis 7 do not know flags lines and refuse to compile such
// a script; a Store then switches, once, to the same scripts without the
// line (see flaggedScript), which such a server refuses at maxmemory as it
// always did (complete and extend, whatever the payload's size; release
// only deletes).
var (
	//go:embed acquire.lua
	acquireSrc    string
	acquireScript = redis.NewScript(acquireSrc)

	//go:embed complete.lua
	completeSrc    string
	completeScript = newFlaggedScript(completeSrc)
	// The same source with "allow-oom" taken out of its flags line, so
	// that Redis 7 refuses it at maxmemory before it writes anything.
	completeDenyOOMScript = newFlaggedScript(withoutFlag(completeSrc, "allow-oom"))

	//go:embed release.lua
	releaseSrc    string
	releaseScript = newFlaggedScript(releaseSrc)

	//go:embed extend.lua
	extendSrc    string
	extendScript = newFlaggedScript(extendSrc)

	// watchScript is not an edge: it marks a record as watched, so that
	// complete and release publish on its channel.
	//go:embed watch.lua
	watchSrc    string
	watchScript = redis.NewScript(watchSrc)
)

// Reply codes: the first element of each script's reply. Each script's
// header lists its replies under "Reply", every line naming the constant
// for its code here; TestReplyCodes checks that both sides agree.

// replyCorrupt is the code of every script's {-1, message} reply: the value
// under the key is not a record, and nothing changed.
const replyCorrupt = -1

// Replies of acquire.lua.
const (
	acquireAcquired  = 1 // {1, epoch}: a fresh lease at epoch 1 (or the holder's retry at epoch 1)
	acquireStolen    = 2 // {2, epoch}: the lease had run out; a fresh lease at epoch + 1 (or the holder's retry)
	acquireCompleted = 3 // {3, payload[, pttl]}: the stored payload, for replay, and, when asked for, the key's PTTL (-1: none)
	acquireInFlight  = 4 // {4, epoch, remaining_ms}: another token's lease is live
	acquireMismatch  = 5 // {5}: the record has another fingerprint
)

// Replies of the fenced scripts, complete.lua, extend.lua and release.lua,
// which act only for the token that holds the record.
const (
	fencedOK   = 1 // {1}: done (or done before: a retry)
	fencedLost = 0 // {0}: the caller's lease is lost
)

// Replies of watch.lua.
const (
	watchMarked   = 1 // {1}: the record is marked as watched
	watchNoRecord = 0 // {0}: no record to mark
)

// flaggedScript is a script whose source opens with a flags line
// ("#!lua" and its flags), for Redis 7 and later, together with the same
// script with that line left empty, for older servers. Keeping the line's
// newline keeps the line numbers of error messages the same in both.
type flaggedScript struct {
	flagged, plain *redis.Script
}

// flagsLinePrefix opens the flags line of a script.
const flagsLinePrefix = "#!lua"

// newFlaggedScript returns the flaggedScript of src. It panics when src
// does not open with a flags line.
func newFlaggedScript(src string) *flaggedScript {
	line, _, ok := strings.Cut(src, "\n")
	if !ok || !strings.HasPrefix(line, flagsLinePrefix) {
		panic("redisstore: script does not open with a flags line")
	}
	return &flaggedScript{
		flagged: redis.NewScript(src),
		plain:   redis.NewScript(src[len(line):]),
	}
}

// withoutFlag returns src with flag taken out of its flags line, which
// must be "#!lua flags=<flag>,...": "#!lua flags=allow-oom" becomes
// "#!lua", a flags line declaring no flag. The rest of src, and so its
// line numbers and the plain script derived from it, are left as they are.
// It panics when the flags line does not list flag.
func withoutFlag(src, flag string) string {
	line, rest, _ := strings.Cut(src, "\n")
	list, ok := strings.CutPrefix(line, flagsLinePrefix+" flags=")
	flags := strings.Split(list, ",")
	kept := slices.DeleteFunc(slices.Clone(flags), func(f string) bool { return f == flag })
	if !ok || len(kept) == len(flags) {
		panic("redisstore: the script's flags line does not list " + flag)
	}
	line = flagsLinePrefix
	if len(kept) > 0 {
		line += " flags=" + strings.Join(kept, ",")
	}
	return line + "\n" + rest
}

// flagsLineRefused reports whether err is the error a server before Redis 7
// answers to a script that opens with a flags line. Such a server compiles
// a script as the body of a Lua function, where "#" cannot start a
// statement, and replies
//
//	ERR Error compiling script (new function): user_script:1: unexpected symbol near '#'
//
// (Redis 2.6 to 6.2; Redis 7 reports a script that does not compile with
// the same prefix, so the prefix alone is not enough).
func flagsLineRefused(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	return strings.HasPrefix(msg, "ERR Error compiling script") && strings.Contains(msg, "near '#'")
}

// script returns the version of sc the Store sends: the flagged one until
// the server refused a flags line.
func (s *Store) script(sc *flaggedScript) *redis.Script {
	if s.plainScripts.Load() {
		return sc.plain
	}
	return sc.flagged
}

// run runs sc on the Store's client with EVALSHA (EVAL on NOSCRIPT). When
// the server refuses the flags line, the Store switches to the plain
// scripts for good and runs sc again without it: the refused call did not
// run, so running it again is safe.
func (s *Store) run(ctx context.Context, sc *flaggedScript, keys []string, args ...any) ([]any, error) {
	script := s.script(sc)
	reply, err := script.Run(ctx, s.calls, keys, args...).Slice()
	if script == sc.flagged && flagsLineRefused(err) {
		s.plainScripts.Store(true)
		reply, err = sc.plain.Run(ctx, s.calls, keys, args...).Slice()
	}
	return reply, err
}
