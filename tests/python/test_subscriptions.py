"""Subscription types with the official client: who gets what."""

import time
from collections import defaultdict

import pulsar
import pytest

EARLIEST = pulsar.InitialPosition.Earliest


def drain(consumer, timeout_ms=500, ack=True):
    out = []
    while True:
        try:
            msg = consumer.receive(timeout_millis=timeout_ms)
        except pulsar.Timeout:
            return out
        out.append(msg)
        if ack:
            consumer.acknowledge(msg)


def produce(client, topic, n, prefix="m", batching=False, key_of=None):
    producer = client.create_producer(topic, batching_enabled=batching, batching_max_publish_delay_ms=5)
    for i in range(n):
        if key_of is None:
            producer.send(b"%s-%d" % (prefix.encode(), i))
        else:
            producer.send(b"%s-%d" % (prefix.encode(), i), partition_key=key_of(i))
    producer.close()


def test_exclusive_refuses_a_second_consumer(client, topic):
    c1 = client.subscribe(topic, "excl", consumer_type=pulsar.ConsumerType.Exclusive)
    with pytest.raises(Exception):
        client.subscribe(topic, "excl", consumer_type=pulsar.ConsumerType.Exclusive)
    with pytest.raises(Exception):
        client.subscribe(topic, "excl", consumer_type=pulsar.ConsumerType.Shared)
    produce(client, topic, 10)
    got = drain(c1)
    assert [m.data() for m in got] == [b"m-%d" % i for i in range(10)]


def test_failover_one_active_then_takeover(client, topic):
    c1 = client.subscribe(topic, "fo", consumer_type=pulsar.ConsumerType.Failover, consumer_name="a")
    c2 = client.subscribe(topic, "fo", consumer_type=pulsar.ConsumerType.Failover, consumer_name="b")
    produce(client, topic, 20)
    got1 = drain(c1)
    got2 = drain(c2)
    # Exactly one consumer is active and receives everything, in order.
    active, idle = (got1, got2) if got1 else (got2, got1)
    assert [m.data() for m in active] == [b"m-%d" % i for i in range(20)]
    assert idle == []
    # Close the active one: the other takes over new messages.
    (c1 if got1 else c2).close()
    standby = c2 if got1 else c1
    produce(client, topic, 5, prefix="n")
    got = drain(standby, timeout_ms=2000)
    assert [m.data() for m in got] == [b"n-%d" % i for i in range(5)]


def test_shared_spreads_without_duplicates(client, topic):
    c1 = client.subscribe(topic, "sh", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=10)
    c2 = client.subscribe(topic, "sh", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=10)
    n = 100
    produce(client, topic, n)
    got = []
    seen = {1: 0, 2: 0}
    deadline = time.time() + 15
    while len(got) < n and time.time() < deadline:
        for idx, c in ((1, c1), (2, c2)):
            try:
                msg = c.receive(timeout_millis=50)
            except pulsar.Timeout:
                continue
            got.append(msg.data())
            seen[idx] += 1
            c.acknowledge(msg)
    assert sorted(got) == sorted(b"m-%d" % i for i in range(n))
    assert seen[1] > 0 and seen[2] > 0


def test_key_shared_keeps_each_key_on_one_consumer_in_order(client, topic):
    consumers = [
        client.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name="c%d" % i)
        for i in range(3)
    ]
    keys = ["key-%d" % k for k in range(12)]
    n = 240
    produce(client, topic, n, key_of=lambda i: keys[i % len(keys)])
    owner = {}
    per_key = defaultdict(list)
    total = 0
    deadline = time.time() + 15
    while total < n and time.time() < deadline:
        for idx, c in enumerate(consumers):
            for msg in drain(c, timeout_ms=200):
                key = msg.partition_key()
                assert owner.setdefault(key, idx) == idx, "key %s went to two consumers" % key
                per_key[key].append(int(msg.data().split(b"-")[1]))
                total += 1
    assert total == n
    for key, seq in per_key.items():
        assert seq == sorted(seq), "key %s out of order" % key
    assert len(set(owner.values())) >= 2


def test_key_shared_with_batching_routes_by_batch_key(client, topic):
    c = client.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared)
    producer = client.create_producer(
        topic, batching_enabled=True, batching_type=pulsar.BatchingType.KeyBased, batching_max_publish_delay_ms=5
    )
    for i in range(30):
        producer.send_async(b"v-%d" % i, None, partition_key="k%d" % (i % 3))
    producer.flush()
    got = drain(c, timeout_ms=2000)
    assert sorted(m.data() for m in got) == sorted(b"v-%d" % i for i in range(30))


def test_initial_position_latest_skips_old_messages(client, topic):
    produce(client, topic, 5, prefix="old")
    c = client.subscribe(topic, "late", initial_position=pulsar.InitialPosition.Latest)
    produce(client, topic, 3, prefix="new")
    got = drain(c)
    assert [m.data() for m in got] == [b"new-%d" % i for i in range(3)]


def test_unsubscribe_then_resubscribe_starts_over(client, topic):
    produce(client, topic, 3)
    c = client.subscribe(topic, "u", initial_position=EARLIEST)
    assert len(drain(c)) == 3
    c.unsubscribe()
    c = client.subscribe(topic, "u", initial_position=EARLIEST)
    assert [m.data() for m in drain(c)] == [b"m-%d" % i for i in range(3)]


def test_durable_subscription_resumes_after_acked_messages(client, topic):
    c = client.subscribe(topic, "d", initial_position=EARLIEST)
    produce(client, topic, 6)
    got = drain(c)
    assert len(got) == 6
    c.close()
    produce(client, topic, 2, prefix="later")
    c = client.subscribe(topic, "d", initial_position=EARLIEST)
    assert [m.data() for m in drain(c)] == [b"later-0", b"later-1"]


def test_subscription_type_can_change_once_no_consumer_is_attached(client, topic):
    c = client.subscribe(topic, "changing", consumer_type=pulsar.ConsumerType.Exclusive)
    c.close()
    c1 = client.subscribe(topic, "changing", consumer_type=pulsar.ConsumerType.Shared)
    c2 = client.subscribe(topic, "changing", consumer_type=pulsar.ConsumerType.Shared)
    c1.close()
    c2.close()
    client.subscribe(topic, "changing", consumer_type=pulsar.ConsumerType.KeyShared)
