"""Message lifecycle with the official client: retention and TTL free storage,
each backlog quota policy has its visible effect, delayed delivery survives a
restart.

The broker here rolls ledgers every 10 entries (no minimum rollover age)
and applies policies every second, so storage is freed (a whole consumed
ledger at a time) within the test's patience.
"""

import json
import time
import uuid

import pulsar
import pytest

from conftest import (
    POLICY_BROKER_CHECK_INTERVAL_S,
    POLICY_BROKER_LEDGER_ENTRIES_MAX,
    _start,
    _stop,
    create_namespace,
    http,
    quiet_client,
    restart,
    start_policy_broker,
)

POLICY_CHECK_INTERVAL_S = POLICY_BROKER_CHECK_INTERVAL_S
LEDGER_ENTRIES_MAX = POLICY_BROKER_LEDGER_ENTRIES_MAX
WAIT_S = 20


@pytest.fixture(scope="module")
def lc_broker():
    b = start_policy_broker()
    yield b
    _stop(b)


new_client = quiet_client


@pytest.fixture
def lc_client(lc_broker):
    c = new_client(lc_broker)
    yield c
    c.close()


def new_namespace(b):
    return create_namespace(b, "lc")


def set_policy(b, ns, what, body):
    status, reply = http(b, "POST", "/admin/v2/namespaces/%s/%s" % (ns, what), json.dumps(body))
    assert status == 204, (what, status, reply)


def topic_stats(b, topic):
    path = topic[len("persistent://"):]
    status, body = http(b, "GET", "/admin/v2/persistent/%s/stats" % path)
    assert status == 200, (status, body)
    return json.loads(body)


def wait_until(what, predicate, timeout_s=WAIT_S):
    deadline = time.time() + timeout_s
    last = None
    while time.time() < deadline:
        ok, last = predicate()
        if ok:
            return last
        time.sleep(0.2)
    raise AssertionError("timed out waiting for %s (last: %r)" % (what, last))


def publish(client, topic, count, size=1000, **kwargs):
    producer = client.create_producer(topic, batching_enabled=False, **kwargs)
    for i in range(count):
        producer.send(b"%06d" % i + b"x" * (size - 6))
    producer.close()


def test_retention_none_frees_consumed_ledgers(lc_broker, lc_client):
    ns = new_namespace(lc_broker)
    topic = "persistent://%s/retained" % ns
    consumer = lc_client.subscribe(topic, "sub")
    publish(lc_client, topic, 5 * LEDGER_ENTRIES_MAX)
    full = topic_stats(lc_broker, topic)["storageSize"]
    assert full >= 5 * LEDGER_ENTRIES_MAX * 1000, full
    for _ in range(5 * LEDGER_ENTRIES_MAX):
        consumer.acknowledge(consumer.receive(timeout_millis=10000))
    # Default retention (none): every consumed, closed ledger goes.
    def freed():
        size = topic_stats(lc_broker, topic)["storageSize"]
        return size <= 2 * LEDGER_ENTRIES_MAX * 1000, size
    wait_until("storage to drop", freed)
    consumer.close()


def test_retention_keeps_consumed_data_up_to_its_size(lc_broker, lc_client):
    ns = new_namespace(lc_broker)
    # 1 MiB of consumed data kept, for no time: the size decides.
    set_policy(lc_broker, ns, "retention", {"retentionTimeInMinutes": -1, "retentionSizeInMB": 1})
    topic = "persistent://%s/sized" % ns
    consumer = lc_client.subscribe(topic, "sub")
    publish(lc_client, topic, 200, size=10_000)  # 2 MB in 20 ledgers
    for _ in range(200):
        consumer.acknowledge(consumer.receive(timeout_millis=10000))

    def within_retention():
        size = topic_stats(lc_broker, topic)["storageSize"]
        return size <= (1 << 20) + 10 * 10_000 * 2, size
    size = wait_until("storage to shrink to the retention size", within_retention)
    # ...and no further: retained data stays readable from the start.
    assert size >= (1 << 20) - LEDGER_ENTRIES_MAX * 10_000, size
    time.sleep(3 * POLICY_CHECK_INTERVAL_S)
    assert topic_stats(lc_broker, topic)["storageSize"] == size
    reader = lc_client.create_reader(topic, pulsar.MessageId.earliest)
    first = reader.read_next(timeout_millis=10000)
    assert int(first.data()[:6]) > 0  # the oldest ledgers went
    reader.close()
    consumer.close()


def test_ttl_expires_backlog_and_frees_storage(lc_broker, lc_client):
    ns = new_namespace(lc_broker)
    topic = "persistent://%s/ttl" % ns
    consumer = lc_client.subscribe(topic, "slow")
    consumer.close()  # a subscription that never consumes
    publish(lc_client, topic, 3 * LEDGER_ENTRIES_MAX)
    stats = topic_stats(lc_broker, topic)
    assert stats["subscriptions"]["slow"]["msgBacklog"] == 3 * LEDGER_ENTRIES_MAX
    full = stats["storageSize"]
    time.sleep(1.5)
    set_policy(lc_broker, ns, "messageTTL", 1)

    def expired():
        s = topic_stats(lc_broker, topic)
        backlog = s["subscriptions"]["slow"]["msgBacklog"]
        return backlog == 0 and s["storageSize"] < full, (backlog, s["storageSize"], full)
    wait_until("TTL to expire the backlog and free storage", expired)
    # New messages are delivered (not expired at once).
    consumer = lc_client.subscribe(topic, "slow")
    publish(lc_client, topic, 1)
    assert consumer.receive(timeout_millis=10000).data().startswith(b"000000")
    consumer.close()


def set_quota(b, ns, body):
    status, reply = http(
        b,
        "POST",
        "/admin/v2/namespaces/%s/backlogQuota?backlogQuotaType=destination_storage" % ns,
        json.dumps(body),
    )
    assert status == 204, (status, reply)


def quota_namespace(b, policy, limit_bytes=20_000):
    ns = new_namespace(b)
    set_quota(b, ns, {"limitSize": limit_bytes, "limitTime": -1, "policy": policy})
    return ns


def topic_past_quota(b, client, name, quota):
    """A topic whose backlog (60 KB) is past the `quota` then set on its
    namespace: written first, so no policy pass meets the filling producer
    (on a loaded machine the fill can outlast a pass)."""
    ns = new_namespace(b)
    topic = "persistent://%s/%s" % (ns, name)
    fill_backlog(client, topic)
    set_quota(b, ns, quota)
    return topic


def producer_once_admitted(client, topic):
    """Creates a producer, retrying while the quota still refuses it (the
    consumer's acknowledgements reach the broker in groups)."""
    deadline = time.time() + WAIT_S
    while True:
        try:
            return client.create_producer(topic)
        except (pulsar.ProducerBlockedQuotaExceededError, pulsar.ProducerBlockedQuotaExceededException):
            if time.time() > deadline:
                raise
            time.sleep(0.2)


def fill_backlog(client, topic, count=60):
    """A subscription that does not consume, then more than the quota."""
    client.subscribe(topic, "slow").close()
    publish(client, topic, count)


def test_quota_producer_exception_refuses_producers(lc_broker, lc_client):
    topic = topic_past_quota(lc_broker, lc_client, "exception",
                             {"limitSize": 20_000, "limitTime": -1, "policy": "producer_exception"})
    with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
        lc_client.create_producer(topic)
    # Consuming the backlog lifts the block.
    consumer = lc_client.subscribe(topic, "slow")
    for _ in range(60):
        consumer.acknowledge(consumer.receive(timeout_millis=10000))
    consumer.close()
    producer = producer_once_admitted(lc_client, topic)
    producer.send(b"after")
    producer.close()


def test_quota_producer_exception_disconnects_live_producer(lc_broker, lc_client):
    ns = quota_namespace(lc_broker, "producer_exception")
    topic = "persistent://%s/live" % ns
    lc_client.subscribe(topic, "slow").close()
    producer = lc_client.create_producer(topic, batching_enabled=False, send_timeout_millis=5000)
    sent = 0
    deadline = time.time() + WAIT_S
    # The next lifecycle pass disconnects it; its reconnect is refused and the
    # pending send fails with the quota's exception.
    with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
        while time.time() < deadline:
            producer.send(b"y" * 1000)
            sent += 1
    assert sent * 1000 > 20_000, sent
    producer.close()


def test_quota_producer_request_hold_holds_then_releases(lc_broker, lc_client):
    topic = topic_past_quota(lc_broker, lc_client, "hold",
                             {"limitSize": 20_000, "limitTime": -1, "policy": "producer_request_hold"})
    with pytest.raises(pulsar.ProducerBlockedQuotaExceededError):
        lc_client.create_producer(topic)
    consumer = lc_client.subscribe(topic, "slow")
    for _ in range(60):
        consumer.acknowledge(consumer.receive(timeout_millis=10000))
    producer = producer_once_admitted(lc_client, topic)
    producer.send(b"released")
    assert consumer.receive(timeout_millis=10000).data() == b"released"
    producer.close()
    consumer.close()


def test_quota_without_limits_is_no_quota(lc_broker, lc_client):
    """The OpenMessaging Benchmark's Pulsar driver sets -1/-1 ("no limit"):
    producers are admitted past any backlog and the broker logs nothing about
    a quota it did not understand."""
    ns = new_namespace(lc_broker)
    status, reply = http(
        lc_broker,
        "POST",
        "/admin/v2/namespaces/%s/backlogQuota?backlogQuotaType=destination_storage" % ns,
        json.dumps({"limitSize": -1, "limitTime": -1, "policy": "producer_exception"}),
    )
    assert status == 204, (status, reply)
    topic = "persistent://%s/unlimited" % ns
    fill_backlog(lc_client, topic, count=30)
    time.sleep(2 * POLICY_CHECK_INTERVAL_S)
    producer = lc_client.create_producer(topic)
    producer.send(b"admitted")
    producer.close()
    assert "backlog quota not understood" not in lc_broker.log_text()


def test_quota_limit_given_as_a_string_applies(lc_broker, lc_client):
    """The Go client's own tests set a quota as `{"limit": "10240", ...}`
    (a number in a string, the deprecated field): Pulsar's JSON reader
    takes it, so the quota applies; a string that is no number is a 400."""
    ns = new_namespace(lc_broker)
    path = "/admin/v2/namespaces/%s/backlogQuota" % ns
    status, reply = http(lc_broker, "POST", path, json.dumps({"limit": "nope", "policy": "producer_exception"}))
    assert status == 400, (status, reply)
    topic = topic_past_quota(lc_broker, lc_client, "string-limit",
                             {"limit": "20000", "policy": "producer_exception"})
    with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
        lc_client.create_producer(topic)


def test_quota_consumer_backlog_eviction_drops_oldest(lc_broker, lc_client):
    ns = quota_namespace(lc_broker, "consumer_backlog_eviction", limit_bytes=20_000)
    topic = "persistent://%s/evict" % ns
    fill_backlog(lc_client, topic, count=60)  # 60 KB against 20 KB

    def evicted():
        backlog = topic_stats(lc_broker, topic)["subscriptions"]["slow"]["msgBacklog"]
        return backlog <= 20, backlog
    backlog = wait_until("eviction down to the quota", evicted)
    assert backlog > 0
    # Producers are not affected, and the newest messages are the ones kept.
    publish(lc_client, topic, 1)
    consumer = lc_client.subscribe(topic, "slow")
    first = consumer.receive(timeout_millis=10000)
    assert int(first.data()[:6]) >= 60 - 20 - 1, first.data()[:6]
    consumer.close()


def test_delayed_delivery_survives_restart():
    b = _start()
    try:
        topic = "persistent://public/default/delayed-" + uuid.uuid4().hex[:8]
        c = new_client(b)
        consumer = c.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared)
        producer = c.create_producer(topic, batching_enabled=False)
        delay_s = 6
        sent_at = time.time()
        producer.send(b"later", deliver_after=__import__("datetime").timedelta(seconds=delay_s))
        producer.send(b"now")
        now = consumer.receive(timeout_millis=10000)
        assert now.data() == b"now"
        consumer.acknowledge(now)
        c.close()
        b.terminate(30)
        b = restart(b)
        c = new_client(b)
        consumer = c.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared)
        msg = consumer.receive(timeout_millis=30000)
        if msg.data() == b"now":  # its ack may not have been persisted
            consumer.acknowledge(msg)
            msg = consumer.receive(timeout_millis=30000)
        got_at = time.time()
        assert msg.data() == b"later"
        assert got_at - sent_at >= delay_s - 0.05, got_at - sent_at
        consumer.acknowledge(msg)
        c.close()
    finally:
        _stop(b)


def compact_and_wait(b, topic):
    path = topic[len("persistent://"):]
    status, body = http(b, "PUT", "/admin/v2/persistent/%s/compaction" % path)
    assert status == 204, (status, body)
    return wait_compaction(b, topic)


def wait_compaction(b, topic):
    path = topic[len("persistent://"):]

    def done():
        status, body = http(b, "GET", "/admin/v2/persistent/%s/compaction" % path)
        assert status == 200, (status, body)
        state = json.loads(body)
        assert state["status"] != "ERROR", state
        return state["status"] == "SUCCESS", state
    return wait_until("compaction to succeed", done)


def read_all(client, topic, compacted, timeout_ms=2000):
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=compacted)
    out = []
    while True:
        try:
            msg = reader.read_next(timeout_millis=timeout_ms)
        except pulsar.Timeout:
            break
        out.append((msg.partition_key(), msg.data()))
    reader.close()
    return out


def publish_keyed(client, topic, batching):
    producer = client.create_producer(
        topic,
        batching_enabled=batching,
        batching_max_messages=100,
        batching_max_publish_delay_ms=50,
    )
    sent = []
    for version in range(3):
        for k in range(5):
            value = b"k%d-v%d" % (k, version)
            sent.append(("k%d" % k, value))
            producer.send_async(value, None, partition_key="k%d" % k)
    producer.send_async(b"no key", None)
    producer.send_async(b"", None, partition_key="k4")  # tombstone: k4 goes
    producer.flush()
    producer.close()
    return sent


@pytest.mark.parametrize("batching", [False, True], ids=["unbatched", "batched"])
def test_compacted_reader_sees_latest_value_per_key(lc_broker, lc_client, batching):
    ns = new_namespace(lc_broker)
    topic = "persistent://%s/compacted-%s" % (ns, "b" if batching else "u")
    # A subscription that consumes everything: consumed ledgers are trimmed,
    # so compacted reads must come from the compacted ledger.
    consumer = lc_client.subscribe(topic, "all")
    publish_keyed(lc_client, topic, batching)
    for _ in range(17):
        consumer.acknowledge(consumer.receive(timeout_millis=10000))
    assert len(read_all(lc_client, topic, compacted=False)) == 17
    compact_and_wait(lc_broker, topic)

    compacted = read_all(lc_client, topic, compacted=True)
    expected = [("k%d" % k, b"k%d-v2" % k) for k in range(4)] + [("", b"no key")]
    assert sorted(compacted) == sorted(expected), compacted

    # After the horizon a compacted reader sees the log as it is.
    producer = lc_client.create_producer(topic, batching_enabled=False)
    producer.send(b"k0-v3", partition_key="k0")
    producer.close()
    compacted = read_all(lc_client, topic, compacted=True)
    assert compacted[-1] == ("k0", b"k0-v3"), compacted
    assert sorted(compacted[:-1]) == sorted(expected), compacted
    consumer.close()


def test_compaction_survives_restart_and_a_threshold_starts_it(lc_broker):
    b = _start(["--ledger-max-entries", "10", "--ledger-min-rollover-minutes", "0",
                "--policy-check-interval-s", "1"])
    try:
        c = new_client(b)
        ns = new_namespace(b)
        set_policy(b, ns, "compactionThreshold", 5000)
        topic = "persistent://%s/threshold" % ns
        producer = c.create_producer(topic, batching_enabled=False)
        for version in range(10):
            for k in range(3):
                producer.send(b"%d" % version + b"x" * 500, partition_key="k%d" % k)
        producer.close()
        wait_compaction(b, topic)  # 15 KB pending against 5 KB: started by itself
        compacted = read_all(c, topic, compacted=True)
        assert sorted(compacted) == [("k%d" % k, b"9" + b"x" * 500) for k in range(3)], compacted
        c.close()
        b.terminate(30)
        b = restart(b)
        c = new_client(b)
        compacted = read_all(c, topic, compacted=True)
        assert sorted(compacted) == [("k%d" % k, b"9" + b"x" * 500) for k in range(3)], compacted
        c.close()
    finally:
        _stop(b)


def test_ttl_leaves_what_compaction_needs(lc_broker, lc_client):
    # TTL applies to subscriptions, not to the __compaction cursor: data
    # older than the TTL but not compacted yet is still compacted.
    ns = new_namespace(lc_broker)
    set_policy(lc_broker, ns, "compactionThreshold", 1 << 30)  # opens the cursor, never fires
    topic = "persistent://%s/ttl-compacted" % ns
    producer = lc_client.create_producer(topic, batching_enabled=False)
    # Two whole ledgers: both closed, so trimming could take them all.
    for version in range(2):
        for k in range(LEDGER_ENTRIES_MAX):
            producer.send(b"k%d-v%d" % (k, version), partition_key="k%d" % k)
    producer.close()
    set_policy(lc_broker, ns, "messageTTL", 1)
    time.sleep(1 + 3 * POLICY_CHECK_INTERVAL_S)
    compact_and_wait(lc_broker, topic)
    compacted = read_all(lc_client, topic, compacted=True)
    expected = [("k%d" % k, b"k%d-v1" % k) for k in range(LEDGER_ENTRIES_MAX)]
    assert sorted(compacted) == sorted(expected), compacted
