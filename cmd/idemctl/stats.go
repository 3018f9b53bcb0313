package main

import (
	"context"
	"fmt"
	"io"
	"time"
)

var statsCmd = &command{
	name:    "stats",
	summary: "count records by state, with their memory or table size",
	usage:   "[connection] [-sample N] [-batch N] [-pause D] [-json] [-q]",
	help: `
Counts the records by state: in progress with a live lease, in progress with
a lease that ran out (the next duplicate steals them), complete, corrupt, and
on PostgreSQL expired rows that the purge has not deleted yet; with the bytes
of their bodies and the memory they take.

Redis: every key under the prefix is read with SCAN in bounded batches (as
list does), and MEMORY USAGE measures the first -sample records of each state;
a state's memory is its average over the sample times its count. The masters'
used_memory and maxmemory follow.

PostgreSQL: one query counts the rows by state with their bytes
(pg_column_size), and the table's size on disk follows: the heap, its TOAST
table (large bodies) and indexes (pg_total_relation_size).`,
	examples: `  idemctl stats -redis 127.0.0.1:6379
  idemctl stats -redis 127.0.0.1:6379 -sample 5000 -json
  idemctl stats -postgres "$DATABASE_URL" -table billing.idempotency`,
	run: runStats,
}

// statsOptions are stats' sampling and pacing.
type statsOptions struct {
	sample int
	batch  int
	pause  time.Duration
	quiet  bool
}

func runStats(ctx context.Context, c *cli, cmd *command, args []string) int {
	var conn connFlags
	fs := newFlagSet(cmd, &conn)
	var opts statsOptions
	fs.IntVar(&opts.sample, "sample", 1000, "Redis: measure MEMORY USAGE of at most `n` records per state")
	fs.IntVar(&opts.batch, "batch", 1000, "Redis: `n` keys per SCAN (COUNT)")
	fs.DurationVar(&opts.pause, "pause", 0, "Redis: pause this `duration` between batches")
	fs.BoolVar(&opts.quiet, "q", false, "no progress on stderr")
	asJSON := fs.Bool("json", false, "print JSON")
	if status, ok := parseFlags(c, cmd, fs, args); !ok {
		return status
	}
	if opts.batch < 1 || opts.sample < 0 {
		return c.usageFailed(cmd, usagef("-batch must be at least 1 and -sample not negative"))
	}
	return conn.connected(ctx, c, cmd, func(ctx context.Context, b backend) int {
		res, err := b.stats(ctx, c, opts)
		if err != nil {
			return c.fail(cmd, err)
		}
		if *asJSON {
			return c.printJSON(cmd, res)
		}
		res.writeText(c.stdout)
		return exitOK
	})
}

// The groups stats counts records in.
const (
	catLive   = "in_progress_live"    // in progress, the lease live
	catRanOut = "in_progress_ran_out" // in progress, the lease ran out: the next duplicate steals it
)

// statsOrder is the order in which stats shows its groups.
var statsOrder = []string{catLive, catRanOut, stateComplete, stateCorrupt, stateExpired}

// category is one group of records in stats.
type category struct {
	State     string `json:"state"`
	Records   int64  `json:"records"`
	BodyBytes int64  `json:"body_bytes"`
	// Sampled records were measured (Redis: MEMORY USAGE; PostgreSQL: every
	// row's pg_column_size) and took SampledBytes together.
	Sampled      int64 `json:"sampled"`
	SampledBytes int64 `json:"sampled_bytes"`
	// BytesPerRecord is SampledBytes / Sampled; EstimatedBytes that times
	// Records.
	BytesPerRecord int64 `json:"bytes_per_record"`
	EstimatedBytes int64 `json:"estimated_bytes"`
}

// serverMemory is a Redis master's memory.
type serverMemory struct {
	Node       string `json:"node"`
	UsedMemory int64  `json:"used_memory"`
	MaxMemory  int64  `json:"maxmemory"`
	Policy     string `json:"maxmemory_policy"`
}

// tableSize is a PostgreSQL table's size on disk.
type tableSize struct {
	Table string `json:"table"`
	Total int64  `json:"total_bytes"` // pg_total_relation_size
	Heap  int64  `json:"heap_bytes"`  // pg_relation_size
	Toast int64  `json:"toast_bytes"` // the TOAST table and its index
	Index int64  `json:"index_bytes"` // pg_indexes_size
	// EstimatedRows is the planner's estimate (reltuples), -1 before the
	// table was first analyzed.
	EstimatedRows int64 `json:"estimated_rows"`
}

// statsResult is what stats found.
type statsResult struct {
	Store      string         `json:"store"`
	Scanned    int64          `json:"scanned"`
	Records    int64          `json:"records"`
	Categories []*category    `json:"categories"`
	Servers    []serverMemory `json:"servers,omitempty"`
	Table      *tableSize     `json:"table,omitempty"`
}

func newStatsResult(store string) *statsResult { return &statsResult{Store: store} }

// category returns the group named name, adding it when it is new.
func (s *statsResult) category(name string) *category {
	for _, c := range s.Categories {
		if c.State == name {
			return c
		}
	}
	c := &category{State: name}
	s.Categories = append(s.Categories, c)
	return c
}

// finish computes the averages and totals, and puts the groups in order.
func (s *statsResult) finish() {
	var ordered []*category
	for _, name := range statsOrder {
		for _, c := range s.Categories {
			if c.State == name {
				ordered = append(ordered, c)
			}
		}
	}
	s.Categories = ordered
	s.Records = 0
	for _, c := range s.Categories {
		s.Records += c.Records
		if c.Sampled > 0 {
			c.BytesPerRecord = c.SampledBytes / c.Sampled
			c.EstimatedBytes = c.BytesPerRecord * c.Records
		}
	}
}

// writeText writes s for people.
func (s *statsResult) writeText(w io.Writer) {
	fmt.Fprintf(w, "%s: %d records (%d scanned)\n\n", s.Store, s.Records, s.Scanned)
	tw := newTabWriter(w)
	fmt.Fprintln(tw, "STATE\tRECORDS\tBODY BYTES\tMEMORY (EST.)\tPER RECORD\tSAMPLED")
	var records, body, est int64
	for _, c := range s.Categories {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%d\n", c.State, c.Records, size(c.BodyBytes),
			size(c.EstimatedBytes), size(c.BytesPerRecord), c.Sampled)
		records += c.Records
		body += c.BodyBytes
		est += c.EstimatedBytes
	}
	fmt.Fprintf(tw, "total\t%d\t%s\t%s\n", records, size(body), size(est))
	tw.Flush()
	for _, m := range s.Servers {
		limit := ", no maxmemory"
		if m.MaxMemory > 0 {
			limit = fmt.Sprintf(" of maxmemory %s (%.0f%%)", size(m.MaxMemory), float64(m.UsedMemory)*100/float64(m.MaxMemory))
		}
		fmt.Fprintf(w, "\n%s: used_memory %s%s, maxmemory-policy %s", m.Node, size(m.UsedMemory), limit, m.Policy)
	}
	if len(s.Servers) > 0 {
		fmt.Fprintln(w)
	}
	if t := s.Table; t != nil {
		estimate := "the planner has no estimate of its rows yet"
		if t.EstimatedRows >= 0 {
			estimate = fmt.Sprintf("about %d rows by the planner's estimate", t.EstimatedRows)
		}
		fmt.Fprintf(w, "\ntable %s: %s in all (heap %s, TOAST %s, indexes %s); %s\n",
			t.Table, size(t.Total), size(t.Heap), size(t.Toast), size(t.Index), estimate)
		if s.Records > 0 {
			fmt.Fprintf(w, "on disk per record: %s\n", size(t.Total/s.Records))
		}
	}
}

// size renders n bytes in binary units.
func size(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
