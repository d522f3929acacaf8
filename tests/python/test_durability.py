"""Durability with the official client against `vela standalone`: 100 MiB with
every byte checked, kill -9 under produce load, restarts.

The guarantee these tests hold the broker to (README, "Durability"):
- a message whose send the client saw succeed survives kill -9 (and power
  loss: it was fdatasync'ed on Qa bookies before the receipt);
- after a restart the log holds every acknowledged message exactly once, in
  send order; a send whose outcome the client never learned (in flight at the
  kill) may or may not be there, but only after every earlier message;
- a subscription resumes right after its last acknowledged message once the
  acknowledgement has had time to be persisted (the client groups acks for
  100 ms, the broker persists a cursor at most every 100 ms); acks younger than
  that may be delivered again (at-least-once), never lost messages.
"""

import hashlib
import os
import random
import threading
import time
import uuid

import pulsar
import pytest

from conftest import kill9, restart, start_broker, stop_broker

MIB = 1024 * 1024
# kill -9 rounds: a few in the fast suite, more with ./test.sh --full.
KILL_ROUNDS = 10 if os.environ.get("VELA_TEST_FULL") == "1" else 2


def payload(i, size=1024):
    """Deterministic, index-dependent bytes (every byte is checked)."""
    seed = hashlib.sha256(b"%d" % i).digest()
    return (seed * (size // len(seed) + 1))[:size]


def new_client(broker):
    return pulsar.Client(
        broker.url,
        operation_timeout_seconds=10,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )


def test_100_mib_of_1_kib_messages_every_byte_checked(client, topic):
    count = 100 * MIB // 1024
    consumer = client.subscribe(topic, "all-bytes", receiver_queue_size=5000)
    producer = client.create_producer(
        topic,
        batching_enabled=True,
        batching_max_messages=1000,
        batching_max_publish_delay_ms=5,
        max_pending_messages=20000,
        block_if_queue_full=True,
    )
    failures = []

    def sent(result, _msg_id):
        if result != pulsar.Result.Ok:
            failures.append(result)

    for i in range(count):
        producer.send_async(payload(i), sent)
    producer.flush()
    assert not failures, failures[:5]
    for i in range(count):
        msg = consumer.receive(timeout_millis=20000)
        assert msg.data() == payload(i), "message %d differs" % i
        if i % 1000 == 999:
            consumer.acknowledge_cumulative(msg)
    consumer.acknowledge_cumulative(msg)
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=200)


def _produce_until_killed(broker, topic, acked, stop, start):
    """Sync sends of payload(i), i = start, start+1, ... until the broker dies;
    `acked` gets every i whose send succeeded."""
    client = new_client(broker)
    try:
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=3000)
        i = start
        while not stop.is_set():
            try:
                producer.send(payload(i, 256))
            except Exception:
                return
            acked.append(i)
            i += 1
    finally:
        try:
            client.close()
        except Exception:
            pass


def _produce_async_until_killed(broker, topic, acked, stop):
    """Batched async sends; `acked` gets every i the client saw succeed."""
    client = new_client(broker)
    lock = threading.Lock()
    try:
        producer = client.create_producer(
            topic,
            batching_enabled=True,
            batching_max_publish_delay_ms=2,
            send_timeout_millis=3000,
            max_pending_messages=2000,
            block_if_queue_full=True,
        )
        i = 0
        while not stop.is_set():

            def done(result, _msg_id, i=i):
                if result == pulsar.Result.Ok:
                    with lock:
                        acked.append(i)

            try:
                producer.send_async(payload(i, 512), done)
            except Exception:
                return
            i += 1
            if i % 200 == 0:
                time.sleep(0.001)
    finally:
        try:
            client.close()
        except Exception:
            pass


def _read_all(client, topic, subscription, size):
    """Every message the subscription delivers, as indices, until quiet."""
    consumer = client.subscribe(
        topic,
        subscription,
        initial_position=pulsar.InitialPosition.Earliest,
        receiver_queue_size=2000,
    )
    got = []
    while True:
        try:
            msg = consumer.receive(timeout_millis=3000)
        except pulsar.Timeout:
            break
        data = msg.data()
        index = None
        # Recover the index from the payload (sends are sequential, so this is
        # a short forward search from the last one).
        start = got[-1] + 1 if got else 0
        for candidate in range(start, start + 100000):
            if payload(candidate, size) == data:
                index = candidate
                break
        assert index is not None, "a message matches no sent payload (corrupt?)"
        got.append(index)
        consumer.acknowledge(msg)
    consumer.close()
    return got


def _check_log(got, acked, what):
    """Exactly once, in order, nothing acknowledged missing."""
    assert got == sorted(set(got)), "%s: duplicates or reordering" % what
    assert got == list(range(len(got))), "%s: a gap in the log" % what
    missing = sorted(set(acked) - set(got))
    assert not missing, "%s: %d acknowledged messages lost, first %s" % (
        what,
        len(missing),
        missing[:5],
    )


@pytest.mark.parametrize("round_", range(KILL_ROUNDS))
def test_kill9_under_produce_load_loses_nothing_acknowledged(round_):
    broker = start_broker()
    sync_topic = "persistent://public/default/kill-sync-" + uuid.uuid4().hex[:8]
    async_topic = "persistent://public/default/kill-async-" + uuid.uuid4().hex[:8]
    try:
        # A subscription that acks a prefix and then waits for the ack to be
        # persisted: after the crash it must resume right after it.
        client = new_client(broker)
        consumer = client.subscribe(sync_topic, "resume")
        pre = client.create_producer(sync_topic, batching_enabled=False)
        for i in range(100):
            pre.send(payload(i, 256))
        for i in range(60):
            msg = consumer.receive(timeout_millis=10000)
            assert msg.data() == payload(i, 256)
        consumer.acknowledge_cumulative(msg)
        time.sleep(1.0)  # ack grouping (100 ms) + cursor persistence (100 ms)
        pre.close()
        consumer.close()
        client.close()

        sync_acked = list(range(100))
        async_acked = []
        stop = threading.Event()
        producers = [
            threading.Thread(
                target=_produce_until_killed, args=(broker, sync_topic, sync_acked, stop, 100)
            ),
            threading.Thread(
                target=_produce_async_until_killed,
                args=(broker, async_topic, async_acked, stop),
            ),
        ]
        for t in producers:
            t.start()
        time.sleep(random.uniform(1.0, 3.0))
        kill9(broker)
        stop.set()
        for t in producers:
            t.join(timeout=60)
        assert len(sync_acked) > 100 and async_acked, "no load reached the broker"
        acked_sync_snapshot = list(sync_acked)
        acked_async_snapshot = list(async_acked)

        broker = restart(broker)
        client = new_client(broker)
        # The acknowledged prefix is not delivered again.
        consumer = client.subscribe(sync_topic, "resume")
        first = consumer.receive(timeout_millis=10000)
        assert first.data() == payload(60, 256), "subscription did not resume after its ack"
        consumer.close()

        got_sync = _read_all(client, sync_topic, "check-" + uuid.uuid4().hex[:6], 256)
        _check_log(got_sync, acked_sync_snapshot, "sync topic")
        got_async = _read_all(client, async_topic, "check-" + uuid.uuid4().hex[:6], 512)
        _check_log(got_async, acked_async_snapshot, "async topic")
        print(
            "kill -9 round %d: %d sync and %d async sends acknowledged, all read back"
            % (round_, len(acked_sync_snapshot), len(acked_async_snapshot))
        )

        # Publishing works again on both.
        p = client.create_producer(sync_topic)
        p.send(b"after-restart")
        client.close()
    finally:
        stop_broker(broker)
