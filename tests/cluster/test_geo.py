"""Geo-replication between two real clusters on etcd (issue 23): clusters
`a` and `b`, each its own etcd, 2 bookies and 2 brokers (`vela broker
--cluster-name`), each recording the other through the admin API; the
namespace `geo/ns` replicates both ways. A topic's replicator runs on the
broker that owns the topic (loaded on lookup) and produces to the other
cluster, whose client follows its lookups to the owner there.

Checked with the official Python client: what is produced on `a` arrives
on `b` once and in order, and the other way round; a replicated
subscription consumed half on `a` resumes on `b` where it was
acknowledged (nothing lost). Timeouts only bound a failure."""

import json
import os
import sys
import time
import uuid

import pulsar
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))

from harness import Cluster  # noqa: E402

COUNT = 200
WAIT_S = 60


def client_of(url):
    return pulsar.Client(
        url,
        operation_timeout_seconds=30,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )


def ok(answer, what):
    status, body = answer
    assert 200 <= status < 300 or status == 409, (what, status, body)


@pytest.fixture(scope="module")
def clusters():
    snapshot_ms = ["--replicated-subscriptions-snapshot-frequency-ms", "200"]
    a = Cluster(bookies=2, brokers=2, broker_args=["--cluster-name", "a"] + snapshot_ms)
    b = None
    try:
        b = Cluster(bookies=2, brokers=2, broker_args=["--cluster-name", "b"] + snapshot_ms)
        for here, name, there in ((a, "b", b), (b, "a", a)):
            record = {
                "serviceUrl": there.url_of(there.brokers[0], "http"),
                "brokerServiceUrl": there.service_url(),
            }
            ok(here.http("PUT", "/admin/v2/clusters/" + name, json.dumps(record)),
               "record of " + name)
        for side in (a, b):
            ok(side.http("PUT", "/admin/v2/tenants/geo",
                         json.dumps({"adminRoles": [], "allowedClusters": ["a", "b"]})), "tenant")
            ok(side.http("PUT", "/admin/v2/namespaces/geo/ns"), "namespace")
            ok(side.http("POST", "/admin/v2/namespaces/geo/ns/replication",
                         json.dumps(["a", "b"])), "replication")
        yield a, b
    finally:
        if os.environ.get("VELA_CLUSTER_LOGS"):
            print(a.logs())
            if b:
                print(b.logs())
        a.close()
        if b:
            b.close()


def receive_values(consumer, count, what, last_id=None):
    """`count` messages' values; `last_id` (a list) gets the last one's
    (ledger, entry)."""
    values = []
    while len(values) < count:
        message = consumer.receive(timeout_millis=WAIT_S * 1000)
        consumer.acknowledge(message)
        values.append(message.data().decode())
        if last_id is not None:
            last_id[:] = [message.message_id().ledger_id(), message.message_id().entry_id()]
    return values


def test_both_ways_between_two_etcd_clusters(clusters):
    a, b = clusters
    topic = "persistent://geo/ns/both-" + uuid.uuid4().hex[:8]
    client_a, client_b = client_of(a.service_url()), client_of(b.service_url())
    on_a = client_a.subscribe(topic, "check", initial_position=pulsar.InitialPosition.Earliest)
    on_b = client_b.subscribe(topic, "check", initial_position=pulsar.InitialPosition.Earliest)
    producer_a = client_a.create_producer(topic, batching_enabled=False)
    producer_b = client_b.create_producer(topic, batching_enabled=False)
    from_a = ["a-%d" % i for i in range(COUNT)]
    from_b = ["b-%d" % i for i in range(COUNT)]
    for value in from_a:
        producer_a.send(value.encode())
    for value in from_b:
        producer_b.send(value.encode())
    for consumer, side in ((on_a, "a"), (on_b, "b")):
        got = receive_values(consumer, 2 * COUNT, side)
        assert [v for v in got if v.startswith("a-")] == from_a, side
        assert [v for v in got if v.startswith("b-")] == from_b, side
    client_a.close()
    client_b.close()


def test_a_replicated_subscription_fails_over_to_the_other_cluster(clusters):
    a, b = clusters
    topic = "persistent://geo/ns/failover-" + uuid.uuid4().hex[:8]
    client_a, client_b = client_of(a.service_url()), client_of(b.service_url())
    consumer = client_a.subscribe(topic, "s", replicate_subscription_state_enabled=True,
                                  initial_position=pulsar.InitialPosition.Earliest)
    check_b = client_b.subscribe(topic, "check", initial_position=pulsar.InitialPosition.Earliest)
    producer = client_a.create_producer(topic, batching_enabled=False)
    values = ["m-%d" % i for i in range(COUNT)]
    half = COUNT // 2
    for value in values[:half]:
        producer.send(value.encode())
    assert receive_values(consumer, half, "on a") == values[:half]
    landed = []
    assert receive_values(check_b, half, "check on b", landed) == values[:half]
    # b's subscription follows a's acknowledgements: its mark-delete
    # position on b comes to pass where the first half landed there.
    name = topic[len("persistent://"):]
    owner = b.owner_of(topic)
    deadline = time.monotonic() + WAIT_S
    while True:
        status, stats = b.http("GET", "/admin/v2/persistent/%s/internalStats" % name, broker=owner)
        at = None
        if status == 200:
            text = stats.get("cursors", {}).get("s", {}).get("markDeletePosition")
            if text and ":" in text:
                at = [int(x) for x in text.split(":")]
        if at is not None and at >= landed:
            break
        assert time.monotonic() < deadline, ("b's subscription never followed", landed, status, stats)
        time.sleep(0.2)
    for value in values[half:]:
        producer.send(value.encode())
    assert receive_values(check_b, COUNT - half, "check on b") == values[half:]
    consumer.close()
    on_b = client_b.subscribe(topic, "s", replicate_subscription_state_enabled=True)
    assert receive_values(on_b, COUNT - half, "failed over to b") == values[half:]
    client_a.close()
    client_b.close()
