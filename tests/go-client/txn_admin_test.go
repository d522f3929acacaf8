// The transactions admin API as Pulsar shapes it, driven by the official
// Go client: coordinator stats, the buffer and pending-ack stats of a
// topic, one transaction in each, slow transactions.
package goclient

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

func getJSON(t *testing.T, path string) map[string]any {
	t.Helper()
	status, body := httpDo(t, "GET", path, nil)
	if status != http.StatusOK {
		t.Fatalf("GET %s: HTTP %d: %s", path, status, body)
	}
	var doc map[string]any
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatalf("GET %s: %v: %s", path, err, body)
	}
	return doc
}

func TestTransactionAdminStats(t *testing.T) {
	client := newClient(t, pulsar.ClientOptions{EnableTransaction: true})
	ctx := context.Background()
	name := unique("go-txn-admin")
	topic := "persistent://public/default/" + name
	consumer, err := client.Subscribe(pulsar.ConsumerOptions{
		Topic: topic, SubscriptionName: "s", SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	producer, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	if _, err := producer.Send(ctx, &pulsar.ProducerMessage{Payload: []byte("plain")}); err != nil {
		t.Fatal(err)
	}
	plain := receive(t, consumer, 10*time.Second)

	txn, err := client.NewTransaction(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	id := txn.GetTxnID()
	sent, err := producer.Send(ctx, &pulsar.ProducerMessage{Payload: []byte("in txn"), Transaction: txn})
	if err != nil {
		t.Fatal(err)
	}
	if err := consumer.AckWithTxn(plain, txn); err != nil {
		t.Fatal(err)
	}

	all := getJSON(t, "/admin/v3/transactions/coordinatorStats")
	tc, ok := all[fmt.Sprint(id.MostSigBits)].(map[string]any)
	if !ok || tc["state"] != "Ready" || tc["ongoingTxnSize"].(float64) < 1 {
		t.Fatalf("coordinatorStats: %v", all)
	}
	one := getJSON(t, fmt.Sprintf("/admin/v3/transactions/coordinatorStats?coordinatorId=%d", id.MostSigBits))
	if one["leastSigBits"].(float64) < float64(id.LeastSigBits) || one["lowWaterMark"].(float64) >= float64(id.LeastSigBits) {
		t.Fatalf("coordinatorStats of %d: %v (txn %v)", id.MostSigBits, one, id)
	}

	topicTxnCounts(t, name, 1, 0, 0)

	buffer := getJSON(t, "/admin/v3/transactions/transactionBufferStats/public/default/"+name+"?lowWaterMarks=true")
	if buffer["state"] != "Ready" || buffer["ongoingTxnSize"] != 1.0 || buffer["maxReadPosition"] == nil {
		t.Fatalf("transactionBufferStats: %v", buffer)
	}
	inBuffer := getJSON(t, fmt.Sprintf("/admin/v3/transactions/transactionInBufferStats/public/default/%s/%d/%d",
		name, id.MostSigBits, id.LeastSigBits))
	first := fmt.Sprintf("%d:%d", sent.LedgerID(), sent.EntryID())
	if inBuffer["startPosition"] != first || inBuffer["aborted"] != false {
		t.Fatalf("transactionInBufferStats: %v, want startPosition %s", inBuffer, first)
	}

	pending := getJSON(t, "/admin/v3/transactions/pendingAckStats/public/default/"+name+"/s")
	if pending["state"] != "Ready" || pending["ongoingTxnSize"] != 1.0 {
		t.Fatalf("pendingAckStats: %v", pending)
	}
	inPending := getJSON(t, fmt.Sprintf("/admin/v3/transactions/transactionInPendingAckStats/public/default/%s/s/%d/%d",
		name, id.MostSigBits, id.LeastSigBits))
	if v, present := inPending["cumulativeAckPosition"]; !present || v != nil {
		t.Fatalf("transactionInPendingAckStats: %v", inPending)
	}
	if status, _ := httpDo(t, "GET", "/admin/v3/transactions/pendingAckStats/public/default/"+name+"/nope", nil); status != http.StatusNotFound {
		t.Fatalf("pendingAckStats of a missing subscription: HTTP %d", status)
	}

	slow := getJSON(t, "/admin/v3/transactions/slowTransactions/0")
	key := fmt.Sprintf("(%d,%d)", id.MostSigBits, id.LeastSigBits)
	if meta, ok := slow[key].(map[string]any); !ok || meta["status"] != "OPEN" {
		t.Fatalf("slowTransactions/0 lacks %s: %v", key, slow)
	}
	if slow := getJSON(t, "/admin/v3/transactions/slowTransactions/3600000"); len(slow) != 0 {
		t.Fatalf("slowTransactions/3600000: %v", slow)
	}

	if err := txn.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	buffer = getJSON(t, "/admin/v3/transactions/transactionBufferStats/public/default/"+name)
	if buffer["ongoingTxnSize"] != 0.0 || buffer["lowWaterMarks"] != nil {
		t.Fatalf("transactionBufferStats after the commit: %v", buffer)
	}
	pending = getJSON(t, "/admin/v3/transactions/pendingAckStats/public/default/"+name+"/s")
	if pending["ongoingTxnSize"] != 0.0 {
		t.Fatalf("pendingAckStats after the commit: %v", pending)
	}
	topicTxnCounts(t, name, 0, 1, 0)

	aborted, err := client.NewTransaction(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := producer.Send(ctx, &pulsar.ProducerMessage{Payload: []byte("aborted"), Transaction: aborted}); err != nil {
		t.Fatal(err)
	}
	if err := aborted.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	topicTxnCounts(t, name, 0, 1, 1)
}

// topicTxnCounts checks the transaction buffer's counts in the topic's
// stats (Pulsar's TopicStats `ongoingTxnCount`, `committedTxnCount`,
// `abortedTxnCount`) and in /metrics (`pulsar_txn_tb_*_total`).
func topicTxnCounts(t *testing.T, name string, ongoing, committed, aborted float64) {
	t.Helper()
	stats := getJSON(t, "/admin/v2/persistent/public/default/"+name+"/stats")
	if stats["ongoingTxnCount"] != ongoing || stats["committedTxnCount"] != committed ||
		stats["abortedTxnCount"] != aborted {
		t.Fatalf("topic stats: ongoingTxnCount %v committedTxnCount %v abortedTxnCount %v, want %v %v %v",
			stats["ongoingTxnCount"], stats["committedTxnCount"], stats["abortedTxnCount"],
			ongoing, committed, aborted)
	}
	status, body := httpDo(t, "GET", "/metrics", nil)
	if status != http.StatusOK {
		t.Fatalf("GET /metrics: HTTP %d", status)
	}
	topic := fmt.Sprintf("topic=\"persistent://public/default/%s\"", name)
	for family, want := range map[string]float64{
		"pulsar_txn_tb_active_total": ongoing, "pulsar_txn_tb_committed_total": committed,
		"pulsar_txn_tb_aborted_total": aborted,
	} {
		found := false
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, family+"{") && strings.Contains(line, topic) {
				fields := strings.Fields(line)
				found = fields[len(fields)-1] == strconv.FormatFloat(want, 'f', -1, 64)
				if !found {
					t.Fatalf("/metrics: %s, want %v", line, want)
				}
			}
		}
		if !found {
			t.Fatalf("/metrics has no %s for %s", family, name)
		}
	}
}
