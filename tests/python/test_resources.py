"""Resident memory of `vela standalone` stays within its configured bounds
under 10k idle connections and under a slow consumer with a large backlog.

The bounds asserted are the ones the broker and its bookie are configured
with: per connection, the read buffer (64 KiB, READ_BUFFER_BYTES) is the
largest thing an idle connection may hold; for a backlog, the topic's tail
cache (8 MiB), the bookie's write cache and read cache (given by flags here)
and the consumer's bounded outbound queue. Figures are printed (pytest -s).
"""

import os
import resource
import sys
import time

import pulsar

from conftest import _start, _stop

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))

from pulsarframes import open_connection  # noqa: E402

MIB = 1 << 20
KIB = 1 << 10
IDLE_CONNECTIONS = 10_000
READ_BUFFER_BYTES = 64 * KIB
WRITE_CACHE_MB = 32
READ_CACHE_MB = 16
ENTRY_CACHE_MB = 8
SLACK_BYTES = 64 * MIB


def rss_bytes(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * KIB
    raise AssertionError("no VmRSS for %d" % pid)


def raise_fd_limit(wanted):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def test_ten_thousand_idle_connections_stay_within_their_buffers():
    # Our sockets plus the broker's (it inherits the limit) plus slack.
    limit = raise_fd_limit(IDLE_CONNECTIONS + 1000)
    if limit < IDLE_CONNECTIONS + 200:
        import pytest

        pytest.skip("RLIMIT_NOFILE hard limit %d is below %d" % (limit, IDLE_CONNECTIONS + 200))
    b = _start()
    sockets = []
    try:
        pid = b.proc.pid
        idle = rss_bytes(pid)
        started = time.time()
        for _ in range(IDLE_CONNECTIONS):
            sockets.append(open_connection(b.host, b.port))
        took = time.time() - started
        time.sleep(1)
        loaded = rss_bytes(pid)
        per_connection = (loaded - idle) / IDLE_CONNECTIONS
        bound = idle + IDLE_CONNECTIONS * READ_BUFFER_BYTES
        print(
            "\n10k idle connections: RSS %.1f MiB idle -> %.1f MiB with %d connections "
            "(%.1f KiB each; bound %.1f MiB = idle + 64 KiB read buffer each; handshakes took %.1f s)"
            % (idle / MIB, loaded / MIB, len(sockets), per_connection / KIB, bound / MIB, took)
        )
        assert loaded < bound, (loaded, bound)
        # Still serving: a real client works beside them.
        c = pulsar.Client(b.url, operation_timeout_seconds=10)
        producer = c.create_producer("persistent://public/default/res-after-10k")
        producer.send(b"still here")
        c.close()
    finally:
        for s in sockets:
            s.close()
        _stop(b)


def test_slow_consumer_with_a_large_backlog_keeps_memory_bounded():
    b = _start(
        [
            "--write-cache-mb",
            str(WRITE_CACHE_MB),
            "--read-cache-mb",
            str(READ_CACHE_MB),
            "--managed-ledger-cache-size-mb",
            str(ENTRY_CACHE_MB),
        ]
    )
    try:
        pid = b.proc.pid
        idle = rss_bytes(pid)
        c = pulsar.Client(b.url, operation_timeout_seconds=30)
        topic = "persistent://public/default/res-backlog"
        # Subscribed, never receiving: its queue fills and the rest waits.
        slow = c.subscribe(topic, "slow", receiver_queue_size=10)
        producer = c.create_producer(
            topic,
            batching_enabled=False,
            max_pending_messages=64,
            block_if_queue_full=True,
        )
        payload = b"m" * (64 * KIB)
        backlog_bytes = 192 * MIB
        peak = idle
        for i in range(backlog_bytes // len(payload)):
            producer.send_async(payload, None)
            if i % 256 == 0:
                peak = max(peak, rss_bytes(pid))
        producer.flush()
        peak = max(peak, rss_bytes(pid))
        # A second consumer reads the whole backlog from the start (the
        # bookie's read path), while the slow one still sits.
        reader = c.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=100)
        got = 0
        while got < backlog_bytes // len(payload):
            reader.read_next(timeout_millis=30000)
            got += 1
            if got % 256 == 0:
                peak = max(peak, rss_bytes(pid))
        bound = idle + (WRITE_CACHE_MB + READ_CACHE_MB + ENTRY_CACHE_MB) * MIB + SLACK_BYTES
        print(
            "\nslow consumer, %d MiB backlog: RSS %.1f MiB idle, peak %.1f MiB "
            "(bound %.1f MiB = idle + write cache %d MiB + read cache %d MiB + entry cache %d MiB + 64 MiB)"
            % (
                backlog_bytes // MIB,
                idle / MIB,
                peak / MIB,
                bound / MIB,
                WRITE_CACHE_MB,
                READ_CACHE_MB,
                ENTRY_CACHE_MB,
            )
        )
        assert peak < bound, (peak, bound)
        assert slow.receive(timeout_millis=10000).data() == payload
        c.close()
    finally:
        _stop(b)
