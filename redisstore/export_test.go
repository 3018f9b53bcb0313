package redisstore

// Unexported parts of the package, for its tests.
var (
	FlagsLineRefused = flagsLineRefused
	WithoutFlag      = withoutFlag
	EpochAt          = epochAt
	MsDuration       = msDuration
)

// DefaultMaxmemoryAllowance is WithMaxmemoryAllowance's default.
const DefaultMaxmemoryAllowance = defaultMaxmemoryAllowance

// CompleteSrc is the source of complete.lua.
var CompleteSrc = completeSrc

// UsePlainScripts makes s send the scripts without their flags line, as it
// does once a server before Redis 7 refused one.
func UsePlainScripts(s *Store) { s.plainScripts.Store(true) }

// PlainScripts reports whether s sends the scripts without their flags line.
func PlainScripts(s *Store) bool { return s.plainScripts.Load() }

// FlaggedScriptSHAs returns the SHA-1 digests of the scripts sent with a
// flags line, as EVALSHA names them.
func FlaggedScriptSHAs() []string {
	return []string{
		completeScript.flagged.Hash(), completeDenyOOMScript.flagged.Hash(),
		extendScript.flagged.Hash(), releaseScript.flagged.Hash(),
	}
}
