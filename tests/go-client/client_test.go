// The official Go client (github.com/apache/pulsar-client-go) against a
// running `vela standalone` (tests/go_client.sh starts it and sets
// VELA_PULSAR_URL, VELA_HTTP_URL and VELA_LISTEN_PORT): non-persistent
// topics, a pattern consumer finding new topics, topic termination and
// advertised listeners.
//
// The Go client has no topic list watcher (no WATCH_TOPIC_LIST in its
// source up to v0.19.0): its pattern consumer polls GET_TOPICS_OF_NAMESPACE
// every AutoDiscoveryPeriod, which is what is tested here; the watcher
// itself is tested with the Java client (tests/java-admin, ClientCheck).
// Nor does it handle REACHED_END_OF_TOPIC (it closes its connection on an
// unknown command): the broker never sends it one, checked below.
package goclient

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"
)

func env(t *testing.T, name string) string {
	t.Helper()
	value := os.Getenv(name)
	if value == "" {
		t.Fatalf("%s is not set (run tests/go_client.sh)", name)
	}
	return value
}

func newClient(t *testing.T, options pulsar.ClientOptions) pulsar.Client {
	t.Helper()
	if options.URL == "" {
		options.URL = env(t, "VELA_PULSAR_URL")
	}
	options.OperationTimeout = 10 * time.Second
	options.Logger = log.DefaultNopLogger()
	client, err := pulsar.NewClient(options)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	return client
}

func unique(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano())
}

func receive(t *testing.T, consumer pulsar.Consumer, within time.Duration) pulsar.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	message, err := consumer.Receive(ctx)
	if err != nil {
		t.Fatalf("no message within %v: %v", within, err)
	}
	return message
}

func httpDo(t *testing.T, method, path string, header map[string]string) (int, []byte) {
	t.Helper()
	request, err := http.NewRequest(method, env(t, "VELA_HTTP_URL")+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for key, value := range header {
		request.Header.Set(key, value)
	}
	response, err := http.DefaultClient.Do(request)
	if err != nil {
		t.Fatal(err)
	}
	defer response.Body.Close()
	body := make([]byte, 0, 1024)
	buffer := make([]byte, 4096)
	for {
		n, err := response.Body.Read(buffer)
		body = append(body, buffer[:n]...)
		if err != nil {
			break
		}
	}
	return response.StatusCode, body
}

func TestNonPersistentFanOutAndReceipts(t *testing.T) {
	client := newClient(t, pulsar.ClientOptions{})
	topic := "non-persistent://public/default/" + unique("go-np")
	var consumers []pulsar.Consumer
	for i := 0; i < 2; i++ {
		consumer, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: fmt.Sprintf("s%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		defer consumer.Close()
		consumers = append(consumers, consumer)
	}
	producer, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	for i := 0; i < 10; i++ {
		id, err := producer.Send(context.Background(), &pulsar.ProducerMessage{Payload: []byte(fmt.Sprint(i))})
		if err != nil {
			t.Fatal(err)
		}
		if id.LedgerID() != 0 || id.EntryID() != 0 {
			t.Fatalf("receipt %v, Pulsar answers (0, 0) on non-persistent topics", id)
		}
	}
	for _, consumer := range consumers {
		for i := 0; i < 10; i++ {
			message := receive(t, consumer, 5*time.Second)
			if string(message.Payload()) != fmt.Sprint(i) {
				t.Fatalf("message %d is %q", i, message.Payload())
			}
			consumer.Ack(message)
		}
	}
}

func TestPatternConsumerFindsNewTopics(t *testing.T) {
	client := newClient(t, pulsar.ClientOptions{})
	prefix := unique("go-pattern")
	consumer, err := client.Subscribe(pulsar.ConsumerOptions{
		TopicsPattern:               "persistent://public/default/" + prefix + "-.*",
		SubscriptionName:            "pattern",
		AutoDiscoveryPeriod:         time.Second,
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	producer, err := client.CreateProducer(pulsar.ProducerOptions{Topic: "persistent://public/default/" + prefix + "-new"})
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	if _, err := producer.Send(context.Background(), &pulsar.ProducerMessage{Payload: []byte("found")}); err != nil {
		t.Fatal(err)
	}
	if message := receive(t, consumer, 20*time.Second); string(message.Payload()) != "found" {
		t.Fatalf("got %q", message.Payload())
	}
}

func TestTerminatedTopicRefusesProducers(t *testing.T) {
	client := newClient(t, pulsar.ClientOptions{})
	local := unique("go-term")
	topic := "persistent://public/default/" + local
	producer, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if _, err := producer.Send(context.Background(), &pulsar.ProducerMessage{Payload: []byte("m")}); err != nil {
			t.Fatal(err)
		}
	}
	producer.Close()
	status, body := httpDo(t, "POST", "/admin/v2/persistent/public/default/"+local+"/terminate", nil)
	if status != 200 {
		t.Fatalf("terminate: %d %s", status, body)
	}
	var last struct {
		LedgerID int64 `json:"ledgerId"`
		EntryID  int64 `json:"entryId"`
	}
	if err := json.Unmarshal(body, &last); err != nil || last.EntryID != 1 {
		t.Fatalf("terminate answered %s (%v)", body, err)
	}
	if _, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic}); err == nil ||
		!strings.Contains(err.Error(), "TopicTerminated") {
		t.Fatalf("a producer of a terminated topic: %v", err)
	}
	consumer, err := client.Subscribe(pulsar.ConsumerOptions{
		Topic: topic, SubscriptionName: "reader", SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	for i := 0; i < 2; i++ {
		consumer.Ack(receive(t, consumer, 5*time.Second))
	}
	// Past the end: had the broker sent REACHED_END_OF_TOPIC, the Go client
	// would have closed its connection; the consumer is still attached.
	time.Sleep(1500 * time.Millisecond)
	status, body = httpDo(t, "GET", "/admin/v2/persistent/public/default/"+local+"/stats", nil)
	if status != 200 || !strings.Contains(string(body), `"consumerName"`) {
		t.Fatalf("stats: %d %s", status, body)
	}
	var stats struct {
		Subscriptions map[string]struct {
			Consumers []struct {
				Address string `json:"address"`
			} `json:"consumers"`
		} `json:"subscriptions"`
	}
	if err := json.Unmarshal(body, &stats); err != nil {
		t.Fatal(err)
	}
	if n := len(stats.Subscriptions["reader"].Consumers); n != 1 {
		t.Fatalf("%d consumers attached", n)
	}
}

func TestListenerNames(t *testing.T) {
	port := env(t, "VELA_LISTEN_PORT")
	external := newClient(t, pulsar.ClientOptions{ListenerName: "external"})
	topic := "persistent://public/default/" + unique("go-listener")
	consumer, err := external.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s"})
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	producer, err := external.CreateProducer(pulsar.ProducerOptions{Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	if _, err := producer.Send(context.Background(), &pulsar.ProducerMessage{Payload: []byte("via localhost")}); err != nil {
		t.Fatal(err)
	}
	receive(t, consumer, 5*time.Second)

	status, body := httpDo(t, "GET", "/lookup/v2/topic/persistent/public/default/x", map[string]string{
		"X-Pulsar-ListenerName": "external",
	})
	if status != 200 || !strings.Contains(string(body), "pulsar://localhost:"+port) {
		t.Fatalf("HTTP lookup by header: %d %s", status, body)
	}

	unknown := newClient(t, pulsar.ClientOptions{ListenerName: "nope"})
	if _, err := unknown.CreateProducer(pulsar.ProducerOptions{Topic: topic}); err == nil {
		t.Fatal("a lookup through an unknown listener succeeded")
	}
}
