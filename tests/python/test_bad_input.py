"""Bad input from one client: the broker answers with the protocol's error or
closes that connection (with a log line), and a producer on another
connection keeps working."""

import socket
import struct
import time

import pulsar
import pytest

from pulsarframes import (  # noqa: F401 (shared raw-frame helpers)
    CONNECT,
    assert_closed,
    READ_TIMEOUT_S,
    base_command,
    field_bytes,
    field_varint,
    parse_fields,
    read_command,
    read_exact,
    read_varint,
    send_frame,
    simple_frame,
    varint,
)


def connect(broker, handshake=True):
    sock = socket.create_connection((broker.host, broker.port), timeout=READ_TIMEOUT_S)
    if handshake:
        sock.sendall(CONNECT)
        cmd_type, body = read_command(sock)
        assert cmd_type == 3, "expected CONNECTED"
        assert body[2] == [21]  # protocol_version
        assert body[3] == [5 * 1024 * 1024]  # max_message_size
    return sock


@pytest.fixture
def healthy_producer(client, topic):
    producer = client.create_producer(topic, batching_enabled=False)

    def check():
        producer.send(b"still-working")

    check()
    return check


def wait_for_log(broker, needle, timeout_s=5):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if needle in broker.log_text():
            return
        time.sleep(0.05)
    raise AssertionError("no log line containing %r" % needle)


def test_garbage_bytes_close_the_connection(broker, healthy_producer):
    sock = connect(broker, handshake=False)
    sock.sendall(b"\x00\x00\x00\x10GET / HTTP/1.1\r\n\r\n" + bytes(range(256)))
    assert_closed(sock)
    wait_for_log(broker, "bad frame")
    healthy_producer()


def test_frame_claiming_2_gib_closes_the_connection(broker, healthy_producer):
    sock = connect(broker)
    sock.sendall(struct.pack(">I", 0x7FFFFFF0) + b"\x00" * 64)
    assert_closed(sock)
    wait_for_log(broker, "exceeds the limit")
    healthy_producer()


def test_unknown_command_closes_the_connection(broker, healthy_producer):
    sock = connect(broker)
    sock.sendall(simple_frame(base_command(99, 99, b"")))
    assert_closed(sock)
    healthy_producer()


def test_command_before_connect_closes_the_connection(broker, healthy_producer):
    sock = connect(broker, handshake=False)
    sock.sendall(simple_frame(base_command(18, 18, b"")))  # PING
    assert_closed(sock)
    wait_for_log(broker, "before CONNECT")
    healthy_producer()


def test_send_for_unknown_producer_closes_the_connection(broker, healthy_producer):
    sock = connect(broker)
    sock.sendall(send_frame(producer_id=77, sequence_id=0, payload=b"x"))
    assert_closed(sock)
    wait_for_log(broker, "SEND for unknown producer id 77")
    healthy_producer()


def test_6_mib_frame_closes_the_connection(broker, healthy_producer):
    sock = connect(broker)
    try:
        # A SEND frame announcing 6 MiB (the CRC is never reached: the size
        # is refused from the first 4 bytes).
        command = base_command(6, 6, field_varint(1, 0) + field_varint(2, 0))
        total = 4 + len(command) + 6 * 1024 * 1024
        sock.sendall(struct.pack(">II", total, len(command)) + command + b"\x00" * (1024 * 1024))
    except (ConnectionResetError, BrokenPipeError):
        pass
    assert_closed(sock)
    healthy_producer()


def test_6_mib_message_from_the_official_client_fails(client, topic, healthy_producer):
    producer = client.create_producer(topic, batching_enabled=False, chunking_enabled=False)
    with pytest.raises(Exception):
        producer.send(b"\x00" * (6 * 1024 * 1024))
    healthy_producer()


def create_raw_producer(sock, topic, producer_id=1, request_id=1):
    body = field_bytes(1, topic) + field_varint(2, producer_id) + field_varint(3, request_id)
    sock.sendall(simple_frame(base_command(5, 5, body)))
    return read_command(sock)


def test_invalid_topic_name_gets_an_error(broker, healthy_producer):
    sock = connect(broker)
    cmd_type, body = create_raw_producer(sock, "persistent://bad tenant/ns/x")
    assert cmd_type == 14  # ERROR
    assert body[2] == [17]  # InvalidTopicName
    # The connection stays usable.
    cmd_type, body = create_raw_producer(sock, "persistent://public/default/raw-ok", producer_id=2, request_id=2)
    assert cmd_type == 17  # PRODUCER_SUCCESS
    healthy_producer()


def test_checksum_mismatch_gets_send_error_and_the_stream_goes_on(broker, healthy_producer):
    sock = connect(broker)
    cmd_type, _ = create_raw_producer(sock, "persistent://public/default/raw-crc")
    assert cmd_type == 17
    sock.sendall(send_frame(1, 0, b"good"))
    sock.sendall(send_frame(1, 1, b"bad", corrupt=True))
    sock.sendall(send_frame(1, 2, b"good again"))
    replies = [read_command(sock) for _ in range(3)]
    assert [r[0] for r in replies] == [7, 8, 7]  # RECEIPT, SEND_ERROR, RECEIPT
    assert replies[1][1][3] == [9]  # ChecksumError
    assert [r[1][2] for r in replies] == [[0], [1], [2]]  # sequence ids in order
    healthy_producer()


def test_lookup_and_partitioned_metadata(broker):
    sock = connect(broker)
    sock.sendall(simple_frame(base_command(21, 21, field_bytes(1, "raw-lookup") + field_varint(2, 7))))
    cmd_type, body = read_command(sock)
    assert cmd_type == 22 and body[2] == [7] and body[1] == [0] and body[3] == [0]
    sock.sendall(simple_frame(base_command(23, 23, field_bytes(1, "raw-lookup") + field_varint(2, 8))))
    cmd_type, body = read_command(sock)
    assert cmd_type == 24
    assert body[1] == [broker.url.encode()]  # brokerServiceUrl
    assert body[3] == [1]  # Connect
    assert body[5] == [1]  # authoritative
    sock.sendall(simple_frame(base_command(21, 21, field_bytes(1, "nope/ns/x") + field_varint(2, 9))))
    cmd_type, body = read_command(sock)
    assert cmd_type == 22 and body[3] == [1]  # Failed


def test_keepalive_closes_a_silent_connection():
    from conftest import start_broker, stop_broker

    b = start_broker(["--keepalive-s", "1"])
    try:
        sock = connect(b)
        # The broker pings; a client that never answers is closed after one round.
        saw_ping = False
        deadline = time.time() + READ_TIMEOUT_S
        while time.time() < deadline:
            try:
                cmd_type, _ = read_command(sock)
            except EOFError:
                break
            saw_ping |= cmd_type == 18
        else:
            raise AssertionError("silent connection was not closed")
        assert saw_ping
        wait_for_log(b, "keep-alive timeout")
        # A connection that answers PINGs stays open.
        sock = connect(b)
        end = time.time() + 2.0
        while time.time() < end:
            cmd_type, _ = read_command(sock)
            if cmd_type == 18:
                sock.sendall(simple_frame(base_command(19, 19, b"")))
        sock.sendall(simple_frame(base_command(18, 18, b"")))
        while True:
            cmd_type, _ = read_command(sock)
            if cmd_type == 19:
                break
    finally:
        stop_broker(b)
