// txnloop: a consume-transform-produce loop in transactions with the
// official Go client, for the cluster crash test (tests/cluster/
// test_transactions.py). Each transaction takes up to -per-txn messages
// from -in (one Exclusive subscription), sends each payload to -out with
// its key, acknowledges it, and commits. Any error (a send, an ack, a
// commit, the coordinator moving) aborts the transaction as far as it can,
// closes consumer and producer, waits until the coordinator no longer
// knows the transaction (admin transactionMetadata answers "not found":
// it committed or aborted, its held acks are applied or free again) and
// starts again from what the subscription has not acknowledged, so no
// message of an unfinished transaction comes back after later ones.
// Exactly-once is the broker's: an output is visible iff its input's ack
// committed in the same transaction.
//
// With -hold-at N, the transaction after the N-th commit waits -hold-for
// between its acks and its commit, after printing `holding (m,l)`: a test
// kills the coordinator's broker then, so the commit goes to the broker
// that took the coordinator over, which must know the transaction, its
// partitions and subscriptions from the log.
//
// Prints `committed T M` (transactions, messages) after each commit and
// `restart: REASON` after each error; exits 0 once nothing arrived for
// -idle, 1 on a setup error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

type options struct {
	url, in, out, sub string
	admin             []string
	perTxn            int
	txnTimeout, idle  time.Duration
	holdAt            int
	holdFor           time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.url, "url", "", "service URL")
	flag.StringVar(&o.in, "in", "", "input topic")
	flag.StringVar(&o.out, "out", "", "output topic")
	flag.StringVar(&o.sub, "sub", "transform", "subscription on the input topic")
	flag.IntVar(&o.perTxn, "per-txn", 10, "input messages per transaction")
	flag.DurationVar(&o.txnTimeout, "txn-timeout", 5*time.Second, "transaction timeout")
	flag.DurationVar(&o.idle, "idle", 30*time.Second, "exit after this long without input")
	flag.IntVar(&o.holdAt, "hold-at", -1, "hold the transaction after this many commits")
	flag.DurationVar(&o.holdFor, "hold-for", 3*time.Second, "how long to hold it before its commit")
	admin := flag.String("admin", "", "comma-separated admin URLs (http://h:p) of the brokers")
	flag.Parse()
	if *admin != "" {
		o.admin = strings.Split(*admin, ",")
	}
	if o.url == "" || o.in == "" || o.out == "" {
		fmt.Fprintln(os.Stderr, "txnloop: -url, -in and -out are required")
		os.Exit(2)
	}
	client, err := pulsar.NewClient(pulsar.ClientOptions{
		URL:               o.url,
		EnableTransaction: true,
		OperationTimeout:  30 * time.Second,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "txnloop: client:", err)
		os.Exit(1)
	}
	defer client.Close()
	l := &loop{o: o, client: client, lastInput: time.Now()}
	for !l.idle() {
		if err := l.run(); err != nil {
			fmt.Printf("restart: %v\n", err)
			l.waitEnded()
		}
	}
	fmt.Printf("idle: %d transactions, %d messages committed\n", l.txns, l.messages)
}

type loop struct {
	o              options
	client         pulsar.Client
	lastInput      time.Time
	txns, messages int
	// The transaction of the last error, if it may not have ended.
	unfinished *pulsar.TxnID
}

// waitEnded waits until the coordinator no longer knows the unfinished
// transaction (at most two minutes; without admin URLs, its timeout).
func (l *loop) waitEnded() {
	id := l.unfinished
	l.unfinished = nil
	if id == nil || len(l.o.admin) == 0 {
		time.Sleep(l.o.txnTimeout + 2*time.Second)
		return
	}
	path := fmt.Sprintf("/admin/v3/transactions/transactionMetadata/%d/%d", id.MostSigBits, id.LeastSigBits)
	client := http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		for _, base := range l.o.admin {
			response, err := client.Get(base + path)
			if err != nil {
				continue
			}
			body, _ := io.ReadAll(response.Body)
			response.Body.Close()
			// "The transaction with this txdID `(m,l)`not found": ended.
			if response.StatusCode == http.StatusNotFound && strings.Contains(string(body), "txdID") {
				fmt.Printf("ended: %v\n", *id)
				return
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	fmt.Printf("still known after 2 minutes: %v\n", *id)
}

func (l *loop) idle() bool { return time.Since(l.lastInput) > l.o.idle }

// run moves messages until idle (nil) or the first error.
func (l *loop) run() error {
	consumer, err := l.client.Subscribe(pulsar.ConsumerOptions{
		Topic:                       l.o.in,
		SubscriptionName:            l.o.sub,
		Type:                        pulsar.Exclusive,
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest,
		ReceiverQueueSize:           100,
	})
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	defer consumer.Close()
	producer, err := l.client.CreateProducer(pulsar.ProducerOptions{
		Topic:           l.o.out,
		DisableBatching: true,
	})
	if err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	defer producer.Close()
	for !l.idle() {
		batch := l.receive(consumer)
		if len(batch) == 0 {
			continue
		}
		if err := l.transform(consumer, producer, batch); err != nil {
			return err
		}
	}
	return nil
}

// receive takes up to perTxn messages, waiting at most a second for more.
func (l *loop) receive(consumer pulsar.Consumer) []pulsar.Message {
	var batch []pulsar.Message
	deadline := time.Now().Add(time.Second)
	for len(batch) < l.o.perTxn {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		msg, err := consumer.Receive(ctx)
		cancel()
		if err != nil {
			break
		}
		l.lastInput = time.Now()
		batch = append(batch, msg)
	}
	return batch
}

func (l *loop) transform(consumer pulsar.Consumer, producer pulsar.Producer, batch []pulsar.Message) error {
	txn, err := l.client.NewTransaction(l.o.txnTimeout)
	if err != nil {
		return fmt.Errorf("new transaction: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.o.txnTimeout)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var sendErr error
	for _, msg := range batch {
		wg.Add(1)
		producer.SendAsync(ctx, &pulsar.ProducerMessage{
			Payload:     msg.Payload(),
			Key:         msg.Key(),
			Transaction: txn,
		}, func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
			if err != nil {
				mu.Lock()
				sendErr = errors.Join(sendErr, err)
				mu.Unlock()
			}
			wg.Done()
		})
	}
	wg.Wait()
	if sendErr != nil {
		return l.abort(txn, fmt.Errorf("send: %w", sendErr))
	}
	for _, msg := range batch {
		if err := consumer.AckWithTxn(msg, txn); err != nil {
			return l.abort(txn, fmt.Errorf("ack: %w", err))
		}
	}
	if l.txns == l.o.holdAt {
		id := txn.GetTxnID()
		fmt.Printf("holding (%d,%d)\n", id.MostSigBits, id.LeastSigBits)
		time.Sleep(l.o.holdFor)
	}
	if err := txn.Commit(ctx); err != nil {
		// The outcome may be either: the broker decides, the restart
		// reads what the subscription still holds.
		return l.abort(txn, fmt.Errorf("commit %v: %w", txn.GetTxnID(), err))
	}
	l.txns++
	l.messages += len(batch)
	fmt.Printf("committed %d %d\n", l.txns, l.messages)
	return nil
}

// abort ends txn if it still can (best effort) and returns cause.
func (l *loop) abort(txn pulsar.Transaction, cause error) error {
	id := txn.GetTxnID()
	l.unfinished = &id
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := txn.Abort(ctx); err != nil {
		return fmt.Errorf("%w (abort: %v)", cause, err)
	}
	return cause
}
