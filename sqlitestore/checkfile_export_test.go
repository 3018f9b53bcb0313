package sqlitestore

// WithCheckDSNParams adds query parameters to the URI of CheckFile's
// connection, after its own: as root, which ignores file modes, the tests
// simulate a read-only file with mode=ro.
func WithCheckDSNParams(params string) CheckOption {
	return func(c *checkConfig) { c.dsnParams = params }
}
