// What a transaction means to readers, through the official Go client:
// sends in a transaction become visible on every topic at its commit and
// never after its abort; acknowledgements in an aborted transaction are
// undone (the subscription gets the messages again).
package goclient

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// How long a consumer is given to show that nothing is delivered.
const nothingWithin = time.Second

func subscribeEarliest(t *testing.T, client pulsar.Client, topic, subscription string) pulsar.Consumer {
	t.Helper()
	consumer, err := client.Subscribe(pulsar.ConsumerOptions{
		Topic: topic, SubscriptionName: subscription,
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest,
	})
	if err != nil {
		t.Fatal(err)
	}
	return consumer
}

func createProducer(t *testing.T, client pulsar.Client, topic string) pulsar.Producer {
	t.Helper()
	// A transactional producer must not time out sends on its own. Batching
	// off: the Go client's batch container (internal/batch_builder.go in
	// v0.19.0, the version used here) sets the transaction id on its reused CommandSend for a
	// transactional batch and never clears it, so later plain batches of the
	// producer go out in that (by then ended) transaction; the broker refuses
	// them ("has been ended", as Pulsar) and the client resends forever.
	producer, err := client.CreateProducer(pulsar.ProducerOptions{
		Topic: topic, SendTimeout: -1, DisableBatching: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(producer.Close)
	return producer
}

func send(t *testing.T, producer pulsar.Producer, payload string, txn pulsar.Transaction) {
	t.Helper()
	message := &pulsar.ProducerMessage{Payload: []byte(payload)}
	if txn != nil {
		message.Transaction = txn
	}
	if _, err := producer.Send(context.Background(), message); err != nil {
		t.Fatalf("send %q: %v", payload, err)
	}
}

func expectNothing(t *testing.T, consumer pulsar.Consumer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), nothingWithin)
	defer cancel()
	message, err := consumer.Receive(ctx)
	if err == nil {
		t.Fatalf("delivered %q, want nothing", message.Payload())
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("receive: %v", err)
	}
}

func expectPayloads(t *testing.T, consumer pulsar.Consumer, want ...string) {
	t.Helper()
	for _, payload := range want {
		message := receive(t, consumer, 10*time.Second)
		if string(message.Payload()) != payload {
			t.Fatalf("received %q, want %q", message.Payload(), payload)
		}
		if err := consumer.Ack(message); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCommitMakesSendsVisibleOnTwoTopicsAtOnce(t *testing.T) {
	client := newClient(t, pulsar.ClientOptions{EnableTransaction: true})
	name := unique("go-txn-two")
	topics := []string{"persistent://public/default/" + name + "-a", "persistent://public/default/" + name + "-b"}
	var consumers []pulsar.Consumer
	var producers []pulsar.Producer
	for _, topic := range topics {
		consumer := subscribeEarliest(t, client, topic, "s")
		defer consumer.Close()
		consumers = append(consumers, consumer)
		producers = append(producers, createProducer(t, client, topic))
	}
	txn, err := client.NewTransaction(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var want [][]string
	for i, producer := range producers {
		var payloads []string
		for j := 0; j < 3; j++ {
			payload := fmt.Sprintf("topic-%d-%d", i, j)
			send(t, producer, payload, txn)
			payloads = append(payloads, payload)
		}
		want = append(want, payloads)
	}
	// Open: stored, but no consumer sees any of it.
	for _, consumer := range consumers {
		expectNothing(t, consumer)
	}
	if err := txn.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i, consumer := range consumers {
		expectPayloads(t, consumer, want[i]...)
	}
}

func TestAbortedSendsAreNeverVisible(t *testing.T) {
	client := newClient(t, pulsar.ClientOptions{EnableTransaction: true})
	topic := "persistent://public/default/" + unique("go-txn-abort")
	consumer := subscribeEarliest(t, client, topic, "s")
	defer consumer.Close()
	producer := createProducer(t, client, topic)

	send(t, producer, "before", nil)
	txn, err := client.NewTransaction(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for j := 0; j < 3; j++ {
		send(t, producer, fmt.Sprintf("aborted-%d", j), txn)
	}
	if err := txn.Abort(context.Background()); err != nil {
		t.Fatal(err)
	}
	send(t, producer, "after", nil)
	// The aborted sends sit between the two plain ones in the log.
	expectPayloads(t, consumer, "before", "after")
	expectNothing(t, consumer)

	// A reader from the start skips them as well.
	reader, err := client.CreateReader(pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.EarliestMessageID()})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	for _, payload := range []string{"before", "after"} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		message, err := reader.Next(ctx)
		cancel()
		if err != nil || string(message.Payload()) != payload {
			t.Fatalf("reader: got %v (%v), want %q", message, err, payload)
		}
	}
	if reader.HasNext() {
		t.Fatal("reader has a message after the last plain one")
	}
}

func TestAbortUndoesTransactionalAcks(t *testing.T) {
	client := newClient(t, pulsar.ClientOptions{EnableTransaction: true})
	topic := "persistent://public/default/" + unique("go-txn-acks")
	consumer := subscribeEarliest(t, client, topic, "s")
	producer := createProducer(t, client, topic)
	for j := 0; j < 3; j++ {
		send(t, producer, fmt.Sprintf("m-%d", j), nil)
	}

	aborted, err := client.NewTransaction(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for j := 0; j < 3; j++ {
		message := receive(t, consumer, 10*time.Second)
		if err := consumer.AckWithTxn(message, aborted); err != nil {
			t.Fatal(err)
		}
	}
	if err := aborted.Abort(context.Background()); err != nil {
		t.Fatal(err)
	}
	consumer.Close()

	// The acks were undone: the subscription still holds every message.
	again := subscribeEarliest(t, client, topic, "s")
	committed, err := client.NewTransaction(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for j := 0; j < 3; j++ {
		message := receive(t, again, 10*time.Second)
		if want := fmt.Sprintf("m-%d", j); string(message.Payload()) != want {
			t.Fatalf("after the abort: received %q, want %q", message.Payload(), want)
		}
		if err := again.AckWithTxn(message, committed); err != nil {
			t.Fatal(err)
		}
	}
	if err := committed.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	again.Close()

	// Committed acks hold: nothing comes back.
	last := subscribeEarliest(t, client, topic, "s")
	defer last.Close()
	expectNothing(t, last)
}
