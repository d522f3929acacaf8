"""Topic termination with the official Python client (the C++ client):
the REST answer (the last message id), producers refused with
TopicTerminated (the open one and new ones), consumers still read
everything, and all of it survives a broker restart; `vela admin topics
terminate` as pulsar-admin prints it.

The C++ client has no case for REACHED_END_OF_TOPIC (it closes its
connection on it), so the broker never sends it one: its consumer stays
on the same connection after reading the last message."""

import json
import os
import subprocess
import sys
import time
import uuid

import pulsar
import pytest
from conftest import http, restart, start_broker, stop_broker

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))
from velaproc import vela_binary  # noqa: E402


def path_of(topic):
    return "/admin/v2/persistent/public/default/" + topic.split("/")[-1]


def client_of(broker):
    return pulsar.Client(
        broker.url, operation_timeout_seconds=10, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )


def send_fails_with_terminated(producer, deadline_s=10):
    """The producer learns of the termination when the broker closes it; a
    send meanwhile may still be in flight."""
    deadline = time.time() + deadline_s
    while time.time() < deadline:
        try:
            producer.send(b"too late")
        except pulsar.TopicTerminated:
            return True
        time.sleep(0.1)
    return False


def consumer_address(broker, topic, subscription):
    status, body = http(broker, "GET", path_of(topic) + "/stats")
    assert status == 200, body
    consumers = json.loads(body)["subscriptions"][subscription]["consumers"]
    return consumers[0]["address"] if consumers else None


def test_terminated_topics_refuse_producers_and_survive_a_restart():
    broker = start_broker()
    topic = "persistent://public/default/term-" + uuid.uuid4().hex[:10]
    try:
        client = client_of(broker)
        producer = client.create_producer(topic, batching_enabled=False)
        ids = [producer.send(b"m%d" % i) for i in range(3)]
        status, body = http(broker, "POST", path_of(topic) + "/terminate")
        assert status == 200, body
        last = json.loads(body)
        assert (last["ledgerId"], last["entryId"]) == (ids[-1].ledger_id(), ids[-1].entry_id())
        assert last["partitionIndex"] == -1
        # Again: the same answer.
        assert json.loads(http(broker, "POST", path_of(topic) + "/terminate")[1]) == last
        assert send_fails_with_terminated(producer)
        with pytest.raises(pulsar.TopicTerminated):
            client.create_producer(topic)
        consumer = client.subscribe(topic, "reader", initial_position=pulsar.InitialPosition.Earliest)
        assert [consumer.receive(timeout_millis=5000).data() for _ in range(3)] == [b"m0", b"m1", b"m2"]
        client.close()

        broker = restart_stopped(broker)
        client = client_of(broker)
        with pytest.raises(pulsar.TopicTerminated):
            client.create_producer(topic)
        consumer = client.subscribe(topic, "after-restart", initial_position=pulsar.InitialPosition.Earliest)
        messages = [consumer.receive(timeout_millis=5000) for _ in range(3)]
        assert [m.data() for m in messages] == [b"m0", b"m1", b"m2"]
        consumer.acknowledge_cumulative(messages[-1])
        address = consumer_address(broker, topic, "after-restart")
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=1500)
        # Still the same connection: nothing made the C++ client reconnect.
        assert consumer_address(broker, topic, "after-restart") == address
        client.close()
    finally:
        stop_broker(broker)


def restart_stopped(broker):
    """Stops `broker` (SIGTERM) and starts it again on its data."""
    assert broker.terminate(30)
    return restart(broker)


def test_partitioned_termination_and_the_cli(broker):
    base = "persistent://public/default/term-p-" + uuid.uuid4().hex[:8]
    status, body = http(broker, "PUT", path_of(base) + "/partitions", "2")
    assert status == 204, body
    status, body = http(broker, "POST", path_of(base) + "/terminate")
    assert status == 405 and "partitioned topic" in json.loads(body)["reason"]
    status, body = http(broker, "POST", path_of(base) + "/terminate/partitions")
    assert status == 200, body
    assert sorted(json.loads(body)) == ["0", "1"]

    plain = "persistent://public/default/term-cli-" + uuid.uuid4().hex[:8]
    status, _ = http(broker, "PUT", path_of(plain), "{}")
    assert status == 204
    out = subprocess.run(
        [vela_binary(), "admin", "--admin-url", broker.http_url, "topics", "terminate", plain],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Topic successfully terminated at "), out.stdout
    assert out.stdout.strip().endswith(":-1:-1"), out.stdout  # empty topic: entry -1, no partition
    status, body = http(broker, "POST", "/admin/v2/persistent/public/default/term-missing-x/terminate")
    assert status == 404
