"""The workload of a fault schedule, in its own process (the official Python
client, `pulsar-client`): producers with dedup on sending asynchronously,
consumers acknowledging each message, then a final read of the `audit`
subscription, which was created before the first send and never acknowledges,
so it holds the whole topic. Every operation goes to a JSONL history:

  {"t": ms since the run's start, "process": "p0", "type": "invoke|ok|fail|info",
   "f": "send|receive|ack|read|phase", "value": 17, ...}

A send is `ok` with its receipt's message id, `fail` when the client refused
it before it left (queue full: it can never appear), else `info` (timed out
or any other error: it may or may not have been written).

Run: python3 workload.py CONFIG.json (the harness writes the config).
"""

import json
import sys
import threading
import time

import pulsar

DEFINITE_FAILURES = {"ProducerQueueIsFull", "InvalidMessage", "MessageTooBig", "MemoryBufferIsFull"}


class History:
    def __init__(self, path, t0):
        self.f = open(path, "a", buffering=1 << 16)
        self.t0 = t0
        self.lock = threading.Lock()

    def log(self, **op):
        op["t"] = int((time.time() - self.t0) * 1000)
        line = json.dumps(op, separators=(",", ":"))
        with self.lock:
            self.f.write(line + "\n")

    def close(self):
        with self.lock:
            self.f.flush()
            self.f.close()


def msg_id_of(mid):
    return [mid.ledger_id(), mid.entry_id(), mid.batch_index(), mid.partition()]


class ProducerLoad:
    def __init__(self, client, history, name, topic, batching, send_timeout_ms):
        self.client, self.history, self.name, self.topic = client, history, name, topic
        self.batching, self.send_timeout_ms = batching, send_timeout_ms
        self.next_value = 0
        self.producer = None
        self.broken = False
        self.ok_values = set()
        self.lock = threading.Lock()

    def connect(self):
        try:
            self.producer = self.client.create_producer(
                self.topic,
                producer_name=self.name,
                batching_enabled=self.batching,
                batching_max_publish_delay_ms=5,
                send_timeout_millis=self.send_timeout_ms,
                max_pending_messages=2000,
                block_if_queue_full=False,
            )
            self.broken = False
            self.history.log(process=self.name, type="ok", f="connect", value=None, topic=self.topic)
            return True
        except Exception as e:  # noqa: BLE001 - any failure means: try again later
            self.history.log(process=self.name, type="fail", f="connect", value=None, topic=self.topic, error=str(e)[:200])
            self.producer = None
            return False

    def send_one(self):
        if self.producer is None:
            return
        value = self.next_value
        self.next_value += 1
        self.history.log(process=self.name, type="invoke", f="send", value=value)

        def done(result, mid, value=value):
            name = str(result).split(".")[-1]
            if result == pulsar.Result.Ok:
                with self.lock:
                    self.ok_values.add(value)
                self.history.log(process=self.name, type="ok", f="send", value=value, id=msg_id_of(mid))
            else:
                kind = "fail" if name in DEFINITE_FAILURES else "info"
                self.history.log(process=self.name, type=kind, f="send", value=value, error=name)
                if name in ("AlreadyClosed", "ProducerFenced", "TopicTerminated", "ProducerNotInitialized"):
                    self.broken = True

        try:
            self.producer.send_async(("%s:%d" % (self.name, value)).encode(), done)
        except Exception as e:  # noqa: BLE001
            # Raised before the message was queued: it never left.
            self.history.log(process=self.name, type="fail", f="send", value=value, error=str(e)[:200])
            self.broken = True

    def flush(self):
        if self.producer is not None:
            try:
                self.producer.flush()
            except Exception:  # noqa: BLE001 - the per-message callbacks say what happened
                pass


class ConsumerLoad(threading.Thread):
    def __init__(self, client, history, name, topic, subscription):
        super().__init__(daemon=True, name=name)
        self.client, self.history, self.name, self.topic, self.sub = client, history, name, topic, subscription
        self.stop = threading.Event()
        self.received = set()
        self.last_receive = time.time()
        self.lock = threading.Lock()

    def run(self):
        consumer = None
        while not self.stop.is_set():
            if consumer is None:
                try:
                    consumer = self.client.subscribe(
                        self.topic, self.sub, consumer_type=pulsar.ConsumerType.Failover,
                        consumer_name=self.name, initial_position=pulsar.InitialPosition.Earliest,
                        receiver_queue_size=200,
                    )  # fmt: skip
                    self.history.log(process=self.name, type="ok", f="subscribe", value=None)
                except Exception as e:  # noqa: BLE001
                    self.history.log(process=self.name, type="fail", f="subscribe", value=None, error=str(e)[:200])
                    time.sleep(0.5)
                    continue
            try:
                msg = consumer.receive(timeout_millis=200)
            except pulsar.Timeout:
                continue
            except Exception as e:  # noqa: BLE001
                self.history.log(process=self.name, type="info", f="receive", value=None, error=str(e)[:200])
                time.sleep(0.2)
                continue
            producer, value = msg.data().decode().rsplit(":", 1)
            value = int(value)
            self.history.log(
                process=self.name, type="ok", f="receive", producer=producer, value=value,
                id=msg_id_of(msg.message_id()), redelivery=msg.redelivery_count(),
            )  # fmt: skip
            with self.lock:
                self.received.add((producer, value))
                self.last_receive = time.time()
            try:
                consumer.acknowledge(msg)
                # The client groups acknowledgements and never confirms them:
                # an ack is `info` (the broker may not have persisted it).
                self.history.log(process=self.name, type="info", f="ack", producer=producer, value=value)
            except Exception as e:  # noqa: BLE001
                self.history.log(process=self.name, type="fail", f="ack", producer=producer, value=value, error=str(e)[:200])
        if consumer is not None:
            try:
                consumer.close()
            except Exception:  # noqa: BLE001
                pass


class Prober(threading.Thread):
    """Every PROBE_INTERVAL_S a short-lived producer on one topic through one
    broker (both drawn in turn), sending two messages: its lookup goes to
    that broker, which hands the topic to a new owner once the old owner's
    session is gone, even while the old owner still serves the long-lived
    producers. That new owner fences the old owner's ledger: the case where
    a deposed broker must not acknowledge anything more."""

    INTERVAL_S = 1.5

    def __init__(self, history, broker_urls, topics, send_timeout_ms):
        super().__init__(daemon=True, name="prober")
        self.history, self.topics, self.send_timeout_ms = history, topics, send_timeout_ms
        self.clients = [
            pulsar.Client(url, operation_timeout_seconds=5, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
            for url in broker_urls
        ]
        self.stop = threading.Event()

    def run(self):
        n = 0
        while not self.stop.wait(self.INTERVAL_S):
            client = self.clients[n % len(self.clients)]
            topic_index = (n // len(self.clients)) % len(self.topics)
            load = ProducerLoad(client, self.history, "q%d-%d" % (topic_index, n), self.topics[topic_index], False, self.send_timeout_ms)
            n += 1
            if not load.connect():
                continue
            for _ in range(2):
                load.send_one()
            load.flush()
            try:
                load.producer.close()
            except Exception:  # noqa: BLE001
                pass

    def close(self):
        for c in self.clients:
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass


def audit_read(client, history, topic, quiet_s):
    """Reads the `audit` subscription from its start until `quiet_s` of
    silence; returns the count."""
    consumer = None
    deadline = time.time() + 120
    while consumer is None:
        try:
            consumer = client.subscribe(topic, "audit", receiver_queue_size=1000)
        except Exception as e:  # noqa: BLE001
            history.log(process="audit", type="fail", f="subscribe", value=None, topic=topic, error=str(e)[:200])
            if time.time() > deadline:
                raise
            time.sleep(1.0)
    count = 0
    while True:
        try:
            msg = consumer.receive(timeout_millis=int(quiet_s * 1000))
        except pulsar.Timeout:
            break
        producer, value = msg.data().decode().rsplit(":", 1)
        history.log(
            process="audit", type="ok", f="read", topic=topic, producer=producer, value=int(value),
            id=msg_id_of(msg.message_id()), redelivery=msg.redelivery_count(),
        )  # fmt: skip
        count += 1
    consumer.close()
    return count


def main():
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    history = History(cfg["history"], cfg["t0"])
    client = pulsar.Client(
        cfg["service_url"],
        operation_timeout_seconds=cfg.get("operation_timeout_s", 10),
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    topics = cfg["topics"]
    # The audit subscriptions exist before the first message.
    for topic in topics:
        consumer = client.subscribe(topic, "audit", initial_position=pulsar.InitialPosition.Earliest)
        consumer.close()
    consumers = []
    for topic_index, topic in enumerate(topics):
        for k in range(cfg["consumers_per_topic"]):
            consumers.append(ConsumerLoad(client, history, "c%d%s" % (topic_index, "ab"[k]), topic, "live"))
    for c in consumers:
        c.start()
    producers = []
    for topic_index, topic in enumerate(topics):
        for k in range(cfg["producers_per_topic"]):
            name = "p%d" % len(producers)
            producers.append(
                ProducerLoad(client, history, name, topic, batching=(k % 2 == 0), send_timeout_ms=cfg["send_timeout_ms"])
            )
    for p in producers:
        if not p.connect():
            raise SystemExit("producer %s could not connect before any fault" % p.name)
    prober = Prober(history, cfg["broker_urls"], topics, 5000)
    prober.start()
    history.log(process="workload", type="ok", f="phase", value="produce")
    print("workload: producing", flush=True)

    interval = 1.0 / cfg["rate_per_producer"]
    start = time.time()
    produce_until = start + cfg["produce_s"]
    tick = 0
    while time.time() < produce_until:
        for p in producers:
            if p.producer is None or p.broken:
                if tick % 20 == 0:
                    p.connect()
                continue
            p.send_one()
        tick += 1
        sleep = start + tick * interval - time.time()
        if sleep > 0:
            time.sleep(sleep)

    prober.stop.set()
    prober.join(timeout=60)
    history.log(process="workload", type="ok", f="phase", value="flush")
    for p in producers:
        p.flush()
    # Give the last callbacks (sends timing out) their time.
    time.sleep(min(cfg["send_timeout_ms"] / 1000.0, 10) + 1)
    history.log(process="workload", type="ok", f="phase", value="drain")
    print("workload: draining", flush=True)
    wanted = {(p.name, v) for p in producers for v in p.ok_values}
    drain_until = time.time() + cfg["drain_s"]
    while time.time() < drain_until:
        got = set()
        for c in consumers:
            with c.lock:
                got |= c.received
        quiet = time.time() - max(c.last_receive for c in consumers)
        if wanted <= got and quiet > 1.0:
            break
        time.sleep(0.2)
    for c in consumers:
        c.stop.set()
    for c in consumers:
        c.join(timeout=10)
    history.log(process="workload", type="ok", f="phase", value="audit")
    print("workload: reading the audit subscriptions", flush=True)
    for topic in topics:
        audit_read(client, history, topic, cfg.get("audit_quiet_s", 5))
    history.log(process="workload", type="ok", f="phase", value="done")
    for p in producers:
        try:
            if p.producer is not None:
                p.producer.close()
        except Exception:  # noqa: BLE001
            pass
    client.close()
    prober.close()
    history.close()
    print("workload: done", flush=True)


if __name__ == "__main__":
    main()
