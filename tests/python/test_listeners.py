"""Advertised listeners with the official Python client (the C++ client):
`--advertised-listeners` on `vela standalone`, lookups by listener name
(binary: the client's listener_name; HTTP: `listenerName` or the
X-Pulsar-ListenerName header) answered with that listener's URLs, an
unknown name refused as Pulsar refuses it."""

import json
import urllib.error
import urllib.request
import uuid

import pulsar
import pytest
from conftest import start_broker, stop_broker
from velaproc import free_port


@pytest.fixture(scope="module")
def listening():
    port = free_port()
    # `internal` is what the broker publishes as its own; `external` names
    # the same port under another host name, as a NAT address would.
    b = start_broker([
        "--port", str(port),
        "--advertised-listeners",
        "internal:pulsar://127.0.0.1:%d,external:pulsar://localhost:%d" % (port, port),
    ])
    b.listen_port = port
    yield b
    stop_broker(b)


def lookup(broker, query="", headers=None):
    req = urllib.request.Request(
        broker.http_url + "/lookup/v2/topic/persistent/public/default/listened" + query,
        headers=headers or {},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_clients_naming_a_listener_get_its_urls(listening):
    topic = "persistent://public/default/lst-" + uuid.uuid4().hex[:8]
    client = pulsar.Client(
        listening.url,
        listener_name="external",
        operation_timeout_seconds=10,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    consumer = client.subscribe(topic, "s")
    producer = client.create_producer(topic)
    producer.send(b"through localhost")
    assert consumer.receive(timeout_millis=5000).data() == b"through localhost"
    client.close()


def test_an_unknown_listener_is_refused(listening):
    client = pulsar.Client(
        listening.url,
        listener_name="nope",
        operation_timeout_seconds=3,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    with pytest.raises(pulsar.PulsarException):
        client.create_producer("persistent://public/default/lst-nope")
    client.close()


def test_http_lookups_by_listener(listening):
    port = listening.listen_port
    status, body = lookup(listening)
    assert status == 200 and body["brokerUrl"] == "pulsar://127.0.0.1:%d" % port
    status, body = lookup(listening, "?listenerName=external")
    assert status == 200 and body["brokerUrl"] == "pulsar://localhost:%d" % port
    status, body = lookup(listening, headers={"X-Pulsar-ListenerName": "external"})
    assert status == 200 and body["brokerUrl"] == "pulsar://localhost:%d" % port
    # Pulsar 4.0 answers 500 with its "unexpected error" reason.
    status, body = lookup(listening, "?listenerName=nope")
    assert status == 500
    assert "the broker do not have nope listener" in body["reason"]


def test_bad_listener_values_stop_the_broker_at_start():
    with pytest.raises(Exception):
        start_broker(["--advertised-listeners", "a:pulsar://h:1,b:pulsar://h:1"])
