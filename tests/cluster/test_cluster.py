"""Cluster failures with real processes (etcd, 3 bookies, 2 brokers) and the
official Python client: a broker killed under load, a bookie killed under
load with auto-recovery, a broker frozen past its lease, etcd restarted.

Each test prints the figure its target is about (time until publishing
resumes, longest stall); the assertions are about data: nothing
acknowledged lost, order per partition kept, no duplicates with dedup on.
"""

import os
import random
import shutil
import ssl
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
import zlib

import pulsar
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))

from certs import make_ca, write_leaf  # noqa: E402
from harness import Cluster  # noqa: E402
from pulsarframes import (  # noqa: E402
    open_connection,
    producer_frame,
    read_command,
    send_frame,
)

SEND_RECEIPT = 7
PRODUCER_SUCCESS = 17
FULL = os.environ.get("VELA_TEST_FULL") == "1"


@pytest.fixture
def cluster():
    c = Cluster(bookies=3, brokers=2)
    yield c
    if os.environ.get("VELA_CLUSTER_LOGS"):
        print(c.logs())
    c.close()


def client_of(url, timeout_s=30):
    return pulsar.Client(
        url,
        operation_timeout_seconds=timeout_s,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )


class Load(threading.Thread):
    """Produces `NAME:I` messages (I = 0, 1, ...) until stopped; `acked`
    records (i, time) of each acknowledged send, in order."""

    def __init__(self, url, topic, name, batching):
        super().__init__(daemon=True)
        self.url, self.topic, self.name, self.batching = url, topic, name, batching
        self.acked = []
        self.ids = {}
        self.failed = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def run(self):
        client = client_of(self.url)
        try:
            producer = client.create_producer(
                self.topic,
                producer_name=self.name,
                batching_enabled=self.batching,
                batching_max_publish_delay_ms=2,
                send_timeout_millis=60000,
                max_pending_messages=500,
                block_if_queue_full=True,
            )
            i = 0
            while not self.stop.is_set():
                data = ("%s:%d" % (self.name, i)).encode()
                key = str(i % 16)
                if self.batching:

                    def done(result, _id, i=i):
                        with self.lock:
                            if result == pulsar.Result.Ok:
                                self.acked.append((i, time.time()))
                            else:
                                self.failed += 1

                    producer.send_async(data, done, partition_key=key)
                    if i % 50 == 49:
                        time.sleep(0.005)
                else:
                    try:
                        msg_id = producer.send(data, partition_key=key)
                        self.acked.append((i, time.time()))
                        self.ids[i] = (msg_id.partition(), msg_id.ledger_id(), msg_id.entry_id())
                    except Exception:
                        self.failed += 1
                i += 1
            producer.flush()
        finally:
            client.close()

    def finish(self):
        self.stop.set()
        self.join(timeout=120)
        assert not self.is_alive(), "producer %s did not stop" % self.name
        with self.lock:
            return sorted(self.acked)


def read_all(url, topic, timeout_s=5):
    """Every message of `topic` (all partitions) from the start:
    [(producer, i, partition)] in delivery order."""
    client = client_of(url)
    consumer = client.subscribe(
        topic,
        "check-" + uuid.uuid4().hex[:8],
        initial_position=pulsar.InitialPosition.Earliest,
        receiver_queue_size=2000,
    )
    out = []
    while True:
        try:
            msg = consumer.receive(timeout_millis=timeout_s * 1000)
        except pulsar.Timeout:
            break
        name, i = msg.data().decode().rsplit(":", 1)
        out.append((name, int(i), msg.message_id().partition()))
        consumer.acknowledge(msg)
    client.close()
    return out


def check_log(messages, loads):
    """No duplicate, producer order kept within each partition, nothing
    acknowledged missing."""
    seen = set()
    last = {}
    for name, i, partition in messages:
        assert (name, i) not in seen, "duplicate %s:%d" % (name, i)
        seen.add((name, i))
        key = (name, partition)
        assert last.get(key, -1) < i, "%s out of order in partition %d: %d after %d" % (
            name,
            partition,
            i,
            last[key],
        )
        last[key] = i
    for load, acked in loads:
        missing = [i for i, _ in acked if (load.name, i) not in seen]
        assert not missing, "%s: %d acknowledged messages lost, first %s" % (
            load.name,
            len(missing),
            missing[:5],
        )


def resume_after(acked, at):
    """Longest pause in acknowledgements from `at` on (the time publishing
    stood still for the topic the failure hit), or inf if none came after."""
    times = sorted(t for _, t in acked)
    after = [t for t in times if t > at]
    if not after:
        return float("inf")
    before = [t for t in times if t <= at]
    points = ([before[-1]] if before else [at]) + after
    return max(b - a for a, b in zip(points, points[1:]))


def test_broker_kill9_under_load_loses_nothing_and_keeps_order(cluster):
    assert cluster.http("POST", "/admin/v2/namespaces/public/default/deduplication", "true")[0] == 204
    topic = "persistent://public/default/failover-" + uuid.uuid4().hex[:6]
    status, body = cluster.http("PUT", "/admin/v2/persistent/public/default/%s/partitions" % topic.rsplit("/", 1)[1], "2")
    assert status == 204, (status, body)
    url = cluster.service_url()

    # A consumer attached throughout.
    live_client = client_of(url)
    live = live_client.subscribe(topic, "live", consumer_type=pulsar.ConsumerType.Shared)
    received = set()
    stop_consuming = threading.Event()

    def consume():
        while not stop_consuming.is_set():
            try:
                msg = live.receive(timeout_millis=200)
            except pulsar.Timeout:
                continue
            except Exception:
                continue
            name, i = msg.data().decode().rsplit(":", 1)
            received.add((name, int(i)))
            live.acknowledge(msg)

    consumer_thread = threading.Thread(target=consume, daemon=True)
    consumer_thread.start()

    loads = [Load(url, topic, "sync", batching=False), Load(url, topic, "async", batching=True)]
    for load in loads:
        load.start()
    time.sleep(2.0)
    victim = cluster.owner_of(topic + "-partition-0")
    killed_at = time.time()
    victim.kill9()
    time.sleep(6.0 if FULL else 4.0)
    acked = [(load, load.finish()) for load in loads]
    resumes = {load.name: resume_after(a, killed_at) for load, a in acked}
    print(
        "broker kill -9: publishing resumed after %s (target < 2 s); %s"
        % (
            ", ".join("%s %.2f s" % (n, r) for n, r in resumes.items()),
            ", ".join("%s acked %d" % (load.name, len(a)) for load, a in acked),
        )
    )
    assert all(r != float("inf") for r in resumes.values()), "publishing never resumed"

    messages = read_all(cluster.service_url(), topic)
    check_log(messages, acked)
    # The live consumer got everything acknowledged (maybe some twice).
    deadline = time.time() + 20
    wanted = {(load.name, i) for load, a in acked for i, _ in a}
    while time.time() < deadline and not wanted <= received:
        time.sleep(0.2)
    stop_consuming.set()
    consumer_thread.join(timeout=10)
    live_client.close()
    assert wanted <= received, "%d acknowledged messages never reached the live consumer" % len(wanted - received)


def current_ledger_bookies(cluster):
    """Bookies of the last segment of the newest ledger."""
    status, out = cluster.ledgers("list")
    assert status == 0, out
    last = [line for line in out.splitlines() if line.startswith("L")][-1]
    ensembles = last.split("ensembles=")[1].split()
    newest = ensembles[-1].split(":", 1)[1].strip("[]")
    return newest.split(",")


def test_bookie_kill9_under_load_then_autorecovery_restores_two_copies(cluster):
    topic = "persistent://public/default/bookie-" + uuid.uuid4().hex[:6]
    url = cluster.service_url()
    load = Load(url, topic, "sync", batching=False)
    load.start()
    time.sleep(2.0)
    in_use = current_ledger_bookies(cluster)
    victim = next(b for b in cluster.bookies if b.name in in_use)
    killed_at = time.time()
    victim.kill9()
    time.sleep(3.0)
    acked = load.finish()
    times = [t for _, t in acked]
    gaps = [b - a for a, b in zip(times, times[1:]) if b > killed_at - 1]
    stall = max(gaps) if gaps else float("inf")
    print(
        "bookie kill -9 (%s): longest stall %.1f ms (target < 200 ms), %d sends acknowledged"
        % (victim.name, stall * 1000, len(acked))
    )
    assert any(t > killed_at for t in times), "publishing did not continue"

    # Auto-recovery copies the lost bookie's entries; every entry ends up on
    # both bookies of its write set.
    deadline = time.time() + 90
    while True:
        status, out = cluster.ledgers("verify")
        if status == 0:
            break
        assert time.time() < deadline, "copies still missing after 90 s:\n" + out[-2000:]
        time.sleep(1.0)
    print("auto-recovery: " + out.strip().splitlines()[-1])
    check_log(read_all(cluster.service_url(), topic), [(load, acked)])


def test_broker_frozen_past_its_lease_gets_nothing_more_acknowledged(cluster):
    topic = "persistent://public/default/frozen-" + uuid.uuid4().hex[:6]
    owner = cluster.owner_of(topic)
    other = next(b for b in cluster.brokers if b is not owner)
    host, port = cluster.url_of(owner, "pulsar")[len("pulsar://"):].split(":")
    sock = open_connection(host, int(port))
    sock.sendall(producer_frame(topic, 1, 1))
    cmd, _ = read_command(sock)
    assert cmd == PRODUCER_SUCCESS, cmd
    for seq in range(5):
        sock.sendall(send_frame(1, seq, b"before-%d" % seq))
        cmd, _ = read_command(sock)
        assert cmd == SEND_RECEIPT, cmd

    owner.freeze()
    try:
        # Past the lease (2 s session TTL): the other broker takes the topic
        # over; its recovery fences the frozen broker's ledger.
        time.sleep(5.0)
        client = client_of(cluster.service_url([other]))
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(10):
            producer.send(b"after-%d" % i)
        client.close()
        # Sends queued at the frozen broker, handled when it wakes up.
        for seq in range(5, 10):
            sock.sendall(send_frame(1, seq, b"frozen-%d" % seq))
    finally:
        owner.thaw()

    sock.settimeout(1.0)
    answers = []
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            cmd, _ = read_command(sock)
        except (EOFError, ConnectionError):
            break
        except OSError:
            continue
        answers.append(cmd)
    assert SEND_RECEIPT not in answers, "the deposed broker acknowledged a write: %s" % answers
    deadline = time.time() + 10
    while "every bundle dropped" not in owner.log_text() and time.time() < deadline:
        time.sleep(0.2)
    assert "every bundle dropped" in owner.log_text(), "the frozen broker did not drop its ownership"

    client = client_of(cluster.service_url([other]))
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    seen = []
    while reader.has_message_available():
        seen.append(reader.read_next(timeout_millis=5000).data())
    client.close()
    assert seen == [b"before-%d" % i for i in range(5)] + [b"after-%d" % i for i in range(10)], seen


@pytest.mark.skipif(not FULL, reason="full suite only (VELA_TEST_FULL=1)")
def test_etcd_restart_under_load_loses_nothing(cluster):
    # Dedup on: sends the client repeats after reconnecting are kept once.
    assert cluster.http("POST", "/admin/v2/namespaces/public/default/deduplication", "true")[0] == 204
    topic = "persistent://public/default/etcd-" + uuid.uuid4().hex[:6]
    url = cluster.service_url()
    loads = [Load(url, topic, "sync", batching=False), Load(url, topic, "async", batching=True)]
    for load in loads:
        load.start()
    time.sleep(2.0)
    cluster.etcd.kill9()
    time.sleep(random.uniform(2.0, 4.0))
    cluster.etcd.start()
    restarted_at = time.time()
    time.sleep(8.0)
    acked = [(load, load.finish()) for load in loads]
    resumes = {load.name: resume_after(a, restarted_at) for load, a in acked}
    print("etcd restart: publishing after the restart in " + ", ".join("%s %.2f s" % kv for kv in resumes.items()))
    assert all(r != float("inf") for r in resumes.values()), "publishing never resumed"
    check_log(read_all(cluster.service_url(), topic), acked)


def test_bundle_split_and_unload_keep_every_message(cluster):
    topic = "persistent://public/default/bundles-" + uuid.uuid4().hex[:6]
    url = cluster.service_url()
    client = client_of(url)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(50):
        producer.send(b"m-%d" % i)
    status, layout = cluster.http("GET", "/admin/v2/namespaces/public/default/bundles")
    assert status == 200 and layout["numBundles"] == 4, layout
    owner = cluster.owner_of(topic)
    # The topic's bundle: the one whose range holds it; ask its owner to split
    # each bundle it owns (only the owner may).
    bounds = [int(b, 16) for b in layout["boundaries"]]
    ranges = ["0x%08x_0x%08x" % (lo, hi) for lo, hi in zip(bounds, bounds[1:])]
    split = 0
    for bundle in ranges:
        status, _ = cluster.http("PUT", "/admin/v2/namespaces/public/default/%s/split" % bundle, broker=owner)
        split += status == 204
    assert split >= 1, "the owner split none of its bundles"
    status, layout = cluster.http("GET", "/admin/v2/namespaces/public/default/bundles")
    assert layout["numBundles"] == 4 + split, layout
    for i in range(50, 100):
        producer.send(b"m-%d" % i)
    # Unload every bundle: topics move; the client follows.
    bounds = [int(b, 16) for b in layout["boundaries"]]
    for lo, hi in zip(bounds, bounds[1:]):
        bundle = "0x%08x_0x%08x" % (lo, hi)
        for broker in cluster.brokers:
            status, _ = cluster.http("PUT", "/admin/v2/namespaces/public/default/%s/unload" % bundle, broker=broker)
            assert status in (204, 307), status
    for i in range(100, 150):
        producer.send(b"m-%d" % i)
    client.close()
    client = client_of(cluster.service_url())
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    seen = []
    while reader.has_message_available():
        seen.append(reader.read_next(timeout_millis=5000).data())
    client.close()
    assert seen == [b"m-%d" % i for i in range(150)]


def test_hot_bundles_split_automatically():
    c = Cluster(bookies=2, brokers=2, broker_args=["--bundle-split-topics-max", "2", "--ensemble-size", "2"])
    try:
        client = client_of(c.service_url())
        topics = ["persistent://public/default/hot-%d-%s" % (i, uuid.uuid4().hex[:4]) for i in range(16)]
        producers = [client.create_producer(t, batching_enabled=False) for t in topics]
        for p in producers:
            p.send(b"one")
        deadline = time.time() + 30
        while time.time() < deadline:
            status, layout = c.http("GET", "/admin/v2/namespaces/public/default/bundles")
            if status == 200 and layout["numBundles"] > 4:
                break
            time.sleep(0.5)
        print("auto split: %d bundles for 16 topics (split past 2 topics per bundle)" % layout["numBundles"])
        assert layout["numBundles"] > 4, layout
        # Topics keep working after the splits.
        for p in producers:
            p.send(b"two")
        client.close()
        client = client_of(c.service_url())
        for t in topics:
            reader = client.create_reader(t, pulsar.MessageId.earliest)
            got = []
            while reader.has_message_available():
                got.append(reader.read_next(timeout_millis=5000).data())
            assert got == [b"one", b"two"], (t, got)
        client.close()
    finally:
        c.close()


def https_put_status(url, ca_path):
    """(status, Location) of a PUT over HTTPS, redirects not followed."""
    context = ssl.create_default_context(cafile=ca_path)
    req = urllib.request.Request(url, data=b"", method="PUT")
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as resp:
            return resp.status, None
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Location")


def test_tls_client_reaches_topics_owned_by_the_other_broker():
    """A `pulsar+ssl://` client of broker A, for a topic broker B serves:
    A's lookup answers (the redirect to B, then B as owner) carry B's TLS
    URL, read from B's registration; so do the HTTP lookup (LookupData's
    brokerUrlTls / httpUrlTls) and a bundle redirect over HTTPS."""
    certs = tempfile.mkdtemp(prefix="vela-cluster-certs-")
    ca_key, ca_cert, ca_path = make_ca(certs)
    cert_path = os.path.join(certs, "broker.cert.pem")
    key_path = os.path.join(certs, "broker.key.pem")
    write_leaf(ca_key, ca_cert, cert_path, key_path)
    tls_args = ["--tls-port", "0", "--https-port", "0", "--tls-cert-file", cert_path, "--tls-key-file", key_path]
    c = Cluster(bookies=2, brokers=2, broker_args=tls_args + ["--ensemble-size", "2"])
    try:
        a, b = c.brokers
        b_tls, b_https = c.url_of(b, "pulsar+ssl"), c.url_of(b, "https")
        assert b_tls and b_https, b.ready_line
        # A topic whose (unowned) bundle A sends to B: A redirects there.
        topic = None
        for i in range(64):
            candidate = "persistent://public/default/tls-%d-%s" % (i, uuid.uuid4().hex[:6])
            status, answer = c.http("GET", "/lookup/v2/topic/" + candidate.replace("persistent://", "persistent/"), broker=a)
            assert status == 200, (status, answer)
            if answer["brokerUrl"] == c.url_of(b, "pulsar"):
                topic = candidate
                break
        assert topic, "A placed none of 64 topics on B"
        redirect_answer = answer

        def tls_client():
            return pulsar.Client(
                c.url_of(a, "pulsar+ssl"),
                tls_trust_certs_file_path=ca_path,
                operation_timeout_seconds=15,
                logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
            )

        # Unowned: A answers Redirect(B); the client asks B, which takes it.
        producer_client = tls_client()
        producer = producer_client.create_producer(topic, batching_enabled=False)
        for i in range(10):
            producer.send(b"m-%d" % i)
        assert c.owner_of(topic) is b
        # Owned by B: A answers Connect(B) from B's ownership record.
        consumer_client = tls_client()
        consumer = consumer_client.subscribe(
            topic, "s", initial_position=pulsar.InitialPosition.Earliest
        )
        got = [consumer.receive(timeout_millis=10000).data() for _ in range(10)]
        assert got == [b"m-%d" % i for i in range(10)]
        consumer_client.close()
        producer_client.close()

        # The HTTP lookup at A: B's URLs, before (B chosen) and after (B owns).
        status, owner_answer = c.http("GET", "/lookup/v2/topic/" + topic.replace("persistent://", "persistent/"), broker=a)
        assert status == 200, (status, owner_answer)
        for answer in (redirect_answer, owner_answer):
            assert answer["brokerUrl"] == c.url_of(b, "pulsar"), answer
            assert answer["brokerUrlTls"] == b_tls, answer
            assert answer["httpUrl"] == c.url_of(b, "http"), answer
            assert answer["httpUrlTls"] == b_https, answer

        # Over HTTPS, A sends an admin request for B's bundle to B's HTTPS port.
        status, layout = c.http("GET", "/admin/v2/namespaces/public/default/bundles")
        assert status == 200, layout
        bounds = [int(x, 16) for x in layout["boundaries"]]
        hash_ = zlib.crc32(topic.encode())
        lo, hi = next((lo, hi) for lo, hi in zip(bounds, bounds[1:]) if lo <= hash_ < hi or hash_ == hi == 0xFFFFFFFF)
        path = "/admin/v2/namespaces/public/default/0x%08x_0x%08x/unload" % (lo, hi)
        status, location = https_put_status(c.url_of(a, "https") + path, ca_path)
        assert status == 307 and location == b_https + path, (status, location)
    finally:
        if os.environ.get("VELA_CLUSTER_LOGS"):
            print(c.logs())
        c.close()
        shutil.rmtree(certs, ignore_errors=True)


def test_bookies_serve_tls_to_brokers_ledger_tools_and_recovery():
    """Bookies serving TLS only (`vela bookie --tls-cert-file`): a broker
    trusting their CA writes and, after an unload (a new ledger open with
    recovery reads), reads every message back; `vela ledgers verify` with
    the CA checks every copy; without it the bookies refuse the tool."""
    certs = tempfile.mkdtemp(prefix="vela-bookie-certs-")
    ca_key, ca_cert, ca_path = make_ca(certs)
    cert_path = os.path.join(certs, "bookie.cert.pem")
    key_path = os.path.join(certs, "bookie.key.pem")
    write_leaf(ca_key, ca_cert, cert_path, key_path)
    trust = ["--bookie-tls-trust-certs-file", ca_path]
    c = Cluster(
        bookies=2,
        brokers=1,
        bookie_args=["--tls-cert-file", cert_path, "--tls-key-file", key_path] + trust,
        broker_args=trust + ["--ensemble-size", "2"],
    )
    try:
        topic = "persistent://public/default/bookie-tls-%s" % uuid.uuid4().hex[:8]
        client = pulsar.Client(
            c.service_url(),
            operation_timeout_seconds=15,
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        )
        producer = client.create_producer(topic, batching_enabled=False)
        sent = [b"tls-%d" % i for i in range(50)]
        for payload in sent:
            producer.send(payload)
        producer.close()
        client.close()
        # A fresh owner opens the log again: recovery reads over TLS.
        status, _ = c.http("PUT", "/admin/v2/persistent/%s/unload" % topic[len("persistent://"):])
        assert status in (200, 204), status
        client = pulsar.Client(
            c.service_url(),
            operation_timeout_seconds=15,
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        )
        consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        got = [consumer.receive(timeout_millis=10000).data() for _ in sent]
        assert got == sent
        client.close()

        code, out = c.ledgers(*trust, "verify")
        assert code == 0 and " 0 missing" in out, out
        code, out = c.ledgers("verify")
        assert code != 0, out
        assert any("bookie TLS handshake failed" in line for b in c.bookies for line in b.log_lines), c.logs()
    except BaseException:
        print(c.logs())
        raise
    finally:
        c.close()
        shutil.rmtree(certs, ignore_errors=True)


def test_topic_policy_set_on_one_broker_applies_on_the_owner(cluster):
    # Topic-level policies live in the metadata store (etcd here); the broker
    # serving the topic follows a change made through the other broker.
    topic = "persistent://public/default/policy-" + uuid.uuid4().hex[:6]
    client = client_of(cluster.service_url())
    first = client.create_producer(topic)
    owner = cluster.owner_of(topic)
    other = next(b for b in cluster.brokers if b is not owner)
    path = "/admin/v2/" + topic.replace("://", "/") + "/maxProducers"
    status, _ = cluster.http("POST", path, body="1", broker=other)
    assert status == 204, status
    status, value = cluster.http("GET", path, broker=owner)
    assert (status, value) == (200, 1), (status, value)
    deadline = time.time() + 10
    while True:
        try:
            extra = client.create_producer(topic)
        except pulsar.ProducerBusy:
            break
        extra.close()
        assert time.time() < deadline, "the owner never applied maxProducers=1"
        time.sleep(0.2)
    first.close()
    client.close()
