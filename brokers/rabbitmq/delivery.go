package idemrabbit

import amqp "github.com/rabbitmq/amqp091-go"

// DeliveryCountHeader is the header in which a quorum queue counts the
// earlier deliveries of a message it delivers again. It is absent on a
// first delivery, and on every delivery of a classic queue.
const DeliveryCountHeader = "x-delivery-count"

// deliveryNumber returns which delivery of its message d is, counting from
// 1: its x-delivery-count plus one, or, without the header, 1 for a first
// delivery and 2 for a redelivery (a classic queue does not say more).
func deliveryNumber(d amqp.Delivery) int {
	if n, ok := headerInt(d.Headers[DeliveryCountHeader]); ok && n >= 0 {
		return int(min(n, 1<<30)) + 1
	}
	if d.Redelivered {
		return 2
	}
	return 1
}

// headerInt returns the integer an AMQP header value holds (RabbitMQ sends
// x-delivery-count as a long long, which amqp091-go reads as an int64).
func headerInt(v any) (int64, bool) {
	switch n := v.(type) {
	case int64:
		return n, true
	case int32:
		return int64(n), true
	case int16:
		return int64(n), true
	case int8:
		return int64(n), true
	case int:
		return int64(n), true
	case uint64:
		return int64(min(n, 1<<62)), true
	case uint32:
		return int64(n), true
	case uint16:
		return int64(n), true
	case uint8:
		return int64(n), true
	}
	return 0, false
}
