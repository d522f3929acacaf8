"""Many topics on etcd (issue 19's topic loading at scale, at test size):
topics auto-created by their producers, hundreds at once, are all recorded
in etcd and listed; after a clean broker restart (nothing loaded) they are
listed again, and topics load lazily at their first use with what they
held. `bench/many_topics.py --store etcd` is the 100,000-topic figure.
"""

import random
import subprocess

import pulsar

from harness import Cluster

TOPICS = 1000
PICKED = 12


def client_of(url):
    return pulsar.Client(
        url,
        operation_timeout_seconds=30,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )


def listed(c):
    status, topics = c.http("GET", "/admin/v2/persistent/public/default")
    assert status == 200, (status, topics)
    return set(topics)


def read_all(client, topic):
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    while reader.has_message_available():
        got.append(reader.read_next(timeout_millis=10000).data())
    reader.close()
    return got


def test_topics_created_at_once_on_etcd_are_listed_and_load_lazily_after_a_restart():
    c = Cluster(
        bookies=1,
        brokers=1,
        broker_args=["--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1"],
    )
    try:
        broker = c.brokers[0]
        created = subprocess.run(
            [
                c.vela, "perf", "produce", "persistent://public/default/many",
                "-u", c.url_of(broker, "pulsar"), "--admin-url", c.url_of(broker, "http"),
                "-t", str(TOPICS), "--idle", "--test-duration", "1", "--connections", "4",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert created.returncode == 0, created.stdout[-2000:] + created.stderr[-2000:]
        expected = {"persistent://public/default/many-%d" % i for i in range(TOPICS)}
        assert listed(c) == expected

        picked = random.sample(sorted(expected), PICKED)
        client = client_of(c.url_of(broker, "pulsar"))
        for topic in picked:
            producer = client.create_producer(topic, batching_enabled=False)
            producer.send(b"before")
            producer.close()
        client.close()

        assert broker.terminate(), "the broker did not stop cleanly"
        broker.start()
        assert listed(c) == expected, "the listing after a restart"

        client = client_of(c.url_of(broker, "pulsar"))
        for topic in picked:
            producer = client.create_producer(topic, batching_enabled=False)
            producer.send(b"after")
            producer.close()
            assert read_all(client, topic) == [b"before", b"after"], topic
        # Topics never written load too, empty.
        for topic in random.sample(sorted(expected - set(picked)), PICKED):
            assert read_all(client, topic) == [], topic
        client.close()
        assert listed(c) == expected
    finally:
        c.close()
