"""Transactions in a cluster (etcd, 3 bookies, 2 brokers, transactions on):
a consume-transform-produce loop in transactions (the official Go client:
the Python client has no transactions; tests/go-client/cmd/txnloop) runs
while a producer keeps writing its input; the broker owning the
coordinator (`transaction_coordinator_assign-partition-0`) is killed with
SIGKILL while one of the loop's transactions has sent and acknowledged
but not yet committed (the loop holds it: `-hold-at`); the other broker
takes the coordinator over (its transaction log replayed), that commit
goes to it, and the loop continues. The output then holds every input
message exactly once, in order per key.

Broken takeover (the coordinator never served again: the loop stops
committing) or recovery (the held transaction forgotten: its commit fails,
its buffered entries and held acks are never released, so the output stops
short) fails the test; both were checked by breaking them on purpose.
"""

import os
import shutil
import subprocess
import sys
import threading
import time
import uuid

import pulsar
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))

from harness import Cluster  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ASSIGN = "persistent://pulsar/system/transaction_coordinator_assign-partition-0"
KEYS = 8
INPUT_MESSAGES = 2400
INPUT_RATE_PER_S = 150
KILL_AFTER_TXNS = 40
# The loop's transactions time out after this (longer than the takeover,
# so the held one can still commit).
TXN_TIMEOUT_S = 20


def build_txnloop():
    go = shutil.which("go")
    if go is None:
        pytest.skip("go not found: the transaction loop is the official Go client")
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    env = dict(os.environ)
    env.update(
        GOPATH=os.path.join(target, "go"),
        GOMODCACHE=os.path.join(target, "go", "mod"),
        GOCACHE=os.path.join(target, "go", "cache"),
    )
    out = os.path.join(target, "go", "bin", "txnloop")
    subprocess.run(
        [go, "build", "-o", out, "./cmd/txnloop"],
        cwd=os.path.join(ROOT, "tests", "go-client"),
        env=env,
        check=True,
        timeout=900,
    )
    return out


class Loop:
    """The txnloop process; `commits` holds (time, transactions) of each
    `committed` line."""

    def __init__(self, binary, url, admin, src, dst, log_path):
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [binary, "-url", url, "-admin", admin, "-in", src, "-out", dst, "-per-txn", "10",
             "-txn-timeout", "%ds" % TXN_TIMEOUT_S, "-idle", "40s",
             "-hold-at", str(KILL_AFTER_TXNS), "-hold-for", "4s"],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        self.commits = []
        self.lines = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            line = line.strip()
            self.lines.append(line)
            if line.startswith("committed "):
                self.commits.append((time.time(), int(line.split()[1])))

    def wait_line(self, prefix, timeout_s):
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            found = [line for line in self.lines if line.startswith(prefix)]
            if found:
                return found[0]
            assert self.proc.poll() is None, "txnloop exited: %s" % self.lines[-5:]
            time.sleep(0.05)
        raise AssertionError("no %r line: %s" % (prefix, self.lines[-5:]))

    def wait_commits(self, n, timeout_s):
        deadline = time.time() + timeout_s
        while time.time() < deadline and len(self.commits) < n:
            assert self.proc.poll() is None, "txnloop exited: %s" % self.lines[-5:]
            time.sleep(0.1)
        assert len(self.commits) >= n, "only %d commits: %s" % (len(self.commits), self.lines[-5:])


def produce(url, topic, stop, acked):
    """Writes `kJ:I` (key kJ) at a steady rate; `acked` gets each
    acknowledged payload per key, in send order."""
    client = pulsar.Client(url, operation_timeout_seconds=60,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    producer = client.create_producer(topic, producer_name="input-" + uuid.uuid4().hex[:6],
                                      batching_enabled=False, send_timeout_millis=120000)
    pending = []
    for i in range(INPUT_MESSAGES):
        if stop.is_set():
            break
        key = "k%d" % (i % KEYS)
        pending.append((key, "%s:%d" % (key, i), threading.Event(), []))
        _, payload, done, result = pending[-1]

        def sent(res, _id, done=done, result=result):
            result.append(res)
            done.set()

        producer.send_async(payload.encode(), sent, partition_key=key)
        time.sleep(1.0 / INPUT_RATE_PER_S)
    for key, payload, done, result in pending:
        done.wait(120)
        if result == [pulsar.Result.Ok]:
            acked.setdefault(key, []).append(payload)
    producer.flush()
    client.close()


def read_by_key(url, topic, idle_s=15):
    """Every message of `topic` from the start, payloads per key in order."""
    client = pulsar.Client(url, operation_timeout_seconds=60,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    consumer = client.subscribe(topic, "check-" + uuid.uuid4().hex[:8],
                                initial_position=pulsar.InitialPosition.Earliest,
                                receiver_queue_size=2000)
    by_key, count = {}, 0
    while True:
        try:
            msg = consumer.receive(timeout_millis=idle_s * 1000)
        except pulsar.Timeout:
            break
        by_key.setdefault(msg.partition_key(), []).append(msg.data().decode())
        count += 1
        consumer.acknowledge(msg)
    client.close()
    return by_key, count


@pytest.fixture
def txn_cluster():
    c = Cluster(bookies=3, brokers=2, broker_args=["--transaction-coordinator-enabled"])
    yield c
    if os.environ.get("VELA_CLUSTER_LOGS"):
        print(c.logs())
    c.close()


def test_coordinator_owner_kill9_loop_continues_exactly_once(txn_cluster):
    cluster = txn_cluster
    binary = build_txnloop()
    # Dedup: a producer's resend after its broker died is not stored twice
    # (the loop's output producer resends within its transaction).
    status, _ = cluster.http("POST", "/admin/v2/namespaces/public/default/deduplication", "true")
    assert status == 204
    # Keep what the loop consumed: the check below reads both topics again
    # from the start, and with Pulsar's default retention (none) a ledger
    # every subscription has passed is deleted once the topic rolls to a
    # new one (as it does when its broker is the one killed).
    status, body = cluster.http("POST", "/admin/v2/namespaces/public/default/retention",
                                '{"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}')
    assert status == 204, (status, body)
    name = uuid.uuid4().hex[:6]
    src = "persistent://public/default/txn-in-" + name
    dst = "persistent://public/default/txn-out-" + name
    url = cluster.service_url()

    stop = threading.Event()
    acked = {}
    producer = threading.Thread(target=produce, args=(url, src, stop, acked), daemon=True)
    producer.start()
    admin = ",".join(cluster.url_of(b, "http") for b in cluster.brokers)
    loop = Loop(binary, url, admin, src, dst, os.path.join(cluster.dir, "txnloop.log"))
    try:
        victim = cluster.owner_of(ASSIGN)
        held = loop.wait_line("holding ", timeout_s=180)
        survivor = next(b for b in cluster.brokers if b is not victim)
        before = len(loop.commits)
        killed_at = time.time()
        victim.kill9()
        loop.wait_commits(before + 20, timeout_s=120)
        first = loop.commits[before][0] - killed_at
        print("coordinator owner kill -9 while %s was held: its commit after %.2f s"
              % (held.split()[1], first))
        after_hold = loop.lines[loop.lines.index(held) + 1]
        assert after_hold.startswith("committed %d " % (KILL_AFTER_TXNS + 1)), (
            "the held transaction did not commit: %s" % after_hold)
        # The survivor serves the coordinator now.
        assert cluster.owner_of(ASSIGN) is survivor
        status, stats = cluster.http("GET", "/admin/v3/transactions/coordinatorStats", broker=survivor)
        assert status == 200, (status, stats)
        assert "0" in stats and stats["0"]["state"] == "Ready", stats

        producer.join(timeout=INPUT_MESSAGES / INPUT_RATE_PER_S + 180)
        assert not producer.is_alive(), "the input producer did not finish"
        loop.proc.wait(timeout=600)
        assert loop.proc.returncode == 0, loop.lines[-5:]
    finally:
        stop.set()
        if loop.proc.poll() is None:
            loop.proc.kill()
        loop.log.close()

    inputs, n_in = read_by_key(cluster.service_url(), src)
    outputs, n_out = read_by_key(cluster.service_url(), dst)
    restarts = [line for line in loop.lines if line.startswith("restart:")]
    print("txn loop: %d inputs, %d outputs, %d transactions committed by the loop, %d restarts"
          % (n_in, n_out, len(loop.commits), len(restarts)))
    n_acked = sum(len(v) for v in acked.values())
    print("input: %d sends acknowledged, %d read back" % (n_acked, n_in))
    assert n_acked >= INPUT_MESSAGES * 0.9, n_acked
    # Every acknowledged input is stored once, in order per key.
    assert inputs == acked, "the input topic does not hold exactly the acknowledged sends"
    for key, wanted in inputs.items():
        got = outputs.get(key, [])
        assert got == wanted, "key %s: %d inputs, %d outputs; first difference at %s" % (
            key, len(wanted), len(got),
            next((i for i, (a, b) in enumerate(zip(wanted, got)) if a != b), min(len(wanted), len(got))),
        )
    assert n_out == n_in, (n_in, n_out)


COORDINATORS = 4


def test_coordinator_stats_without_an_id_lists_every_coordinator():
    """As Pulsar's `coordinatorStats` without `coordinatorId`: whichever
    broker is asked lists every coordinator of the cluster (the others'
    asked at the broker serving them), not only its own."""
    cluster = Cluster(bookies=3, brokers=2, broker_args=[
        "--transaction-coordinator-enabled", "--transaction-coordinators", str(COORDINATORS)])
    try:
        owners = set()
        for broker in cluster.brokers:
            status, stats = cluster.http("GET", "/admin/v3/transactions/coordinatorStats",
                                         broker=broker)
            assert status == 200, (status, stats)
            assert sorted(stats) == [str(i) for i in range(COORDINATORS)], stats
            for one in stats.values():
                assert one["state"] == "Ready", stats
                assert set(one) >= {"leastSigBits", "lowWaterMark", "ongoingTxnSize"}, one
        for i in range(COORDINATORS):
            owners.add(cluster.url_of(cluster.owner_of(
                "persistent://pulsar/system/transaction_coordinator_assign-partition-%d" % i),
                "pulsar"))
        print("coordinators served by %d brokers" % len(owners))
        # An id out of range is Pulsar's 404.
        status, _ = cluster.http("GET", "/admin/v3/transactions/coordinatorStats?coordinatorId=%d"
                                 % COORDINATORS)
        assert status == 404
    finally:
        if os.environ.get("VELA_CLUSTER_LOGS"):
            print(cluster.logs())
        cluster.close()
