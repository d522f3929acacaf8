"""Partitioned topics (key routing) and schemas with the official client."""

import json
from collections import defaultdict

import pulsar
from pulsar.schema import JsonSchema, Record, String, StringSchema, Integer

PARTITIONED = "persistent://public/default/partitioned-keys"  # created with 4 partitions by the fixture


def test_partitioned_topic_routes_keys_to_one_partition_each(client):
    consumer = client.subscribe(PARTITIONED, "keys", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(PARTITIONED, batching_enabled=False)
    keys = ["k%d" % i for i in range(16)]
    for i in range(160):
        producer.send(b"%d" % i, partition_key=keys[i % len(keys)])
    partition_of_key = {}
    per_key = defaultdict(list)
    for _ in range(160):
        msg = consumer.receive(timeout_millis=5000)
        consumer.acknowledge(msg)
        topic = msg.topic_name()
        assert topic.startswith(PARTITIONED + "-partition-")
        key = msg.partition_key()
        assert partition_of_key.setdefault(key, topic) == topic
        per_key[key].append(int(msg.data()))
    assert len(set(partition_of_key.values())) > 1
    for key, values in per_key.items():
        assert values == sorted(values)


def test_partitioned_topic_listed_per_partition(client, broker):
    names = client.get_topic_partitions(PARTITIONED)
    assert names == [PARTITIONED + "-partition-%d" % i for i in range(4)]


def test_string_schema(client, topic):
    consumer = client.subscribe(topic, "s", schema=StringSchema(), initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, schema=StringSchema())
    producer.send("héllo")
    msg = consumer.receive(timeout_millis=5000)
    assert msg.value() == "héllo"


class Point(Record):
    x = Integer()
    y = Integer()
    label = String()


def test_json_schema(client, topic):
    consumer = client.subscribe(topic, "s", schema=JsonSchema(Point), initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, schema=JsonSchema(Point))
    producer.send(Point(x=1, y=2, label="a"))
    msg = consumer.receive(timeout_millis=5000)
    value = msg.value()
    assert (value.x, value.y, value.label) == (1, 2, "a")
    assert json.loads(msg.data()) == {"x": 1, "y": 2, "label": "a"}


def test_incompatible_schema_type_is_refused(client, topic):
    client.create_producer(topic, schema=StringSchema())
    try:
        client.create_producer(topic, schema=JsonSchema(Point))
    except Exception as e:
        assert "Incompatible" in str(e) or "incompatible" in str(e).lower()
    else:
        raise AssertionError("a JSON producer on a string topic was accepted")


def test_failover_spreads_partitions_across_consumers(client):
    sub = "fo-spread"
    c1 = client.subscribe(PARTITIONED, sub, consumer_type=pulsar.ConsumerType.Failover, consumer_name="a")
    c2 = client.subscribe(PARTITIONED, sub, consumer_type=pulsar.ConsumerType.Failover, consumer_name="b")
    producer = client.create_producer(PARTITIONED, batching_enabled=False)
    for i in range(40):
        producer.send(b"f-%d" % i, partition_key="key-%d" % i)
    topics_of = {1: set(), 2: set()}
    total = 0
    for index, consumer in ((1, c1), (2, c2)):
        while True:
            try:
                msg = consumer.receive(timeout_millis=1000)
            except pulsar.Timeout:
                break
            topics_of[index].add(msg.topic_name())
            consumer.acknowledge(msg)
            total += 1
    assert total == 40
    assert topics_of[1] and topics_of[2]
    assert not topics_of[1] & topics_of[2], "a partition was active on both consumers"
