"""Broker limits (issue 8): connections in all and per client IP, producers and
consumers per topic, consumers per subscription, the largest message, and a
topic's publish rate, each set by a `vela standalone` flag and hit with the
official client (and raw frames where the client cannot go past a limit)."""

import socket
import struct
import time
import uuid

import pulsar
import pytest

from conftest import start_broker, stop_broker
from pulsarframes import (
    CONNECT,
    READ_TIMEOUT_S,
    assert_closed,
    base_command,
    field_varint,
    open_connection,
    producer_frame,
    read_command,
    simple_frame,
)

ERROR = 14
CONNECTED = 3
NOT_ALLOWED_ERROR = 22  # ServerError.NotAllowedError
PRODUCER_BUSY = 16  # ServerError.ProducerBusy

PRODUCERS_MAX = 2
CONSUMERS_PER_TOPIC_MAX = 3
CONSUMERS_PER_SUBSCRIPTION_MAX = 2
MESSAGE_SIZE_MAX = 64 * 1024
PUBLISH_MSG_RATE = 50
PUBLISH_BYTE_RATE = 100_000


@pytest.fixture(scope="module")
def limited():
    """A broker with small topic limits (connections unlimited)."""
    b = start_broker(
        [
            "--max-producers-per-topic",
            str(PRODUCERS_MAX),
            "--max-consumers-per-topic",
            str(CONSUMERS_PER_TOPIC_MAX),
            "--max-consumers-per-subscription",
            str(CONSUMERS_PER_SUBSCRIPTION_MAX),
            "--max-message-size",
            str(MESSAGE_SIZE_MAX),
            "--publish-max-msg-rate-per-topic",
            str(PUBLISH_MSG_RATE),
            "--publish-max-byte-rate-per-topic",
            str(PUBLISH_BYTE_RATE),
        ]
    )
    yield b
    stop_broker(b)


@pytest.fixture
def limited_client(limited):
    c = pulsar.Client(
        limited.url,
        operation_timeout_seconds=10,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    yield c
    c.close()


def new_topic(what):
    return "persistent://public/default/limit-%s-%s" % (what, uuid.uuid4().hex[:8])


# ---------------------------------------------------------------------------
# Connections.


def raw_connect(broker, source_ip="127.0.0.1"):
    """A socket from `source_ip`; returns (socket, first command) where the
    first command is CONNECTED after our CONNECT, or the broker's refusal."""
    sock = socket.socket()
    sock.settimeout(READ_TIMEOUT_S)
    sock.bind((source_ip, 0))
    sock.connect((broker.host, broker.port))
    try:
        sock.sendall(CONNECT)
    except (BrokenPipeError, ConnectionResetError):
        pass
    return sock, read_command(sock)


def assert_refused(sock, first, needle):
    cmd_type, body = first
    assert cmd_type == ERROR, "expected ERROR, got %d" % cmd_type
    assert body[2] == [NOT_ALLOWED_ERROR]
    message = body[3][0].decode()
    assert needle in message, message
    assert_closed(sock)


def test_connections_are_capped_in_all_and_per_ip():
    broker = start_broker(["--max-connections", "4", "--max-connections-per-ip", "2"])
    held = []
    try:
        for _ in range(2):
            sock, (cmd_type, _) = raw_connect(broker, "127.0.0.1")
            assert cmd_type == CONNECTED
            held.append(sock)
        # A third from the same address: its share is used up.
        sock, first = raw_connect(broker, "127.0.0.1")
        assert_refused(sock, first, "maximum number of connections on address 127.0.0.1 (2)")
        sock.close()
        # The official client from there is refused too, with an error, not a hang.
        client = pulsar.Client(
            broker.url,
            operation_timeout_seconds=5,
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        )
        started = time.time()
        with pytest.raises(pulsar.PulsarException):
            client.create_producer(new_topic("conn"))
        assert time.time() - started < 30
        client.close()
        # Other addresses have their own share, up to the total.
        for _ in range(2):
            sock, (cmd_type, _) = raw_connect(broker, "127.0.0.2")
            assert cmd_type == CONNECTED
            held.append(sock)
        sock, first = raw_connect(broker, "127.0.0.3")
        assert_refused(sock, first, "maximum number of connections (4)")
        sock.close()
        # A connection that closes frees its place.
        held.pop(0).close()
        deadline = time.time() + 10
        while True:
            client = pulsar.Client(
                broker.url,
                operation_timeout_seconds=5,
                logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
            )
            try:
                producer = client.create_producer(new_topic("conn"))
                producer.send(b"fits again")
                break
            except pulsar.PulsarException:
                assert time.time() < deadline, "a freed connection place was not reused"
                time.sleep(0.2)
            finally:
                client.close()
    finally:
        for sock in held:
            sock.close()
        stop_broker(broker)


# ---------------------------------------------------------------------------
# Producers and consumers.


def test_producers_per_topic_are_capped_with_producer_busy(limited_client):
    topic = new_topic("producers")
    producers = [limited_client.create_producer(topic) for _ in range(PRODUCERS_MAX)]
    with pytest.raises(pulsar.ProducerBusy):
        limited_client.create_producer(topic)
    # Another topic is not affected.
    limited_client.create_producer(new_topic("producers")).send(b"other topic")
    producers.pop().close()
    replacement = limited_client.create_producer(topic)
    replacement.send(b"after one closed")


def test_producer_busy_names_the_limit(limited):
    topic = new_topic("producers-raw")
    sock = open_connection(limited.host, limited.port)
    try:
        for producer_id in range(PRODUCERS_MAX):
            sock.sendall(producer_frame(topic, producer_id, producer_id))
            cmd_type, _ = read_command(sock)
            assert cmd_type == 17, "expected PRODUCER_SUCCESS, got %d" % cmd_type
        sock.sendall(producer_frame(topic, 99, 99))
        cmd_type, body = read_command(sock)
        assert cmd_type == ERROR
        assert body[2] == [PRODUCER_BUSY]
        assert "max producers limit (%d)" % PRODUCERS_MAX in body[3][0].decode()
    finally:
        sock.close()


def test_consumers_per_topic_are_capped_with_consumer_busy(limited_client):
    topic = new_topic("consumers")
    consumers = [
        limited_client.subscribe(topic, "sub-%d" % i) for i in range(CONSUMERS_PER_TOPIC_MAX)
    ]
    with pytest.raises(pulsar.ConsumerBusy):
        limited_client.subscribe(topic, "one-too-many")
    consumers.pop().close()
    limited_client.subscribe(topic, "after-one-closed")


def test_consumers_per_subscription_are_capped_with_consumer_busy(limited_client):
    topic = new_topic("subscription")
    consumers = [
        limited_client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared)
        for _ in range(CONSUMERS_PER_SUBSCRIPTION_MAX)
    ]
    with pytest.raises(pulsar.ConsumerBusy):
        limited_client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared)
    consumers.pop().close()
    limited_client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared)


# ---------------------------------------------------------------------------
# Message size.


def test_messages_over_the_max_size_are_refused(limited, limited_client):
    topic = new_topic("size")
    # CONNECTED tells clients the limit...
    sock = socket.create_connection((limited.host, limited.port), timeout=READ_TIMEOUT_S)
    sock.sendall(CONNECT)
    cmd_type, body = read_command(sock)
    assert cmd_type == CONNECTED
    assert body[3] == [MESSAGE_SIZE_MAX]
    sock.close()
    # ...so the client refuses a bigger message itself,
    producer = limited_client.create_producer(topic, batching_enabled=False)
    with pytest.raises(pulsar.MessageTooBig):
        producer.send(b"x" * (MESSAGE_SIZE_MAX + 1))
    producer.send(b"x" * (MESSAGE_SIZE_MAX - 1024))
    # and a frame past it (plus the 10 KiB of headers a frame may add) closes
    # the connection, as in Pulsar.
    sock = open_connection(limited.host, limited.port)
    sock.sendall(producer_frame(topic, 1, 1, name="raw-size"))
    assert read_command(sock)[0] == 17
    command = base_command(6, 6, field_varint(1, 1) + field_varint(2, 0))
    rest = MESSAGE_SIZE_MAX + 20 * 1024
    sock.sendall(struct.pack(">II", 4 + len(command) + rest, len(command)) + command)
    assert_closed(sock)
    sock.close()
    producer.send(b"still fine")


# ---------------------------------------------------------------------------
# Publish rate.


def timed_async_sends(producer, count, size):
    """Sends `count` messages of `size` bytes without waiting for each;
    returns (seconds until every one was acknowledged, errors)."""
    results = []
    started = time.time()
    for i in range(count):
        producer.send_async(b"%08d" % i + b"r" * (size - 8), lambda res, _id: results.append(res))
    deadline = time.time() + 60
    while len(results) < count:
        assert time.time() < deadline, "only %d of %d sends answered" % (len(results), count)
        time.sleep(0.01)
    errors = [r for r in results if r != pulsar.Result.Ok]
    return time.time() - started, errors


def test_publish_message_rate_throttles_without_refusing(limited_client):
    producer = limited_client.create_producer(
        new_topic("msg-rate"), batching_enabled=False, max_pending_messages=1000
    )
    count = 3 * PUBLISH_MSG_RATE
    elapsed, errors = timed_async_sends(producer, count, 100)
    assert not errors, errors[:3]
    # One second of burst, then the rate: (count - rate) / rate seconds at
    # least (less a little for timing).
    expected = (count - PUBLISH_MSG_RATE) / PUBLISH_MSG_RATE
    print("%d messages at %d msg/s: %.2f s" % (count, PUBLISH_MSG_RATE, elapsed))
    assert elapsed >= expected * 0.8, "not throttled: %.2f s" % elapsed
    assert elapsed < expected * 3 + 5


def test_publish_byte_rate_throttles_without_refusing(limited_client):
    # 40 messages stay within the message rate's one-second burst (50), so
    # the byte rate (100 kB/s for 400 KiB) is what holds them.
    size = 10 * 1024
    producer = limited_client.create_producer(
        new_topic("byte-rate"), batching_enabled=False, max_pending_messages=1000
    )
    count = 40
    elapsed, errors = timed_async_sends(producer, count, size)
    assert not errors, errors[:3]
    total = count * size
    expected = (total - PUBLISH_BYTE_RATE) / PUBLISH_BYTE_RATE
    print("%d bytes at %d B/s: %.2f s" % (total, PUBLISH_BYTE_RATE, elapsed))
    assert elapsed >= expected * 0.8, "not throttled: %.2f s" % elapsed
    assert elapsed < expected * 3 + 5


def test_a_throttled_topic_does_not_slow_another(limited, limited_client):
    slow = limited_client.create_producer(
        new_topic("throttled"), batching_enabled=False, max_pending_messages=1000
    )
    for _ in range(PUBLISH_MSG_RATE):
        slow.send_async(b"burst", lambda res, _id: None)
    # Another client (another connection) to another topic goes at full speed.
    other_client = pulsar.Client(
        limited.url,
        operation_timeout_seconds=10,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    try:
        fast = other_client.create_producer(new_topic("free"), batching_enabled=False)
        started = time.time()
        for _ in range(20):
            fast.send(b"free")
        assert time.time() - started < 5
    finally:
        other_client.close()
    slow.flush()

