package idemotel_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/go-idempotency/idempotency"
	idemotel "github.com/go-idempotency/idempotency/adapters/otel"
	"github.com/go-idempotency/idempotency/memstore"
)

func Example() {
	// In-memory providers, to print what was recorded. A service sets its
	// exporting providers with otel.SetTracerProvider and
	// otel.SetMeterProvider and passes no options.
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))

	mem := memstore.New()
	defer mem.Close()
	store := idemotel.Store(mem, idemotel.WithTracerProvider(tp))
	idem := idempotency.New(store, idempotency.WithObserver(idemotel.Observer(idemotel.WithMeterProvider(mp))))
	mux := http.NewServeMux()
	mux.Handle("POST /charges", idem(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))

	// A charge and its retry, each in a span of its own as an HTTP
	// server's instrumentation starts it.
	for range 2 {
		ctx, span := tp.Tracer("server").Start(context.Background(), "POST /charges")
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/charges", strings.NewReader(`{"amount":1999}`))
		r.Header.Set("Idempotency-Key", "order-42")
		mux.ServeHTTP(httptest.NewRecorder(), r)
		span.End()
	}

	for _, s := range spans.Ended() {
		if !s.Parent().IsValid() {
			fmt.Println(s.Name())
			continue
		}
		fmt.Print("  ", s.Name())
		for _, kv := range s.Attributes() {
			if kv.Key == idemotel.AcquireOutcomeKey {
				fmt.Print(" ", kv.Value.AsString())
			}
		}
		fmt.Println()
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		fmt.Println(err)
	}
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "idempotency.requests" {
				continue
			}
			for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
				outcome, _ := p.Attributes.Value(idemotel.OutcomeKey)
				route, _ := p.Attributes.Value(idemotel.RouteKey)
				lines = append(lines, fmt.Sprintf("%s route=%q outcome=%s: %d", m.Name, route.AsString(), outcome.AsString(), p.Value))
			}
		}
	}
	sort.Strings(lines)
	fmt.Println(strings.Join(lines, "\n"))
	// Output:
	//   idempotency.acquire acquired
	//   idempotency.complete
	// POST /charges
	//   idempotency.acquire completed
	// POST /charges
	// idempotency.requests route="POST /charges" outcome=executed: 1
	// idempotency.requests route="POST /charges" outcome=replayed: 1
}

func ExampleErrorType() {
	err := fmt.Errorf("complete: %w", idempotency.ErrLeaseLost)
	fmt.Println(idemotel.ErrorType(err))
	fmt.Println(idemotel.ErrorType(context.DeadlineExceeded))
	fmt.Println(idemotel.ErrorType(errors.New("dial tcp: connection refused")))
	// Output:
	// lease_lost
	// deadline_exceeded
	// _OTHER
}
