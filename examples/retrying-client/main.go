// Command retrying-client sends payments to examples/chi-server through a
// connection that loses answers, and shows that retrying with the same
// Idempotency-Key executes each payment exactly once.
//
// Start the server, then the client:
//
//	go run ./examples/chi-server &
//	go run ./examples/retrying-client -n 20 -drop 0.3
//
// The client starts an in-process loopback proxy in front of the server that,
// with probability -drop, hangs up after the server has answered: the
// payment ran but its answer is lost. client.Transport retries with the same
// key, and the server replays the stored answer. The command prints each
// payment's key, attempts and whether the answer was a replay, compares the
// server's execution count before and after, and exits with status 1 when the
// server executed a different number of payments than were sent.
//
// Every attempt carries the same bearer token (-token; chi-server knows
// alice-token and bob-token): the server scopes keys to the user the token
// authenticates, so a retry finds its own payment's record.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-idempotency/idempotency/client"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout)
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintln(os.Stderr, "retrying-client:", err)
		os.Exit(1)
	}
}

type options struct {
	server   string
	n        int
	drop     float64
	token    string
	seed     uint64
	attempts int
	timeout  time.Duration
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("retrying-client", flag.ContinueOnError)
	fs.StringVar(&o.server, "server", "http://127.0.0.1:8080", "base URL of examples/chi-server")
	fs.IntVar(&o.n, "n", 20, "number of payments to send")
	fs.Float64Var(&o.drop, "drop", 0.3, "probability that the proxy loses an answer (0 to 1)")
	fs.StringVar(&o.token, "token", "alice-token", "bearer token of the user the payments are made for (chi-server: alice-token or bob-token)")
	fs.Uint64Var(&o.seed, "seed", 0, "seed of the proxy's random drops (0: random)")
	fs.IntVar(&o.attempts, "attempts", 8, "maximum attempts per payment")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "time limit per payment, retries included")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.n < 1:
		return o, errors.New("-n must be at least 1")
	case o.drop < 0 || o.drop >= 1:
		return o, errors.New("-drop must be in [0, 1)")
	case o.attempts < 1:
		return o, errors.New("-attempts must be at least 1")
	case o.timeout <= 0:
		return o, errors.New("-timeout must be positive")
	case o.token == "":
		return o, errors.New("-token must not be empty")
	}
	if o.seed == 0 {
		o.seed = rand.Uint64()
	}
	return o, nil
}

// payment is the body of POST /payments and of its answer.
type payment struct {
	ID       string `json:"id,omitempty"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	server, err := url.Parse(o.server)
	if err != nil || server.Scheme != "http" || server.Host == "" {
		return fmt.Errorf("-server %q: want an http:// URL", o.server)
	}
	base := strings.TrimRight(o.server, "/")
	target := server.Host
	if server.Port() == "" {
		target = net.JoinHostPort(server.Hostname(), "80")
	}

	direct := &http.Client{Timeout: 10 * time.Second}
	before, err := executed(ctx, direct, base)
	if err != nil {
		return fmt.Errorf("reading stats before: %w", err)
	}

	proxy, err := startFlakyProxy(target, o.drop, o.seed)
	if err != nil {
		return fmt.Errorf("starting proxy: %w", err)
	}
	defer proxy.Close()

	// One connection per request, so that the proxy decides afresh for
	// every attempt whether to lose its answer.
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: client.NewTransport(tr,
		client.WithMaxAttempts(o.attempts),
		client.WithMaxElapsed(o.timeout),
	)}
	payURL := (&url.URL{Scheme: "http", Host: proxy.Addr(), Path: strings.TrimRight(server.Path, "/") + "/payments"}).String()

	fmt.Fprintf(stdout, "sending %d payments to %s through a proxy that loses %.0f%% of the answers (seed %d)\n\n",
		o.n, o.server, o.drop*100, o.seed)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tkey\tattempts\treplayed\tstatus\tpayment")
	failed := 0
	for i := 1; i <= o.n; i++ {
		line, err := pay(ctx, hc, payURL, o, int64(1000+i))
		if err != nil {
			failed++
		}
		fmt.Fprintf(tw, "%d\t%s\n", i, line)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	after, err := executed(ctx, direct, base)
	if err != nil {
		return fmt.Errorf("reading stats after: %w", err)
	}
	got := after - before
	fmt.Fprintf(stdout, "\n%d answers lost on the way back, %d payments failed\n", proxy.Dropped(), failed)
	fmt.Fprintf(stdout, "server executed %d payments for %d sent\n", got, o.n)
	if got != int64(o.n) {
		return fmt.Errorf("server executed %d payments for %d sent", got, o.n)
	}
	if failed > 0 {
		return fmt.Errorf("%d payments got no answer", failed)
	}
	return nil
}

// pay sends one payment and describes the outcome as a tab-separated line.
func pay(ctx context.Context, hc *http.Client, payURL string, o options, amount int64) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	var info client.Info
	ctx = client.WithInfo(ctx, &info)
	body, _ := json.Marshal(payment{Amount: amount, Currency: "EUR"})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, payURL, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+o.token)

	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Sprintf("%s\t%d\t-\terror: %v\t", short(info.Key), info.Attempts, err), err
	}
	defer resp.Body.Close()
	var p payment
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err == nil && resp.StatusCode == http.StatusCreated {
		err = json.Unmarshal(raw, &p)
	}
	replayed := "no"
	if client.Replayed(resp) {
		replayed = "yes"
	}
	line := fmt.Sprintf("%s\t%d\t%s\t%s\t%s", short(client.Key(resp)), client.Attempts(resp), replayed, resp.Status, p.ID)
	if err != nil {
		return line, err
	}
	if resp.StatusCode != http.StatusCreated {
		return line, fmt.Errorf("status %s", resp.Status)
	}
	return line, nil
}

// executed reads payments_executed from the server's /stats.
func executed(ctx context.Context, hc *http.Client, server string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, server+"/stats", nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /stats: %s", resp.Status)
	}
	var s struct {
		Executed *int64 `json:"payments_executed"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&s); err != nil {
		return 0, fmt.Errorf("GET /stats: %w", err)
	}
	if s.Executed == nil {
		return 0, errors.New("GET /stats: no payments_executed")
	}
	return *s.Executed, nil
}

// short returns the first 8 characters of a key, enough to tell keys apart
// in a table.
func short(key string) string {
	if key == "" {
		return "-"
	}
	if len(key) > 8 {
		return key[:8]
	}
	return key
}
