"""Non-persistent topics with the official Python client (the C++ client):
fan-out, the four subscription types, drops counted (stats and /metrics),
partitioned topics, the admin routes, and regex subscriptions across
domains as the client's RegexSubscriptionMode asks."""

import json
import re
import time
import urllib.request
import uuid

import pulsar
import pytest
from conftest import http
from prometheus_client.parser import text_string_to_metric_families


def np_topic(prefix="np"):
    return "non-persistent://public/default/%s-%s" % (prefix, uuid.uuid4().hex[:10])


def local(topic):
    return topic.split("/")[-1]


def metric(broker, name, **labels):
    with urllib.request.urlopen(broker.http_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def test_every_subscription_gets_every_message_and_receipts_say_0_0(client):
    topic = np_topic()
    consumers = [client.subscribe(topic, "s%d" % i) for i in range(3)]
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(b"m%d" % i) for i in range(10)]
    # Pulsar's receipt for a non-persistent message: ledger 0, entry 0.
    assert {(i.ledger_id(), i.entry_id()) for i in ids} == {(0, 0)}
    for consumer in consumers:
        messages = [consumer.receive(timeout_millis=5000) for _ in range(10)]
        assert [m.data() for m in messages] == [b"m%d" % i for i in range(10)]
        # Consumers see (0, 0) too; acks are answered and forgotten.
        assert (messages[0].message_id().ledger_id(), messages[0].message_id().entry_id()) == (0, 0)
        consumer.acknowledge(messages[-1])


def test_subscription_types(client):
    topic = np_topic("types")
    exclusive = client.subscribe(topic, "ex", consumer_type=pulsar.ConsumerType.Exclusive)
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "ex", consumer_type=pulsar.ConsumerType.Exclusive)
    shared = [client.subscribe(topic, "sh", consumer_type=pulsar.ConsumerType.Shared) for _ in range(2)]
    failover = [
        client.subscribe(topic, "fo", consumer_type=pulsar.ConsumerType.Failover, consumer_name="fo-%d" % i)
        for i in range(2)
    ]
    key_shared = [client.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared) for _ in range(2)]
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(20):
        producer.send(b"%d" % i, partition_key="key-%d" % (i % 4))

    def drain(consumer):
        out = []
        while True:
            try:
                out.append(consumer.receive(timeout_millis=1000))
            except pulsar.Timeout:
                return out

    assert len(drain(exclusive)) == 20
    shared_counts = [len(drain(c)) for c in shared]
    assert sum(shared_counts) == 20 and min(shared_counts) > 0
    assert sorted(len(drain(c)) for c in failover) == [0, 20]
    keys_seen = [set(m.partition_key() for m in drain(c)) for c in key_shared]
    assert sum(len(k) for k in keys_seen) == 4, keys_seen
    assert not (keys_seen[0] & keys_seen[1]), "a key went to two Key_Shared consumers"


def test_messages_nobody_can_take_are_dropped_and_counted(broker, client):
    topic = np_topic("drops")
    # A receiver queue of one message that nobody reads: the first message
    # takes the only permit, the rest are dropped for this subscription.
    slow = client.subscribe(topic, "slow", receiver_queue_size=1)
    fast = client.subscribe(topic, "fast")
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(50):
        producer.send(b"%d" % i)
    assert [fast.receive(timeout_millis=5000).data() for _ in range(50)] == [b"%d" % i for i in range(50)]
    status, body = http(broker, "GET", "/admin/v2/non-persistent/public/default/%s/stats" % local(topic))
    assert status == 200, body
    stats = json.loads(body)
    assert "msgDropRate" in stats and "msgDropRate" in stats["publishers"][0]
    assert "msgDropRate" in stats["subscriptions"]["slow"]
    assert stats["subscriptions"]["slow"]["isDurable"] is False
    assert stats["msgInCounter"] == 50
    dropped = metric(broker, "vela_subscription_dropped_messages_total", topic=topic, subscription="slow")
    assert dropped is not None and dropped >= 45, dropped
    assert metric(broker, "vela_subscription_dropped_messages_total", topic=topic, subscription="fast") == 0
    assert metric(broker, "pulsar_subscription_msg_drop_rate", topic=topic, subscription="slow") is not None
    slow.close()


def test_partitioned_non_persistent_topics(broker, client):
    topic = np_topic("parts")
    status, body = http(broker, "PUT", "/admin/v2/non-persistent/public/default/%s/partitions" % local(topic), "3")
    assert status == 204, body
    status, body = http(broker, "GET", "/admin/v2/non-persistent/public/default/%s/partitions" % local(topic))
    assert json.loads(body)["partitions"] == 3
    status, body = http(broker, "GET", "/admin/v2/non-persistent/public/default/partitioned")
    assert topic in json.loads(body)
    consumer = client.subscribe(topic, "all")
    producer = client.create_producer(
        topic, batching_enabled=False, message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution
    )
    for i in range(9):
        producer.send(b"%d" % i)
    got = sorted(int(consumer.receive(timeout_millis=5000).data()) for _ in range(9))
    assert got == list(range(9))
    status, body = http(broker, "GET", "/admin/v2/non-persistent/public/default/%s/partitioned-stats" % local(topic))
    assert status == 200, body
    assert json.loads(body)["msgInCounter"] == 9
    status, body = http(broker, "GET", "/admin/v2/namespaces/public/default/topics?mode=NON_PERSISTENT")
    assert "%s-partition-2" % topic in json.loads(body)


def test_admin_lists_and_unloads_non_persistent_topics(broker, client):
    topic = np_topic("admin")
    producer = client.create_producer(topic)
    status, body = http(broker, "GET", "/admin/v2/non-persistent/public/default")
    assert status == 200 and topic in json.loads(body)
    status, body = http(broker, "GET", "/admin/v2/persistent/public/default")
    assert topic not in json.loads(body)
    status, _ = http(broker, "GET", "/admin/v2/non-persistent/public/default/%s-gone/stats" % local(topic))
    assert status == 404
    status, _ = http(broker, "POST", "/admin/v2/non-persistent/public/default/%s/terminate" % local(topic))
    assert status == 406
    status, _ = http(broker, "PUT", "/admin/v2/non-persistent/public/default/%s/unload" % local(topic))
    assert status == 204
    # The producer reconnects (the topic is made again) and goes on.
    producer.send(b"after unload")


@pytest.mark.parametrize(
    "mode,expected",
    [
        (pulsar.RegexSubscriptionMode.PersistentOnly, {b"persistent"}),
        (pulsar.RegexSubscriptionMode.NonPersistentOnly, {b"non-persistent"}),
        (pulsar.RegexSubscriptionMode.AllTopics, {b"persistent", b"non-persistent"}),
    ],
)
def test_regex_subscriptions_span_the_domains_the_client_asks_for(client, mode, expected):
    prefix = "rx-" + uuid.uuid4().hex[:8]
    persistent = "persistent://public/default/%s-p" % prefix
    non_persistent = "non-persistent://public/default/%s-n" % prefix
    producers = {
        b"persistent": client.create_producer(persistent, batching_enabled=False),
        b"non-persistent": client.create_producer(non_persistent, batching_enabled=False),
    }
    consumer = client.subscribe(
        re.compile("persistent://public/default/%s-.*" % prefix),
        "rx",
        regex_subscription_mode=mode,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    time.sleep(0.5)
    for name, producer in producers.items():
        producer.send(name)
    got = set()
    try:
        while True:
            got.add(consumer.receive(timeout_millis=2000).data())
    except pulsar.Timeout:
        pass
    assert got == expected
