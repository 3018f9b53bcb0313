package sqlitestore_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/go-idempotency/idempotency/sqlitestore"
)

// A file's settings and table judged from outside the application, as
// idemctl check -sqlite does: one finding per item, each with its
// verdict. Report.Log logs each FAIL at Error and each WARN at Warn, so
// nothing for this file.
func ExampleCheckFile() {
	dir, err := os.MkdirTemp("", "sqlitestore-check-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "app.db")
	store, err := sqlitestore.Open(path)
	if err != nil {
		log.Fatal(err)
	}
	store.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	report, err := sqlitestore.CheckFile(ctx, path, sqlitestore.DefaultTable, sqlitestore.WithPurgeLag(30*time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	report.Log(ctx, slog.Default())
	for _, f := range report.Findings {
		fmt.Println(f.Verdict, f.Item)
	}
	fmt.Println("worst:", report.Worst())
	// Output:
	// OK file
	// INFO sqlite
	// OK journal_mode
	// OK writable
	// OK directory
	// INFO synchronous
	// INFO busy_timeout
	// OK table
	// OK columns
	// OK expires-at-index
	// OK purge
	// INFO outbox
	// OK quick_check
	// INFO size
	// worst: OK
}
