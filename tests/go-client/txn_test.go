// Transactions through the official Go client (the standalone runs with
// --transaction-coordinator-enabled): the coordinator's NEW_TXN and
// END_TXN, Pulsar's TransactionNotFound after the end, a timed-out
// transaction aborted by the coordinator, and the admin API's
// transactionMetadata view.
package goclient

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

func txnMetadata(t *testing.T, id pulsar.TxnID) (int, map[string]any) {
	t.Helper()
	path := fmt.Sprintf("/admin/v3/transactions/transactionMetadata/%d/%d", id.MostSigBits, id.LeastSigBits)
	status, body := httpDo(t, "GET", path, nil)
	var doc map[string]any
	if status == http.StatusOK {
		if err := json.Unmarshal(body, &doc); err != nil {
			t.Fatalf("%s: %v: %s", path, err, body)
		}
	}
	return status, doc
}

func TestTransactionCommitAndAbort(t *testing.T) {
	client := newClient(t, pulsar.ClientOptions{EnableTransaction: true})
	ctx := context.Background()

	txn, err := client.NewTransaction(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	status, doc := txnMetadata(t, txn.GetTxnID())
	if status != http.StatusOK || doc["status"] != "OPEN" {
		t.Fatalf("open transaction: %d %v", status, doc)
	}
	if err := txn.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if txn.GetState() != pulsar.TxnCommitted {
		t.Fatalf("state after commit: %v", txn.GetState())
	}
	// Ended transactions are forgotten, as in Pulsar.
	if status, _ := txnMetadata(t, txn.GetTxnID()); status != http.StatusNotFound {
		t.Fatalf("committed transaction: HTTP %d, want 404", status)
	}

	aborted, err := client.NewTransaction(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if aborted.GetTxnID() == txn.GetTxnID() {
		t.Fatal("two transactions got one id")
	}
	if err := aborted.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if aborted.GetState() != pulsar.TxnAborted {
		t.Fatalf("state after abort: %v", aborted.GetState())
	}
	// Pulsar's coordinator families on /metrics.
	status, body := httpDo(t, "GET", "/metrics", nil)
	for _, family := range []string{"pulsar_txn_committed_count", "pulsar_txn_aborted_count", "pulsar_txn_created_count"} {
		sample := family + `{cluster="standalone",coordinator_id="0"} `
		if status != http.StatusOK || !strings.Contains(string(body), sample) {
			t.Fatalf("/metrics (HTTP %d) has no %s sample", status, family)
		}
	}
}

func TestTimedOutTransactionIsAborted(t *testing.T) {
	client := newClient(t, pulsar.ClientOptions{EnableTransaction: true})
	txn, err := client.NewTransaction(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		status, _ := txnMetadata(t, txn.GetTxnID())
		if status == http.StatusNotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("transaction still open 20 s after its 1 s timeout (HTTP %d)", status)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The client's own timer may have marked it timed out already; either
	// way committing it fails.
	if err := txn.Commit(context.Background()); err == nil {
		t.Fatal("commit of a timed-out transaction succeeded")
	}
}
