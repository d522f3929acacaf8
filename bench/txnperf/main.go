// txnperf: the transactional produce benchmark's client (bench/txn.py),
// the official Go client driving Vela and Apache Pulsar alike.
//
// -mode txn:   each worker loops: open a transaction, send -per-txn
//
//	messages of -size bytes in it (asynchronously, all at once), wait
//	for their receipts, commit. Measures transactions/s and the commit's
//	latency (END_TXN until its answer) and the whole transaction's.
//
// -mode plain: the same loop without a transaction: -per-txn sends, wait
//
//	for their receipts. Measures rounds/s (a round = -per-txn messages)
//	and the round's latency, so the two modes compare round for round.
//
// Every worker has its own producer (batching off in both modes: a batch
// may not mix transactions). Counts only rounds that finished after the
// warm-up and before its end; prints one JSON line at the end. A failed
// send or commit counts in "failures" and the run goes on.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

type options struct {
	url, topic, mode string
	duration, warmup time.Duration
	size, perTxn     int
	workers          int
}

// worker results: latencies in microseconds of rounds inside the window.
type result struct {
	commitUs, roundUs []int64
}

func main() {
	var o options
	flag.StringVar(&o.url, "url", "", "service URL")
	flag.StringVar(&o.topic, "topic", "", "topic")
	flag.StringVar(&o.mode, "mode", "txn", "txn or plain")
	flag.DurationVar(&o.duration, "duration", 15*time.Second, "measured time")
	flag.DurationVar(&o.warmup, "warmup", 5*time.Second, "time before measuring")
	flag.IntVar(&o.size, "size", 1024, "message bytes")
	flag.IntVar(&o.perTxn, "per-txn", 10, "messages per transaction (round)")
	flag.IntVar(&o.workers, "workers", 16, "concurrent loops")
	flag.Parse()
	if o.url == "" || o.topic == "" || (o.mode != "txn" && o.mode != "plain") {
		fmt.Fprintln(os.Stderr, "txnperf: -url, -topic and -mode txn|plain are required")
		os.Exit(2)
	}
	client, err := pulsar.NewClient(pulsar.ClientOptions{
		URL:               o.url,
		EnableTransaction: o.mode == "txn",
		OperationTimeout:  30 * time.Second,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "txnperf: client:", err)
		os.Exit(1)
	}
	defer client.Close()
	producers := make([]pulsar.Producer, o.workers)
	for i := range producers {
		producers[i], err = client.CreateProducer(pulsar.ProducerOptions{
			Topic:           o.topic,
			DisableBatching: true,
			SendTimeout:     60 * time.Second,
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, "txnperf: producer:", err)
			os.Exit(1)
		}
		defer producers[i].Close()
	}
	payload := make([]byte, o.size)
	for i := range payload {
		payload[i] = byte('a' + i%26)
	}
	start := time.Now()
	from, until := start.Add(o.warmup), start.Add(o.warmup+o.duration)
	var failures atomic.Int64
	results := make([]result, o.workers)
	var wg sync.WaitGroup
	for w := 0; w < o.workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for time.Now().Before(until) {
				began := time.Now()
				commitUs, err := round(client, producers[w], o, payload)
				ended := time.Now()
				if err != nil {
					failures.Add(1)
					continue
				}
				if began.After(from) && ended.Before(until) {
					results[w].roundUs = append(results[w].roundUs, ended.Sub(began).Microseconds())
					if o.mode == "txn" {
						results[w].commitUs = append(results[w].commitUs, commitUs)
					}
				}
			}
		}(w)
	}
	wg.Wait()
	var commits, rounds []int64
	for _, r := range results {
		commits = append(commits, r.commitUs...)
		rounds = append(rounds, r.roundUs...)
	}
	seconds := o.duration.Seconds()
	summary := map[string]any{
		"mode":               o.mode,
		"workers":            o.workers,
		"messages_per_round": o.perTxn,
		"message_bytes":      o.size,
		"rounds_per_s":       float64(len(rounds)) / seconds,
		"messages_per_s":     float64(len(rounds)*o.perTxn) / seconds,
		"round_ms":           percentiles(rounds),
		"failures":           failures.Load(),
	}
	if o.mode == "txn" {
		summary["commit_ms"] = percentiles(commits)
	}
	line, _ := json.Marshal(summary)
	fmt.Println(string(line))
}

// round sends perTxn messages (in a transaction in txn mode) and waits for
// them (and the commit); returns the commit's latency in µs.
func round(client pulsar.Client, producer pulsar.Producer, o options, payload []byte) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var txn pulsar.Transaction
	if o.mode == "txn" {
		var err error
		if txn, err = client.NewTransaction(time.Minute); err != nil {
			return 0, err
		}
	}
	var wg sync.WaitGroup
	var failed atomic.Bool
	for i := 0; i < o.perTxn; i++ {
		wg.Add(1)
		producer.SendAsync(ctx, &pulsar.ProducerMessage{Payload: payload, Transaction: txn},
			func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
				if err != nil {
					failed.Store(true)
				}
				wg.Done()
			})
	}
	wg.Wait()
	if failed.Load() {
		if txn != nil {
			_ = txn.Abort(ctx)
		}
		return 0, fmt.Errorf("send failed")
	}
	if txn == nil {
		return 0, nil
	}
	began := time.Now()
	if err := txn.Commit(ctx); err != nil {
		return 0, err
	}
	return time.Since(began).Microseconds(), nil
}

func percentiles(us []int64) map[string]float64 {
	if len(us) == 0 {
		return map[string]float64{}
	}
	sort.Slice(us, func(i, j int) bool { return us[i] < us[j] })
	at := func(q float64) float64 {
		i := int(q * float64(len(us)-1))
		return float64(us[i]) / 1000.0
	}
	return map[string]float64{"p50": at(0.50), "p99": at(0.99), "p999": at(0.999), "max": at(1.0)}
}
