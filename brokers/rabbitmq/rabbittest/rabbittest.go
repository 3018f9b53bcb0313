// Package rabbittest gives tests a RabbitMQ broker: the one at
// RABBITMQ_URL, or else the local one at DefaultURL (guest/guest), when it
// answers. Each test works on queues of its own, under a random name, that
// it deletes, and never stops or reconfigures that broker: a test that
// stops the broker stops a node of the test binary's own (PrivateNode),
// started from the machine's RabbitMQ installation. A test without a
// broker is skipped with a message saying so, unless
// IDEMPOTENCY_REQUIRE_RABBITMQ=1 (as CI sets it), which fails it instead.
package rabbittest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Environment of the tests.
const (
	// URLEnv names the broker to use.
	URLEnv = "RABBITMQ_URL"
	// RequireEnv, set to 1, fails the tests that need a broker when none
	// answers, instead of skipping them.
	RequireEnv = "IDEMPOTENCY_REQUIRE_RABBITMQ"
	// DefaultURL is the broker used when URLEnv is not set.
	DefaultURL = "amqp://guest:guest@127.0.0.1:5672/"
	// QueuePrefix starts the name of every queue this package declares.
	QueuePrefix = "idemtest."
)

// BrokerURL returns the URL of the broker: URLEnv, or DefaultURL.
func BrokerURL() string {
	if u := os.Getenv(URLEnv); u != "" {
		return u
	}
	return DefaultURL
}

var reachable struct {
	once sync.Once
	err  error
}

// URL returns the broker's URL for t, skipping t (or failing it, under
// RequireEnv=1) unless the broker answers.
func URL(t testing.TB) string {
	t.Helper()
	reachable.once.Do(func() {
		conn, err := amqp.DialConfig(BrokerURL(), amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
		if err == nil {
			conn.Close()
		}
		reachable.err = err
	})
	if reachable.err != nil {
		msg := fmt.Sprintf("no RabbitMQ broker at %s (%v): set %s, or start one (Debian's rabbitmq-server package: rabbitmq-server -detached)", redacted(BrokerURL()), reachable.err, URLEnv)
		if os.Getenv(RequireEnv) == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return BrokerURL()
}

func redacted(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	return "RABBITMQ_URL"
}

// Dial returns a connection to the broker, closed when t ends.
func Dial(t testing.TB) *amqp.Connection {
	t.Helper()
	return dial(t, URL(t))
}

// Channel returns a channel on a connection of its own, closed when t
// ends.
func Channel(t testing.TB) *amqp.Channel {
	t.Helper()
	return channel(t, URL(t))
}

// Queue declares a durable queue of its own for t, under a random name,
// and deletes it when t ends (from a connection of its own, so that it
// goes even after the test's connections broke). It returns the name.
func Queue(t testing.TB) string {
	t.Helper()
	return queue(t, URL(t), nil)
}

func dial(t testing.TB, url string) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func channel(t testing.TB, url string) *amqp.Channel {
	t.Helper()
	ch, err := dial(t, url).Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// queue declares a queue of t's own on the broker at url and deletes it
// when t ends, after ready (when not nil) has made sure the broker runs.
func queue(t testing.TB, url string, ready func() error) string {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	name := QueuePrefix + hex.EncodeToString(b[:])
	ch := channel(t, url)
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if ready != nil {
			if err := ready(); err != nil {
				t.Errorf("deleting queue %s: %v", name, err)
				return
			}
		}
		conn, err := amqp.Dial(url)
		if err != nil {
			t.Errorf("deleting queue %s: %v", name, err)
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err == nil {
			_, err = ch.QueueDelete(name, false, false, false)
		}
		if err != nil {
			t.Errorf("deleting queue %s: %v", name, err)
		}
	})
	return name
}

// Messages returns the number of ready messages in queue.
func Messages(t testing.TB, ch *amqp.Channel, queue string) int {
	t.Helper()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}
