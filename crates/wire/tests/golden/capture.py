#!/usr/bin/env python3
"""Capture golden Pulsar frames from the official Python client (pulsar-client).

This script starts a tiny fake broker on 127.0.0.1 (a free port) that speaks just
enough of the Pulsar binary protocol for the official client to create a producer
and send: CONNECTED, PARTITIONED_METADATA_RESPONSE, LOOKUP_RESPONSE (Connect, to
itself), PRODUCER_SUCCESS, SEND_RECEIPT, SUCCESS (CLOSE_PRODUCER) and PONG. Every
frame the client sends is recorded raw and whole (4-byte total size included).
It then runs the client, one subprocess per scenario (this same file with
`--client PORT SCENARIO`), through unbatched and batched sends with each
compression type (NONE, LZ4, ZLIB, ZSTD, SNAPPY), and writes one `.bin` file per
kept frame next to this script, plus MANIFEST.txt saying what the client was asked
to send and what varies per run (publish_time, client version string). The Rust
test `crates/wire/tests/golden.rs` decodes every file and checks each field.
Stdlib only (the protobuf replies are hand-encoded below). Regenerate with:

    python3 crates/wire/tests/golden/capture.py

(needs `python3 -m pip install pulsar-client`; rerunning changes publish_time and
CRCs, so commit the .bin files and MANIFEST.txt together).

Observed with pulsar-client 3.13.0 (C++ client 4.2.0): CONNECT says protocol v20
with FeatureFlags {1, 2}; the client compresses whenever a codec is set, even when
the output is larger (a 19-byte message becomes 21 bytes of LZ4); a batch's
MessageMetadata takes partition_key from its first message, and each
SingleMessageMetadata carries its own sequence_id; SEND sets num_messages only for
batches and never highest_sequence_id.
"""

import os
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib

OUT_DIR = os.path.dirname(os.path.abspath(__file__))

# Frames above this are refused by the fake broker; the client never sends them here.
FRAME_BYTES_MAX = 5 * 1024 * 1024 + 10 * 1024
MAX_MESSAGE_SIZE = 5242880
SERVER_VERSION = "vela-golden-capture"
SCENARIO_TIMEOUT_S = 60

# ---------------------------------------------------------------------------
# Scenario definitions (the Rust test mirrors these constants; keep them in step).
# ---------------------------------------------------------------------------

TOPIC_PREFIX = "persistent://public/default/golden-"
PRODUCER_PROPERTIES = [("app", "vela-golden"), ("owner", "wire-tests")]
EVENT_TIMESTAMP_MS = 1700000000123
LARGE_PAYLOAD = b"The quick brown fox jumps over the lazy dog. " * 46  # 2070 bytes

# Unbatched: two SENDs per scenario.
NOBATCH_MESSAGES = [
    dict(
        suffix="",
        payload=b"hello vela golden 0",
        partition_key="key-nobatch",
        properties=[("color", "blue"), ("idx", "0")],
        event_timestamp=EVENT_TIMESTAMP_MS,
    ),
    dict(
        suffix="_large",
        payload=LARGE_PAYLOAD,
        partition_key=None,
        properties=[],
        event_timestamp=None,
    ),
]

# Batched: one SEND carrying these three messages.
BATCH_MESSAGES = [
    dict(
        payload=b"batch message 0 " * 8,
        partition_key="key-a",
        ordering_key=None,
        properties=[("idx", "0")],
        event_timestamp=EVENT_TIMESTAMP_MS,
    ),
    dict(
        payload=b"batch message 1 " * 8,
        partition_key="key-b",
        ordering_key=b"order-b",
        properties=[("idx", "1"), ("kind", "second")],
        event_timestamp=EVENT_TIMESTAMP_MS + 1,
    ),
    dict(
        payload=b"batch message 2",
        partition_key=None,
        ordering_key=None,
        properties=[],
        event_timestamp=None,
    ),
]

COMPRESSIONS = [
    # (file tag, pulsar.CompressionType member name, proto enum value)
    ("none", "NONE", 0),
    ("lz4", "LZ4", 1),
    ("zlib", "ZLib", 2),
    ("zstd", "ZSTD", 3),
    ("snappy", "SNAPPY", 4),
]


def scenarios():
    out = []
    for tag, member, value in COMPRESSIONS:
        out.append(dict(name=f"nobatch_{tag}", batched=False, comp_tag=tag, comp_member=member, comp_value=value))
        out.append(dict(name=f"batch_{tag}", batched=True, comp_tag=tag, comp_member=member, comp_value=value))
    return out


def producer_name(scenario):
    return "golden-" + scenario["name"].replace("_", "-")


def topic(scenario):
    return TOPIC_PREFIX + scenario["name"].replace("_", "-")


# ---------------------------------------------------------------------------
# Minimal protobuf (proto2 wire format) encoder and decoder.
# ---------------------------------------------------------------------------

def enc_varint(n):
    n &= (1 << 64) - 1  # negative int64 -> two's complement, 10 bytes
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def f_varint(num, value):
    return enc_varint(num << 3 | 0) + enc_varint(value)


def f_bytes(num, value):
    if isinstance(value, str):
        value = value.encode()
    return enc_varint(num << 3 | 2) + enc_varint(len(value)) + value


def dec_varint(buf, pos):
    n = 0
    shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("bad varint")
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, pos


def dec_fields(buf):
    """Returns (dict field -> list of values, list of (field, wiretype) in order)."""
    fields = {}
    order = []
    pos = 0
    while pos < len(buf):
        key, pos = dec_varint(buf, pos)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, pos = dec_varint(buf, pos)
        elif wt == 2:
            ln, pos = dec_varint(buf, pos)
            v = bytes(buf[pos:pos + ln])
            if len(v) != ln:
                raise ValueError("truncated field")
            pos += ln
        elif wt == 1:
            v = buf[pos:pos + 8]
            pos += 8
        elif wt == 5:
            v = buf[pos:pos + 4]
            pos += 4
        else:
            raise ValueError(f"wire type {wt}")
        fields.setdefault(num, []).append(v)
        order.append(num)
    return fields, order


def first(fields, num, default=None):
    vals = fields.get(num)
    return vals[0] if vals else default


# CRC32C (Castagnoli), reflected polynomial 0x82F63B78.
_CRC_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC_TABLE.append(_c)


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


# BaseCommand.Type values used here (sub-message field number == type value).
T_CONNECT, T_CONNECTED, T_PRODUCER, T_SEND, T_SEND_RECEIPT = 2, 3, 5, 6, 7
T_SUCCESS, T_CLOSE_PRODUCER, T_PRODUCER_SUCCESS, T_PING, T_PONG = 13, 15, 17, 18, 19
T_PARTITIONED_METADATA, T_PARTITIONED_METADATA_RESPONSE = 21, 22
T_LOOKUP, T_LOOKUP_RESPONSE = 23, 24
TYPE_NAMES = {
    T_CONNECT: "CONNECT", T_PRODUCER: "PRODUCER", T_SEND: "SEND", T_CLOSE_PRODUCER: "CLOSE_PRODUCER",
    T_PING: "PING", T_PONG: "PONG", T_PARTITIONED_METADATA: "PARTITIONED_METADATA", T_LOOKUP: "LOOKUP",
}


def simple_frame(cmd_type, sub):
    cmd = f_varint(1, cmd_type) + f_bytes(cmd_type, sub)
    return struct.pack(">II", 4 + len(cmd), len(cmd)) + cmd


class Frame:
    """A frame received from the client, parsed enough to answer it."""

    def __init__(self, raw):
        self.raw = raw
        (cmd_size,) = struct.unpack(">I", raw[4:8])
        cmd = raw[8:8 + cmd_size]
        base, _ = dec_fields(cmd)
        self.type = first(base, 1)
        sub = first(base, self.type, b"")
        self.sub, self.sub_order = dec_fields(sub)
        self.rest = raw[8 + cmd_size:]
        self.metadata = None
        self.payload = None
        self.crc_ok = None
        if self.rest:
            rest = self.rest
            if rest[:2] == b"\x0e\x01":
                (crc,) = struct.unpack(">I", rest[2:6])
                self.crc_ok = crc32c(rest[6:]) == crc
                rest = rest[6:]
            (meta_size,) = struct.unpack(">I", rest[:4])
            self.metadata, _ = dec_fields(rest[4:4 + meta_size])
            self.payload = rest[4 + meta_size:]


# ---------------------------------------------------------------------------
# Fake broker.
# ---------------------------------------------------------------------------

class FakeBroker:
    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.frames = []  # every Frame received, in arrival order, all connections
        self.errors = []
        self.ledger_id = 7
        self.entry_id = 0
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def _accept_loop(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        try:
            with conn:
                while True:
                    head = _recv_exact(conn, 4)
                    if head is None:
                        return
                    (total,) = struct.unpack(">I", head)
                    if total > FRAME_BYTES_MAX:
                        raise ValueError(f"frame of {total} bytes")
                    body = _recv_exact(conn, total)
                    if body is None:
                        raise ValueError("connection closed mid-frame")
                    frame = Frame(head + body)
                    with self.lock:
                        self.frames.append(frame)
                    reply = self._reply(frame)
                    if reply:
                        conn.sendall(reply)
        except Exception as e:  # recorded and reported by the driver
            with self.lock:
                self.errors.append(repr(e))

    def _reply(self, f):
        s = f.sub
        if f.type == T_CONNECT:
            sub = (f_bytes(1, SERVER_VERSION) + f_varint(2, first(s, 4, 0))
                   + f_varint(3, MAX_MESSAGE_SIZE))
            return simple_frame(T_CONNECTED, sub)
        if f.type == T_PARTITIONED_METADATA:
            sub = f_varint(1, 0) + f_varint(2, first(s, 2)) + f_varint(3, 0)  # Success
            return simple_frame(T_PARTITIONED_METADATA_RESPONSE, sub)
        if f.type == T_LOOKUP:
            sub = (f_bytes(1, f"pulsar://127.0.0.1:{self.port}") + f_varint(3, 1)  # Connect
                   + f_varint(4, first(s, 2)) + f_varint(5, 1))
            return simple_frame(T_LOOKUP_RESPONSE, sub)
        if f.type == T_PRODUCER:
            name = first(s, 4, b"golden-generated")
            sub = f_varint(1, first(s, 3)) + f_bytes(2, name) + f_varint(3, -1) + f_bytes(4, b"")
            return simple_frame(T_PRODUCER_SUCCESS, sub)
        if f.type == T_SEND:
            with self.lock:
                entry = self.entry_id
                self.entry_id += 1
            msg_id = f_varint(1, self.ledger_id) + f_varint(2, entry)
            sub = (f_varint(1, first(s, 1)) + f_varint(2, first(s, 2)) + f_bytes(3, msg_id)
                   + f_varint(4, first(s, 6, 0)))
            return simple_frame(T_SEND_RECEIPT, sub)
        if f.type == T_CLOSE_PRODUCER:
            return simple_frame(T_SUCCESS, f_varint(1, first(s, 2)))
        if f.type == T_PING:
            return simple_frame(T_PONG, b"")
        if f.type == T_PONG:
            return None
        raise ValueError(f"unhandled command type {f.type}")

    def snapshot(self):
        with self.lock:
            return list(self.frames), list(self.errors)


def _recv_exact(conn, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


# ---------------------------------------------------------------------------
# Client side (runs in a subprocess: `capture.py --client PORT SCENARIO`).
# ---------------------------------------------------------------------------

def run_client(port, scenario_name):
    import pulsar

    sc = {s["name"]: s for s in scenarios()}[scenario_name]
    client = pulsar.Client(
        f"pulsar://127.0.0.1:{port}",
        operation_timeout_seconds=20,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
    )
    kwargs = dict(
        producer_name=producer_name(sc),
        compression_type=getattr(pulsar.CompressionType, sc["comp_member"]),
        batching_enabled=sc["batched"],
        properties=dict(PRODUCER_PROPERTIES),
    )
    if sc["batched"]:
        # The batch goes out when it holds all messages (or on flush); the long delay
        # keeps the timer from splitting it.
        kwargs.update(batching_max_messages=len(BATCH_MESSAGES), batching_max_publish_delay_ms=60000)
    producer = client.create_producer(topic(sc), **kwargs)

    def send_kwargs(m):
        kw = dict(properties=dict(m["properties"]) if m["properties"] else None)
        if m.get("partition_key") is not None:
            kw["partition_key"] = m["partition_key"]
        if m.get("ordering_key") is not None:
            kw["ordering_key"] = m["ordering_key"].decode()
        if m.get("event_timestamp") is not None:
            kw["event_timestamp"] = m["event_timestamp"]
        return kw

    if sc["batched"]:
        done = threading.Semaphore(0)
        results = []

        def callback(res, msg_id):
            results.append(res)
            done.release()

        for m in BATCH_MESSAGES:
            producer.send_async(m["payload"], callback, **send_kwargs(m))
        producer.flush()
        for _ in BATCH_MESSAGES:
            if not done.acquire(timeout=20):
                raise SystemExit("batch send timed out")
        if any(r != pulsar.Result.Ok for r in results):
            raise SystemExit(f"batch send failed: {results}")
    else:
        for m in NOBATCH_MESSAGES:
            producer.send(m["payload"], **send_kwargs(m))
    producer.close()
    client.close()


# ---------------------------------------------------------------------------
# Driver.
# ---------------------------------------------------------------------------

def write_bin(name, frame):
    with open(os.path.join(OUT_DIR, name), "wb") as fh:
        fh.write(frame.raw)


def kv_list(fields, num):
    out = []
    for kv in fields.get(num, []):
        d, _ = dec_fields(kv)
        out.append((first(d, 1, b"").decode(), first(d, 2, b"").decode()))
    return out


def fmt_kv(pairs):
    return " ".join(f"{k}={v}" for k, v in pairs) if pairs else "(none)"


def fmt_payload(p):
    if p == LARGE_PAYLOAD:
        return '"The quick brown fox jumps over the lazy dog. " x 46 (2070 bytes)'
    return '"' + p.decode() + '"' 


def main():
    import pulsar

    version = getattr(pulsar, "__version__", "unknown")
    broker = FakeBroker()
    print(f"fake broker on 127.0.0.1:{broker.port}, pulsar-client {version}")
    for old in os.listdir(OUT_DIR):
        if old.endswith(".bin"):
            os.remove(os.path.join(OUT_DIR, old))

    manifest = []
    m = manifest.append
    m("# Golden frames captured from the official Python client by capture.py.")
    m("# Regenerate: python3 crates/wire/tests/golden/capture.py (rewrites this file and every .bin).")
    m("# Format: `[file.bin]` starts a section; `key = value` lines follow. Lines marked")
    m("# `observed` were read back from the captured bytes and differ per run or per version.")
    m(f"pulsar_client_pypi_version = {version}")
    m(f"fake_broker_reply_protocol_version = same as the client's")
    m(f"topic_prefix = {TOPIC_PREFIX}")
    m(f"producer_properties = {fmt_kv(PRODUCER_PROPERTIES)}")
    m("")

    client_version = None
    for index, sc in enumerate(scenarios()):
        before = len(broker.snapshot()[0])
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--client", str(broker.port), sc["name"]],
            timeout=SCENARIO_TIMEOUT_S,
        )
        time.sleep(0.2)  # let the server thread record the last frames
        frames, errors = broker.snapshot()
        if proc.returncode != 0 or errors:
            raise SystemExit(f"scenario {sc['name']} failed: rc={proc.returncode} errors={errors}")
        frames = frames[before:]
        by_type = {}
        for f in frames:
            by_type.setdefault(f.type, []).append(f)
        types = [TYPE_NAMES.get(f.type, str(f.type)) for f in frames]
        print(f"{sc['name']}: {' '.join(types)}")

        if index == 0:
            connect = by_type[T_CONNECT][0]
            client_version = first(connect.sub, 1).decode()
            write_bin("connect.bin", connect)
            m("[connect.bin]")
            m("command = CONNECT")
            m(f"client_version = {client_version}  # observed")
            m(f"protocol_version = {first(connect.sub, 4)}  # observed")
            m(f"auth_method_name = {first(connect.sub, 5, b'(absent)').decode()}  # observed")
            m(f"fields_present = {' '.join(str(n) for n in connect.sub_order)}  # observed")
            m("")
            pm = by_type[T_PARTITIONED_METADATA][0]
            write_bin("partitioned_metadata.bin", pm)
            m("[partitioned_metadata.bin]")
            m("command = PARTITIONED_METADATA")
            m(f"topic = {topic(sc)}")
            m(f"request_id = {first(pm.sub, 2)}  # observed")
            m(f"fields_present = {' '.join(str(n) for n in pm.sub_order)}  # observed")
            m("")
            lk = by_type[T_LOOKUP][0]
            write_bin("lookup.bin", lk)
            m("[lookup.bin]")
            m("command = LOOKUP")
            m(f"topic = {topic(sc)}")
            m(f"request_id = {first(lk.sub, 2)}  # observed")
            m(f"fields_present = {' '.join(str(n) for n in lk.sub_order)}  # observed")
            m("")
            pr = by_type[T_PRODUCER][0]
            write_bin("producer.bin", pr)
            m("[producer.bin]")
            m("command = PRODUCER")
            m(f"topic = {topic(sc)}")
            m(f"producer_name = {producer_name(sc)}")
            m(f"metadata = {fmt_kv(PRODUCER_PROPERTIES)}")
            m(f"producer_id = {first(pr.sub, 2)}  # observed")
            m(f"request_id = {first(pr.sub, 3)}  # observed")
            m(f"fields_present = {' '.join(str(n) for n in pr.sub_order)}  # observed")
            m("")
            cp = by_type[T_CLOSE_PRODUCER][0]
            write_bin("close_producer.bin", cp)
            m("[close_producer.bin]")
            m("command = CLOSE_PRODUCER")
            m(f"producer_id = {first(cp.sub, 1)}  # observed")
            m(f"request_id = {first(cp.sub, 2)}  # observed")
            m("")

        sends = by_type.get(T_SEND, [])
        if sc["batched"]:
            expected = [(f"send_{sc['name']}.bin", None)]
        else:
            expected = [(f"send_{sc['name']}{msg['suffix']}.bin", msg) for msg in NOBATCH_MESSAGES]
        if len(sends) != len(expected):
            raise SystemExit(f"{sc['name']}: expected {len(expected)} SENDs, got {len(sends)}")
        for seq, ((fname, msg), f) in enumerate(zip(expected, sends)):
            if not f.crc_ok:
                raise SystemExit(f"{fname}: missing or bad CRC32C")
            md = f.metadata
            comp = first(md, 8, 0)
            if comp != sc["comp_value"]:
                raise SystemExit(f"{fname}: compression {comp}, expected {sc['comp_value']}")
            if comp == 2:
                body = zlib.decompress(f.payload)
            else:
                body = None
            write_bin(fname, f)
            m(f"[{fname}]")
            m("command = SEND")
            m(f"producer_name = {producer_name(sc)}")
            m(f"compression = {sc['comp_tag']}")
            m(f"batched = {'yes' if sc['batched'] else 'no'}")
            if sc["batched"]:
                m(f"sequence_id = 0")
                m(f"messages_in_batch = {len(BATCH_MESSAGES)}")
                for i, bm in enumerate(BATCH_MESSAGES):
                    m(f"message.{i}.sequence_id = {i}")
                    m(f"message.{i}.payload = {fmt_payload(bm['payload'])}")
                    m(f"message.{i}.partition_key = {bm['partition_key'] or '(none)'}")
                    m(f"message.{i}.ordering_key = {bm['ordering_key'].decode() if bm['ordering_key'] else '(none)'}")
                    m(f"message.{i}.properties = {fmt_kv(bm['properties'])}")
                    m(f"message.{i}.event_time = {bm['event_timestamp'] or '(none)'}")
            else:
                m(f"sequence_id = {seq}")
                m(f"payload = {fmt_payload(msg['payload'])}")
                m(f"partition_key = {msg['partition_key'] or '(none)'}")
                m(f"properties = {fmt_kv(msg['properties'])}")
                m(f"event_time = {msg['event_timestamp'] or '(none)'}")
            m(f"publish_time = {first(md, 3)}  # observed")
            m(f"uncompressed_size = {first(md, 9, '(absent)')}  # observed")
            m(f"payload_bytes_on_wire = {len(f.payload)}  # observed")
            m(f"send_fields_present = {' '.join(str(n) for n in f.sub_order)}  # observed")
            m(f"metadata_fields_present = {_meta_order(f)}  # observed")
            if body is not None:
                m(f"zlib_checked_by_capture = {len(body)} bytes")
            m("")

    with open(os.path.join(OUT_DIR, "MANIFEST.txt"), "w") as fh:
        fh.write("\n".join(manifest))
    broker.sock.close()
    print(f"wrote {OUT_DIR}/MANIFEST.txt; client_version {client_version}")


def _meta_order(f):
    rest = f.rest[6:] if f.rest[:2] == b"\x0e\x01" else f.rest
    (meta_size,) = struct.unpack(">I", rest[:4])
    _, order = dec_fields(rest[4:4 + meta_size])
    return " ".join(str(n) for n in order)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--client":
        run_client(int(sys.argv[2]), sys.argv[3])
    else:
        main()
