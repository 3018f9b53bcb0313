package idemotel_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"testing"
	"time"

	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	idemotel "github.com/go-idempotency/idempotency/adapters/otel"
	"github.com/go-idempotency/idempotency/outbox"
)

// innerSink records what the sink it wraps was given, and fails with err.
type innerSink struct {
	calls   int
	ctx     context.Context
	env     outbox.Envelope
	err     error
	panicky bool
}

func (s *innerSink) Publish(ctx context.Context, e outbox.Envelope) error {
	s.calls++
	s.ctx, s.env = ctx, e
	if s.panicky {
		panic("broker client bug")
	}
	return s.err
}

func newTracer() (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	sr := tracetest.NewSpanRecorder()
	return sr, sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
}

// extract returns the span context that the W3C headers h carry.
func extract(h map[string]string) trace.SpanContext {
	return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(h)))
}

// onlySpan returns the one span of sr named name.
func onlySpan(t *testing.T, sr *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans named %q among %v, want 1", len(found), name, names(sr.Ended()))
	}
	return found[0]
}

// TestTraceHeadersToSink follows a request's trace from the handler's
// enqueue to the broker: TraceHeaders in the request's span, the headers
// as the relay hands them over in the envelope, and Sink, whose producer
// span is in the request's trace, a child of the request's span, and whose
// trace context the wrapped sink gets in a copy of the headers.
func TestTraceHeadersToSink(t *testing.T) {
	sr, tp := newTracer()
	ctx, request := tp.Tracer("server").Start(context.Background(), "POST /charges")
	headers := idemotel.TraceHeaders(ctx)
	headers["content-type"] = "application/json" // the handler's own
	request.End()

	want := fmt.Sprintf("00-%s-%s-01", request.SpanContext().TraceID(), request.SpanContext().SpanID())
	if headers["traceparent"] != want {
		t.Fatalf("TraceHeaders: traceparent %q, want %q", headers["traceparent"], want)
	}
	if _, ok := headers["tracestate"]; ok {
		t.Errorf("TraceHeaders: tracestate %q for a span without one", headers["tracestate"])
	}
	original := maps.Clone(headers)

	// The relay publishes later, with a context of its own.
	inner := &innerSink{}
	env := outbox.Envelope{ID: "c2hhMjU2a2V5/1", Topic: "payments.captured", Payload: []byte(`{"amount":1999}`),
		Headers: headers, OrderingKey: "pay_1", Attempt: 2, EnqueuedAt: time.Now()}
	if err := idemotel.Sink(inner, idemotel.WithTracerProvider(tp)).Publish(context.Background(), env); err != nil {
		t.Fatal(err)
	}

	publish := onlySpan(t, sr, "publish payments.captured")
	sc := publish.SpanContext()
	if publish.SpanKind() != trace.SpanKindProducer {
		t.Errorf("kind %v, want producer", publish.SpanKind())
	}
	if sc.TraceID() != request.SpanContext().TraceID() {
		t.Errorf("trace %s, the request's %s", sc.TraceID(), request.SpanContext().TraceID())
	}
	if p := publish.Parent(); p.SpanID() != request.SpanContext().SpanID() || !p.IsRemote() {
		t.Errorf("parent %s (remote %v), want the request's span %s, remote", p.SpanID(), p.IsRemote(), request.SpanContext().SpanID())
	}
	expectAttr(t, publish, idemotel.MessageIDKey, "c2hhMjU2a2V5/1")
	expectAttr(t, publish, idemotel.DestinationKey, "payments.captured")
	expectAttr(t, publish, idemotel.AttemptKey, int64(2))
	expectAttr(t, publish, idemotel.MessageBodySizeKey, int64(len(`{"amount":1999}`)))
	expectAttr(t, publish, idemotel.OperationNameKey, "publish")
	expectAttr(t, publish, idemotel.OperationTypeKey, "send")
	if _, ok := attrs(publish)[idemotel.DestinationTemplateKey]; ok {
		t.Error("a destination template without WithTopicPattern")
	}
	if st := publish.Status(); st.Code != codes.Unset {
		t.Errorf("status %v, want unset", st)
	}

	// The wrapped sink: the producer span in its context, and its trace
	// context in the headers, with the handler's own header kept.
	if inner.calls != 1 {
		t.Fatalf("the wrapped sink was called %d times", inner.calls)
	}
	if got := trace.SpanContextFromContext(inner.ctx); got.SpanID() != sc.SpanID() {
		t.Errorf("the wrapped sink's context has span %s, want the producer span %s", got.SpanID(), sc.SpanID())
	}
	got := extract(inner.env.Headers)
	if got.TraceID() != sc.TraceID() || got.SpanID() != sc.SpanID() {
		t.Errorf("the wrapped sink's traceparent %q, want the producer span's %s-%s", inner.env.Headers["traceparent"], sc.TraceID(), sc.SpanID())
	}
	if want := fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID()); inner.env.Headers["traceparent"] != want {
		t.Errorf("the wrapped sink's traceparent %q, want %q", inner.env.Headers["traceparent"], want)
	}
	if inner.env.Headers["content-type"] != "application/json" || len(inner.env.Headers) != 2 {
		t.Errorf("the wrapped sink's headers %v, want traceparent and content-type", inner.env.Headers)
	}
	// Everything else of the envelope as the relay gave it.
	sent := inner.env
	sent.Headers = env.Headers
	if !reflect.DeepEqual(sent, env) {
		t.Errorf("the wrapped sink got %+v, want %+v", sent, env)
	}

	// The caller's map is untouched.
	if !reflect.DeepEqual(env.Headers, original) || !reflect.DeepEqual(headers, original) {
		t.Errorf("the envelope's headers changed: %v, were %v", env.Headers, original)
	}
}

// TestSinkError checks that a failed publish is returned unchanged and
// marks the producer span as an error.
func TestSinkError(t *testing.T) {
	sr, tp := newTracer()
	errBroker := errors.New("nats: no responders available for request")
	for _, tc := range []struct {
		err       error
		errorType string
	}{
		{errBroker, "_OTHER"},
		{fmt.Errorf("publish: %w", context.DeadlineExceeded), "deadline_exceeded"},
	} {
		inner := &innerSink{err: tc.err}
		err := idemotel.Sink(inner, idemotel.WithTracerProvider(tp)).Publish(context.Background(),
			outbox.Envelope{ID: "k/1", Topic: "t." + tc.errorType, Attempt: 1})
		if err != tc.err {
			t.Errorf("Publish returned %v, want %v itself", err, tc.err)
		}
		s := onlySpan(t, sr, "publish t."+tc.errorType)
		if st := s.Status(); st.Code != codes.Error || st.Description != tc.err.Error() {
			t.Errorf("status %v, want Error %q", st, tc.err)
		}
		expectAttr(t, s, idemotel.ErrorTypeKey, tc.errorType)
		if ev := s.Events(); len(ev) != 1 || ev[0].Name != "exception" {
			t.Errorf("events %v, want the recorded error", ev)
		}
	}
}

// TestSinkPanic checks that a panicking sink's span is ended as an error
// and the panic passed on to the relay, which recovers it.
func TestSinkPanic(t *testing.T) {
	sr, tp := newTracer()
	func() {
		defer func() {
			if v := recover(); v != "broker client bug" {
				t.Errorf("recovered %v, want the sink's panic", v)
			}
		}()
		idemotel.Sink(&innerSink{panicky: true}, idemotel.WithTracerProvider(tp)).Publish(context.Background(), outbox.Envelope{ID: "k/1", Topic: "t"})
	}()
	s := onlySpan(t, sr, "publish t")
	if st := s.Status(); st.Code != codes.Error || st.Description != "the sink panicked: broker client bug" {
		t.Errorf("status %v, want Error for the panic", st)
	}
}

// TestSinkWithoutTraceContext checks a message enqueued without trace
// headers: the producer span is the child of the relay's context's span
// (a root without one), and the wrapped sink still gets its trace context,
// in a new map.
func TestSinkWithoutTraceContext(t *testing.T) {
	sr, tp := newTracer()
	inner := &innerSink{}
	s := idemotel.Sink(inner, idemotel.WithTracerProvider(tp))
	if err := s.Publish(context.Background(), outbox.Envelope{ID: "k/1", Topic: "root"}); err != nil {
		t.Fatal(err)
	}
	root := onlySpan(t, sr, "publish root")
	if root.Parent().IsValid() {
		t.Errorf("parent %v, want none", root.Parent())
	}
	if got := extract(inner.env.Headers); got.SpanID() != root.SpanContext().SpanID() {
		t.Errorf("headers %v, want the producer span's trace context", inner.env.Headers)
	}

	ctx, parent := tp.Tracer("relay").Start(context.Background(), "relay round")
	if err := s.Publish(ctx, outbox.Envelope{ID: "k/2", Topic: "child", Headers: map[string]string{"x": "y"}}); err != nil {
		t.Fatal(err)
	}
	parent.End()
	if got := onlySpan(t, sr, "publish child").Parent(); got.SpanID() != parent.SpanContext().SpanID() {
		t.Errorf("parent %s, want the context's span %s", got.SpanID(), parent.SpanContext().SpanID())
	}
}

// TestSinkHeaderCase checks that the trace context is found whatever the
// case of the header names, and replaced rather than duplicated; and that
// tracestate follows the trace.
func TestSinkHeaderCase(t *testing.T) {
	sr, tp := newTracer()
	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	spanID, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	headers := map[string]string{
		"Traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"TraceState":  "congo=t61rcWkgMzE",
		"X-Tenant":    "acme",
	}
	original := maps.Clone(headers)
	inner := &innerSink{}
	if err := idemotel.Sink(inner, idemotel.WithTracerProvider(tp)).Publish(context.Background(),
		outbox.Envelope{ID: "k/1", Topic: "t", Headers: headers}); err != nil {
		t.Fatal(err)
	}
	s := onlySpan(t, sr, "publish t")
	if p := s.Parent(); p.TraceID() != traceID || p.SpanID() != spanID {
		t.Errorf("parent %s-%s, want %s-%s", p.TraceID(), p.SpanID(), traceID, spanID)
	}
	want := map[string]string{
		"traceparent": fmt.Sprintf("00-%s-%s-01", traceID, s.SpanContext().SpanID()),
		"tracestate":  "congo=t61rcWkgMzE",
		"X-Tenant":    "acme",
	}
	if !reflect.DeepEqual(inner.env.Headers, want) {
		t.Errorf("the wrapped sink's headers %v, want %v", inner.env.Headers, want)
	}
	if !reflect.DeepEqual(headers, original) {
		t.Errorf("the envelope's headers changed: %v, were %v", headers, original)
	}
}

// TestTraceHeaders checks TraceHeaders without a span, with a tracestate,
// and with another propagator, which Sink uses too.
func TestTraceHeaders(t *testing.T) {
	if h := idemotel.TraceHeaders(context.Background()); h == nil || len(h) != 0 {
		t.Errorf("without a span: %v, want an empty map", h)
	}

	state, _ := trace.ParseTraceState("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	spanID, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	remote := trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID, SpanID: spanID, TraceState: state, Remote: true})
	h := idemotel.TraceHeaders(trace.ContextWithRemoteSpanContext(context.Background(), remote))
	want := map[string]string{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", // not sampled
		"tracestate":  "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
	}
	if !reflect.DeepEqual(h, want) {
		t.Errorf("TraceHeaders %v, want %v", h, want)
	}

	// Trace context and baggage, from the request to the wrapped sink.
	sr, tp := newTracer()
	prop := idemotel.WithPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	member, _ := baggage.NewMember("tenant", "acme")
	bag, _ := baggage.New(member)
	ctx, request := tp.Tracer("server").Start(baggage.ContextWithBaggage(context.Background(), bag), "request")
	h = idemotel.TraceHeaders(ctx, prop)
	request.End()
	if h["baggage"] != "tenant=acme" || h["traceparent"] == "" {
		t.Fatalf("TraceHeaders with baggage: %v", h)
	}
	inner := &innerSink{}
	if err := idemotel.Sink(inner, idemotel.WithTracerProvider(tp), prop).Publish(context.Background(),
		outbox.Envelope{ID: "k/1", Topic: "t", Headers: h}); err != nil {
		t.Fatal(err)
	}
	if got := onlySpan(t, sr, "publish t").Parent().SpanID(); got != request.SpanContext().SpanID() {
		t.Errorf("parent %s, want the request's span", got)
	}
	if inner.env.Headers["baggage"] != "tenant=acme" || baggage.FromContext(inner.ctx).Member("tenant").Value() != "acme" {
		t.Errorf("the wrapped sink lost the baggage: %v", inner.env.Headers)
	}
}

// TestSinkTopicPattern checks that WithTopicPattern names the span by the
// pattern, keeping the topic as the destination.
func TestSinkTopicPattern(t *testing.T) {
	sr, tp := newTracer()
	s := idemotel.Sink(&innerSink{}, idemotel.WithTracerProvider(tp),
		idemotel.WithTopicPattern(func(string) string { return "orders.*.created" }))
	if err := s.Publish(context.Background(), outbox.Envelope{ID: "k/1", Topic: "orders.8841.created"}); err != nil {
		t.Fatal(err)
	}
	span := onlySpan(t, sr, "publish orders.*.created")
	expectAttr(t, span, idemotel.DestinationKey, "orders.8841.created")
	expectAttr(t, span, idemotel.DestinationTemplateKey, "orders.*.created")
}
