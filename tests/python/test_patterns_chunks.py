"""Regex subscriptions (GET_TOPICS_OF_NAMESPACE) and chunked messages."""

import re
import uuid

import pulsar


def test_pattern_subscription_sees_matching_topics(client):
    prefix = "pat-" + uuid.uuid4().hex[:8]
    topics = ["persistent://public/default/%s-%d" % (prefix, i) for i in range(3)]
    for t in topics:
        client.create_producer(t).close()  # create the topics
    consumer = client.subscribe(
        re.compile("persistent://public/default/%s-.*" % prefix),
        "pattern",
        initial_position=pulsar.InitialPosition.Earliest,
    )
    for i, t in enumerate(topics):
        p = client.create_producer(t)
        p.send(b"from-%d" % i)
        p.close()
    got = sorted(consumer.receive(timeout_millis=5000).data() for _ in topics)
    assert got == [b"from-0", b"from-1", b"from-2"]


def test_chunked_message_round_trips(client, topic):
    consumer = client.subscribe(topic, "chunks", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, chunking_enabled=True, batching_enabled=False)
    payload = bytes(i % 251 for i in range(7 * 1024 * 1024))
    producer.send(payload)
    msg = consumer.receive(timeout_millis=20000)
    assert msg.data() == payload
    consumer.acknowledge(msg)
