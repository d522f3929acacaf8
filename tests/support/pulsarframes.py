"""Raw Pulsar frames for tests that talk the protocol by hand (malformed
input, a producer whose sends must be watched one by one): a tiny protobuf
encoder/decoder for the few fields used, CONNECT, PRODUCER and SEND frames,
and reading commands back."""

import socket
import struct
import time

READ_TIMEOUT_S = 5


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(num, value):
    return varint(num << 3) + varint(value)


def field_bytes(num, data):
    if isinstance(data, str):
        data = data.encode()
    return varint((num << 3) | 2) + varint(len(data)) + data


def base_command(cmd_type, field_num, body):
    return field_varint(1, cmd_type) + field_bytes(field_num, body)


def simple_frame(command):
    return struct.pack(">II", 4 + len(command), len(command)) + command


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def send_frame(producer_id, sequence_id, payload, corrupt=False):
    command = base_command(6, 6, field_varint(1, producer_id) + field_varint(2, sequence_id))
    metadata = field_bytes(1, "p") + field_varint(2, sequence_id) + field_varint(3, 1700000000000)
    covered = struct.pack(">I", len(metadata)) + metadata + payload
    checksum = crc32c(covered) ^ (1 if corrupt else 0)
    tail = b"\x0e\x01" + struct.pack(">I", checksum) + covered
    return struct.pack(">II", 4 + len(command) + len(tail), len(command)) + command + tail


CONNECT = simple_frame(base_command(2, 2, field_bytes(1, "raw-test") + field_varint(4, 21)))


def parse_fields(data):
    """Top-level protobuf fields: {num: [value, ...]} (varints as int, others as bytes)."""
    fields = {}
    i = 0
    while i < len(data):
        key, i = read_varint(data, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = read_varint(data, i)
        elif wire == 2:
            length, i = read_varint(data, i)
            value, i = data[i : i + length], i + length
        elif wire == 1:
            value, i = data[i : i + 8], i + 8
        elif wire == 5:
            value, i = data[i : i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wire)
        fields.setdefault(num, []).append(value)
    return fields


def read_varint(data, i):
    shift = result = 0
    while True:
        b = data[i]
        i += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, i


def read_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return buf


def read_command(sock):
    """Next command as (type, body fields)."""
    total, cmd_size = struct.unpack(">II", read_exact(sock, 8))
    command = read_exact(sock, cmd_size)
    rest = total - 4 - cmd_size
    if rest:
        read_exact(sock, rest)
    fields = parse_fields(command)
    cmd_type = fields[1][0]
    body = parse_fields(fields[cmd_type][0]) if cmd_type in fields else {}
    return cmd_type, body


def producer_frame(topic, producer_id, request_id, name=None):
    """PRODUCER (type 5, field 5)."""
    body = field_bytes(1, topic) + field_varint(2, producer_id) + field_varint(3, request_id)
    if name:
        body += field_bytes(4, name)
    return simple_frame(base_command(5, 5, body))


def open_connection(host, port, timeout=READ_TIMEOUT_S):
    """A socket after the CONNECT/CONNECTED handshake."""
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.sendall(CONNECT)
    cmd_type, _ = read_command(sock)
    assert cmd_type == 3, "expected CONNECTED, got %d" % cmd_type
    return sock


def assert_closed(sock):
    deadline = time.time() + READ_TIMEOUT_S
    while time.time() < deadline:
        try:
            data = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return
        except socket.timeout:
            continue
        if not data:
            return
    raise AssertionError("the broker did not close the connection")
