package idemprom_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/go-idempotency/idempotency"
	idemprom "github.com/go-idempotency/idempotency/adapters/prometheus"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

func ExampleObserver() {
	reg := prometheus.NewRegistry()
	store := memstore.New()
	defer store.Close()
	idem := idempotency.New(store, idempotency.WithObserver(idemprom.Observer(reg)))

	mux := http.NewServeMux()
	mux.Handle("POST /charges", idem(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{EnableOpenMetrics: true}))

	// A charge and its retry: executed once, replayed once.
	for range 2 {
		r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":1999}`))
		r.Header.Set("Idempotency-Key", "order-42")
		mux.ServeHTTP(httptest.NewRecorder(), r)
	}

	scrape := httptest.NewRecorder()
	mux.ServeHTTP(scrape, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	lines := bufio.NewScanner(scrape.Body)
	for lines.Scan() {
		if strings.HasPrefix(lines.Text(), "idempotency_requests_total") {
			fmt.Println(lines.Text())
		}
	}
	// Output:
	// idempotency_requests_total{method="POST",outcome="executed",route="POST /charges"} 1
	// idempotency_requests_total{method="POST",outcome="replayed",route="POST /charges"} 1
}

func ExampleWithNamespace() {
	reg := prometheus.NewRegistry()
	observe := idemprom.Observer(reg, idemprom.WithNamespace("payments"),
		idemprom.WithConstLabels(prometheus.Labels{"store": "redis"}))

	// The observer of a middleware reports a replay.
	observe(context.Background(), idempotency.Event{
		Kind: idempotency.EventReplayed, Route: "POST /charges", Method: http.MethodPost,
		Duration: 2 * time.Millisecond, Final: true,
	})

	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		fmt.Println(mf.GetName())
	}
	// Output:
	// payments_idempotency_request_duration_seconds
	// payments_idempotency_requests_total
}

func ExampleRelayObserver() {
	reg := prometheus.NewRegistry()
	observe := idemprom.RelayObserver(reg)
	// A service passes observe to relay.New with relay.WithObserver; here
	// it is given what a relay named "payments-relay" reports for a
	// message published on the second attempt.
	for _, e := range []relay.Event{
		{Kind: relay.EventClaimed, Count: 1},
		{Kind: relay.EventRetried, Topic: "payments.captured", Attempt: 1, Backoff: time.Second},
		{Kind: relay.EventClaimed, Count: 1},
		{Kind: relay.EventPublished, Topic: "payments.captured", Attempt: 2,
			Duration: 4 * time.Millisecond, Age: 1200 * time.Millisecond},
		{Kind: relay.EventLag},
	} {
		e.Relay = "payments-relay"
		observe(context.Background(), e)
	}

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	scrape := httptest.NewRecorder()
	mux.ServeHTTP(scrape, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	lines := bufio.NewScanner(scrape.Body)
	for lines.Scan() {
		line := lines.Text()
		name, _, _ := strings.Cut(line, "{")
		if strings.HasSuffix(name, "_total") || name == "idempotency_outbox_lag_seconds" ||
			name == "idempotency_outbox_age_seconds_count" {
			fmt.Println(line)
		}
	}
	// Output:
	// idempotency_outbox_age_seconds_count{relay="payments-relay",topic="payments.captured"} 1
	// idempotency_outbox_claimed_total{relay="payments-relay"} 2
	// idempotency_outbox_lag_seconds{relay="payments-relay"} 0
	// idempotency_outbox_published_total{relay="payments-relay",topic="payments.captured"} 1
	// idempotency_outbox_retried_total{relay="payments-relay",topic="payments.captured"} 1
}
