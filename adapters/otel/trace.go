package idemotel

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/go-idempotency/idempotency/outbox"
)

// SpanPublishPrefix starts the name of Sink's spans: "publish <topic>".
const SpanPublishPrefix = "publish "

// TraceHeaders returns the trace context of ctx's span as message headers,
// injected with the propagator of WithPropagator: by default the W3C
// traceparent and, when the span has one, tracestate. A handler puts them
// in the headers of the messages it enqueues, so that Sink makes their
// publish part of the request's trace:
//
//	outbox.Enqueue(ctx, outbox.Message{
//		Topic:   "payments.captured",
//		Payload: body,
//		Headers: idemotel.TraceHeaders(ctx),
//	})
//
// The map is new and never nil, so the handler can add headers of its
// own to it. It is empty when ctx has no valid span context.
func TraceHeaders(ctx context.Context, opts ...Option) map[string]string {
	h := headerCarrier{}
	newConfig(opts).propagator.Inject(ctx, h)
	return h
}

// Sink returns next with a producer span around each of its publishes,
// started with the tracer provider of WithTracerProvider (WithPropagator
// and WithTopicPattern apply too). The span is the child of the trace
// context in the envelope's headers (put there by TraceHeaders at enqueue),
// extracted with the propagator, so the publish is part of the request's
// trace, however long after the request the relay publishes it; without
// one in the headers, it is the child of ctx's span, if any. It is named
// "publish <topic>" and has the attributes:
//
//	messaging.operation.name       publish
//	messaging.operation.type       send
//	messaging.destination.name     Envelope.Topic
//	messaging.destination.template what WithTopicPattern makes of it (when set)
//	messaging.message.id           Envelope.ID
//	messaging.message.body.size    len(Envelope.Payload)
//	idempotency.outbox.attempt     Envelope.Attempt
//
// next gets the envelope with a copy of its headers in which the producer
// span's trace context replaced the one extracted, so that a consumer
// continues the trace from the publish; the caller's map is never
// modified. Header names are matched whatever their case. A publish that
// fails (or panics, which Sink records and passes on) records the error,
// sets the span's status to Error and error.type (see ErrorType). Every
// publish goes to next, with its error returned unchanged.
//
// The message ID holds the record's storage key, a hash of scope and key,
// never the client's key: the same the sink gives the broker for
// deduplication (JetStream's Nats-Msg-Id). It is on the spans, never on
// the metrics.
//
// Sink panics when next is nil.
func Sink(next outbox.Sink, opts ...Option) outbox.Sink {
	if next == nil {
		panic("idemotel: Sink needs a Sink")
	}
	cfg := newConfig(opts)
	return &sink{next: next, tracer: cfg.tracerProvider.Tracer(ScopeName), propagator: cfg.propagator, topic: cfg.topic}
}

type sink struct {
	next       outbox.Sink
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	topic      func(string) string
}

func (s *sink) Publish(ctx context.Context, e outbox.Envelope) (err error) {
	ctx = s.propagator.Extract(ctx, headerCarrier(e.Headers))
	name := validText(e.Topic) // the destination; the span's name unless a pattern is set
	attrs := make([]attribute.KeyValue, 0, 7)
	attrs = append(attrs,
		OperationNameKey.String("publish"),
		OperationTypeKey.String("send"),
		DestinationKey.String(name),
		MessageIDKey.String(validText(e.ID)),
		MessageBodySizeKey.Int(len(e.Payload)),
		AttemptKey.Int(e.Attempt),
	)
	if s.topic != nil {
		name = topicValue(s.topic, e.Topic)
		attrs = append(attrs, DestinationTemplateKey.String(name))
	}
	ctx, span := s.tracer.Start(ctx, SpanPublishPrefix+name,
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	defer func() {
		if v := recover(); v != nil {
			end(span, fmt.Errorf("the sink panicked: %v", v))
			panic(v)
		}
		end(span, err)
	}()

	headers := make(headerCarrier, len(e.Headers)+2)
	maps.Copy(headers, e.Headers)
	for _, f := range s.propagator.Fields() { // what Inject writes: none of the extracted left over
		headers.del(f)
	}
	s.propagator.Inject(ctx, headers)
	e.Headers = headers
	return s.next.Publish(ctx, e)
}

// headerCarrier is a message's headers as a propagation.TextMapCarrier
// whose names match whatever their case: a header written Traceparent is
// found, and replaced rather than joined by a second traceparent.
// Brokers differ in how they keep a header name's case.
type headerCarrier map[string]string

// Get returns the value of key, or of a name equal to it but for case.
func (c headerCarrier) Get(key string) string {
	if v, ok := c[key]; ok {
		return v
	}
	for k, v := range c {
		if strings.EqualFold(k, key) {
			return v
		}
	}
	return ""
}

// Set sets key to value, removing the names equal to it but for case.
func (c headerCarrier) Set(key, value string) {
	c.del(key)
	c[key] = value
}

// del removes key and the names equal to it but for case.
func (c headerCarrier) del(key string) {
	for k := range c {
		if strings.EqualFold(k, key) {
			delete(c, k)
		}
	}
}

// Keys returns the names of the headers.
func (c headerCarrier) Keys() []string {
	return slices.Collect(maps.Keys(c))
}
