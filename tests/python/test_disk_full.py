"""A full disk (issue 8, disk faults): `vela standalone` on a small tmpfs is
filled up by a filler file until ENOSPC. Producers then get errors within a
bounded time (never a hang), the broker says why (a bookie is read-only: disk
full or failing), and once the filler is deleted publishing resumes and every
acknowledged message is readable, also after a kill -9 and restart.

Needs root (or CAP_SYS_ADMIN) to mount the tmpfs; skipped with the reason
otherwise."""

import errno
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid

import pulsar
import pytest

from conftest import http, kill9, restart, start_broker, stop_broker
from pulsarframes import open_connection, producer_frame, read_command, send_frame

# Big enough for the journal's preallocated files (~64 MiB) and the rest;
# tmpfs pages cost memory only while written (the filler, briefly).
TMPFS_SIZE = "256m"
SEND_TIMEOUT_MS = 5000
# A send must fail within its timeout plus scheduling slack: an error, not a hang.
SEND_ERROR_WITHIN_S = SEND_TIMEOUT_MS / 1000 + 5
# The bookie checks its disks every 100 ms here; leaving writable mode (read-only
# at the threshold, or failed on ENOSPC at the next flush) takes a few checks.
NOT_WRITABLE_WITHIN_S = 15
RESUME_WITHIN_S = 60
FILLER_CHUNK = b"\xa5" * (1 << 20)


@pytest.fixture
def small_fs():
    mount_point = tempfile.mkdtemp(prefix="vela-enospc-")
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=" + TMPFS_SIZE, "tmpfs", mount_point],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        os.rmdir(mount_point)
        pytest.skip(
            "cannot mount a %s tmpfs for the disk-full test (needs root or CAP_SYS_ADMIN): %s"
            % (TMPFS_SIZE, result.stderr.strip() or result.returncode)
        )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", mount_point], capture_output=True)
        shutil.rmtree(mount_point, ignore_errors=True)


def fill(path):
    """Writes `path` until the filesystem is full; returns the bytes written."""
    written = 0
    with open(path, "wb") as f:
        try:
            while True:
                f.write(FILLER_CHUNK)
                f.flush()
                written += len(FILLER_CHUNK)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
    # What a partial last chunk left in the buffer was dropped with ENOSPC too.
    return written


def new_client(broker):
    return pulsar.Client(
        broker.url,
        operation_timeout_seconds=10,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )


def bookie_modes(broker):
    """{mode: value} of standalone-bookie-0 from /metrics."""
    status, body = http(broker, "GET", "/metrics")
    assert status == 200
    modes = {}
    for line in body.decode().splitlines():
        m = re.match(r'vela_bookie_mode\{[^}]*instance="standalone-bookie-0",mode="(\w+)"\} (\S+)', line)
        if m:
            modes[m.group(1)] = float(m.group(2))
    return modes


def wait_for_mode(broker, accept, timeout_s):
    deadline = time.time() + timeout_s
    while True:
        modes = bookie_modes(broker)
        current = [mode for mode, value in modes.items() if value == 1]
        if current and current[0] in accept:
            return current[0]
        assert time.time() < deadline, "bookie mode %s, waited for %s" % (modes, accept)
        time.sleep(0.1)


def payload(i):
    return b"disk-full-%08d-" % i + b"x" * 200


def index_of(data):
    return int(data[len(b"disk-full-") : len(b"disk-full-") + 8])


def read_all(client, topic, subscription):
    """Every message of the topic from the start of `subscription`."""
    consumer = client.subscribe(
        topic, subscription, initial_position=pulsar.InitialPosition.Earliest
    )
    got = []
    while True:
        try:
            msg = consumer.receive(timeout_millis=5000)
        except pulsar.Timeout:
            break
        got.append(index_of(msg.data()))
        consumer.acknowledge(msg)
    consumer.close()
    return got


def check_log(got, acked, what):
    """Acknowledged messages are all there, once, in order; sends that failed
    may or may not be (an error does not say the message was not stored)."""
    assert got == sorted(set(got)), "%s: duplicates or reordering" % what
    missing = sorted(set(acked) - set(got))
    assert not missing, "%s: %d acknowledged messages lost, first %s" % (
        what,
        len(missing),
        missing[:5],
    )


def refusal_message(broker, topic):
    """What the broker answers a raw producer now: the ERROR of PRODUCER or
    the SEND_ERROR of a SEND, as (command type, message)."""
    sock = open_connection(broker.host, broker.port, timeout=SEND_ERROR_WITHIN_S)
    try:
        sock.sendall(producer_frame(topic, 1, 1, name="raw-disk-full"))
        cmd_type, body = read_command(sock)
        if cmd_type == 14:  # ERROR
            return cmd_type, body[3][0].decode()
        assert cmd_type == 17, "expected PRODUCER_SUCCESS or ERROR, got %d" % cmd_type
        sock.sendall(send_frame(1, 0, b"raw"))
        cmd_type, body = read_command(sock)
        assert cmd_type == 8, "expected SEND_ERROR, got %d (%s)" % (cmd_type, body)
        return cmd_type, body[4][0].decode()
    finally:
        sock.close()


def test_a_full_disk_gives_producers_errors_and_loses_nothing_acknowledged(small_fs):
    data_dir = os.path.join(small_fs, "data")
    broker = start_broker(
        ["--disk-check-interval-ms", "100", "--flush-interval-ms", "1000"], data_dir=data_dir
    )
    filler = os.path.join(small_fs, "filler")
    topic = "persistent://public/default/disk-full-" + uuid.uuid4().hex[:8]
    try:
        client = new_client(broker)
        # The subscription keeps every message for the checks.
        client.subscribe(topic, "check").close()
        producer = client.create_producer(
            topic, batching_enabled=False, send_timeout_millis=SEND_TIMEOUT_MS
        )
        acked = []
        for i in range(200):
            producer.send(payload(i))
            acked.append(i)
        assert wait_for_mode(broker, ["writable"], 5) == "writable"

        filled = fill(filler)
        assert filled > 0
        mode = wait_for_mode(broker, ["read_only", "failed"], NOT_WRITABLE_WITHIN_S)
        print("disk full (%d MiB of filler): bookie %s" % (filled >> 20, mode))

        # Producers get errors, each within a bounded time.
        next_index = len(acked)
        errors = 0
        for _ in range(3):
            started = time.time()
            try:
                producer.send(payload(next_index))
                acked.append(next_index)
            except pulsar.PulsarException as e:
                errors += 1
                print("send %d failed after %.1f s: %s" % (next_index, time.time() - started, e))
            elapsed = time.time() - started
            assert elapsed < SEND_ERROR_WITHIN_S, "a send took %.1f s: a hang, not an error" % elapsed
            next_index += 1
        assert errors > 0, "every send succeeded on a full disk"

        # The broker says why.
        cmd_type, message = refusal_message(broker, topic)
        print("refusal (%d): %s" % (cmd_type, message))
        assert "read-only (disk full or failing)" in message, message

        # Space comes back: the bookie takes writes again, publishing resumes.
        os.remove(filler)
        wait_for_mode(broker, ["writable"], RESUME_WITHIN_S)
        resumed_client = new_client(broker)
        deadline = time.time() + RESUME_WITHIN_S
        while True:
            try:
                resumed = resumed_client.create_producer(
                    topic, batching_enabled=False, send_timeout_millis=SEND_TIMEOUT_MS
                )
                resumed.send(payload(next_index))
                acked.append(next_index)
                next_index += 1
                break
            except pulsar.PulsarException as e:
                assert time.time() < deadline, "publishing did not resume: %s" % e
                time.sleep(0.5)
        for _ in range(100):
            resumed.send(payload(next_index))
            acked.append(next_index)
            next_index += 1

        got = read_all(resumed_client, topic, "check")
        check_log(got, acked, "after the disk emptied")
        resumed_client.close()
        client.close()

        # And after a kill -9 and a restart on the same directory.
        kill9(broker)
        broker = restart(broker)
        client = new_client(broker)
        got = read_all(client, topic, "after-restart-" + uuid.uuid4().hex[:6])
        check_log(got, acked, "after a restart")
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(payload(next_index))
        client.close()
        print(
            "disk full: %d acknowledged, %d send errors, all acknowledged read back"
            % (len(acked), errors)
        )
    finally:
        if os.path.exists(filler):
            os.remove(filler)
        stop_broker(broker)


def test_a_kill_9_while_the_disk_is_full_loses_nothing_acknowledged(small_fs):
    """Producers keep sending while the disk fills; the process is killed
    (-9) while the bookie is not writable, before any recovery; after the
    filler goes and the process restarts, every acknowledged message is
    there."""
    import threading

    data_dir = os.path.join(small_fs, "data")
    broker = start_broker(
        ["--disk-check-interval-ms", "100", "--flush-interval-ms", "500"], data_dir=data_dir
    )
    filler = os.path.join(small_fs, "filler")
    topic = "persistent://public/default/disk-full-kill-" + uuid.uuid4().hex[:8]
    acked = []
    stop = threading.Event()

    def produce():
        client = new_client(broker)
        try:
            producer = client.create_producer(
                topic, batching_enabled=False, send_timeout_millis=SEND_TIMEOUT_MS
            )
            i = 0
            while not stop.is_set():
                try:
                    producer.send(payload(i))
                    acked.append(i)
                except pulsar.PulsarException:
                    pass
                i += 1
        except pulsar.PulsarException:
            pass
        finally:
            try:
                client.close()
            except pulsar.PulsarException:
                pass

    try:
        client = new_client(broker)
        client.subscribe(topic, "check").close()
        client.close()
        producer_thread = threading.Thread(target=produce)
        producer_thread.start()
        deadline = time.time() + 30
        while len(acked) < 200:
            assert time.time() < deadline, "no load reached the broker"
            time.sleep(0.05)
        fill(filler)
        mode = wait_for_mode(broker, ["read_only", "failed"], NOT_WRITABLE_WITHIN_S)
        time.sleep(1.0)  # let a flush meet the full disk too
        kill9(broker)
        stop.set()
        producer_thread.join(timeout=60)
        acked_at_kill = list(acked)
        print("killed with the bookie %s after %d acknowledged sends" % (mode, len(acked_at_kill)))

        os.remove(filler)
        broker = restart(broker)
        client = new_client(broker)
        got = read_all(client, topic, "check")
        check_log(got, acked_at_kill, "after kill -9 on a full disk")
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(payload(10**7))
        client.close()
    finally:
        stop.set()
        if os.path.exists(filler):
            os.remove(filler)
        stop_broker(broker)
