package idemotel_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/go-idempotency/idempotency"
	idemotel "github.com/go-idempotency/idempotency/adapters/otel"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/relay"
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

func ExampleSink() {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))

	// In the handler, in the request's span: the message carries the
	// request's trace context (outbox.Message.Headers).
	ctx, request := tp.Tracer("server").Start(context.Background(), "POST /charges")
	msg := outbox.Message{Topic: "payments.captured", Payload: []byte(`{"amount":1999}`), Headers: idemotel.TraceHeaders(ctx)}
	request.End()

	// In the relay, later: the broker's sink wrapped by Sink
	// (relay.New(pool, idemotel.Sink(sink))) gets the envelope.
	broker := outbox.SinkFunc(func(ctx context.Context, e outbox.Envelope) error {
		// ctx has the publish span; the headers name it, for the consumer.
		sent := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier(e.Headers)))
		fmt.Println("the broker's traceparent names the publish span:", sent.SpanID() == trace.SpanContextFromContext(ctx).SpanID())
		return nil
	})
	sink := idemotel.Sink(broker, idemotel.WithTracerProvider(tp))
	sink.Publish(context.Background(), outbox.Envelope{ID: "c2hh/1", Topic: msg.Topic, Payload: msg.Payload, Headers: msg.Headers, Attempt: 1})

	for _, s := range spans.Ended() {
		fmt.Printf("%s (%s): in the request's trace %v, its child %v\n", s.Name(), s.SpanKind(),
			s.SpanContext().TraceID() == request.SpanContext().TraceID(), s.Parent().SpanID() == request.SpanContext().SpanID())
	}
	// Output:
	// the broker's traceparent names the publish span: true
	// POST /charges (internal): in the request's trace true, its child false
	// publish payments.captured (producer): in the request's trace true, its child true
}

func ExampleRelayObserver() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	observe := idemotel.RelayObserver(idemotel.WithMeterProvider(mp))
	// A service passes observe to relay.New with relay.WithObserver; here
	// it is given what a relay named "payments-relay" reports for a
	// message published on the second attempt.
	for _, e := range []relay.Event{
		{Kind: relay.EventRetried, Topic: "payments.captured", Attempt: 1, Backoff: time.Second},
		{Kind: relay.EventPublished, Topic: "payments.captured", Attempt: 2, Duration: 4 * time.Millisecond, Age: 1200 * time.Millisecond},
		{Kind: relay.EventLag},
	} {
		e.Relay = "payments-relay"
		observe(context.Background(), e)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		fmt.Println(err)
	}
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range data.DataPoints {
					lines = append(lines, fmt.Sprintf("%s %s: %d", m.Name, p.Attributes.Encoded(attribute.DefaultEncoder()), p.Value))
				}
			case metricdata.Gauge[float64]:
				for _, p := range data.DataPoints {
					lines = append(lines, fmt.Sprintf("%s %s: %v%s", m.Name, p.Attributes.Encoded(attribute.DefaultEncoder()), p.Value, m.Unit))
				}
			case metricdata.Histogram[float64]:
				for _, p := range data.DataPoints {
					lines = append(lines, fmt.Sprintf("%s %s: %v%s", m.Name, p.Attributes.Encoded(attribute.DefaultEncoder()), p.Sum, m.Unit))
				}
			}
		}
	}
	sort.Strings(lines)
	fmt.Println(strings.Join(lines, "\n"))
	// Output:
	// idempotency.outbox.age idempotency.outbox.relay=payments-relay,messaging.destination.name=payments.captured: 1.2s
	// idempotency.outbox.lag idempotency.outbox.relay=payments-relay: 0s
	// idempotency.outbox.publish.duration idempotency.outbox.relay=payments-relay,messaging.destination.name=payments.captured: 0.004s
	// idempotency.outbox.published idempotency.outbox.relay=payments-relay,messaging.destination.name=payments.captured: 1
	// idempotency.outbox.retried idempotency.outbox.relay=payments-relay,messaging.destination.name=payments.captured: 1
}
