"""Geo-replication toward a cluster that requires TLS and a token: cluster
`a` (plain) replicates `geo/ns` to cluster `b`, a `vela standalone` with TLS
ports only and token authentication. `a`'s record of `b` names its TLS URLs
and, with Pulsar's ClusterData names, `brokerClientTlsEnabled`,
`brokerClientTrustCertsFilePath`, `authenticationPlugin` and
`authenticationParameters`; it is made and changed with `vela admin clusters
create|update` and pulsar-admin's flags (`--url-secure`,
`--broker-url-secure`, `--tls-enable`, `--tls-trust-certs-filepath`,
`--auth-plugin`, `--auth-parameters`), and read back with those names.
Checked with the official client on `b`:

- every message produced on `a` arrives on `b`, with its schema: the
  replicator registers the topic's schema on `b` and sends `b`'s version;
- a partitioned topic created on `a` only gets its partitioned metadata on
  `b` (created through `b`'s admin API, as Pulsar creates it on every
  replication cluster) and every message of each partition arrives;
- without the token, nothing reaches `b` (the replicator is refused), and
  the same record with the token replicates.

Timeouts only bound a failure."""

import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid

import pulsar
import pytest

from certs import make_ca, write_leaf
from velaproc import Proc, vela_binary

COUNT = 50
WAIT_S = 60
TOKEN_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"


def vela(*args):
    out = subprocess.run([vela_binary(), *args], check=True, capture_output=True, text=True)
    return out.stdout.strip()


def request(base, method, path, body=None, token=None, context=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class Clusters:
    """`a`: plain; `b`: TLS only, HS256 tokens, superuser `admin`."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="vela-geo-secure-")
        ca_key, ca_cert, self.ca_path = make_ca(self.dir)
        cert = os.path.join(self.dir, "b.cert.pem")
        key = os.path.join(self.dir, "b.key.pem")
        write_leaf(ca_key, ca_cert, cert, key)
        secret = os.path.join(self.dir, "secret.key")
        vela("admin", "tokens", "create-secret-key", "--output", secret)
        self.token = vela("admin", "tokens", "create", "--secret-key", secret, "--subject", "admin")
        self.context = ssl.create_default_context(cafile=self.ca_path)
        self.b = Proc(
            "b",
            [
                vela_binary(), "standalone", "--data-dir", os.path.join(self.dir, "b"),
                "--cluster-name", "b", "--disable-plain-ports",
                "--tls-port", "0", "--https-port", "0",
                "--tls-cert-file", cert, "--tls-key-file", key,
                "--auth-token-secret-key", secret, "--superuser-roles", "admin",
            ],
            r"pulsar\+ssl://[0-9.]+:\d+",
        )
        self.b_url = self.b.find(r"pulsar\+ssl://[0-9.]+:\d+")
        self.b_https = self.b.find(r"https://[0-9.]+:\d+")
        self.a = Proc(
            "a",
            [
                vela_binary(), "standalone", "--data-dir", os.path.join(self.dir, "a"),
                "--cluster-name", "a", "--port", "0", "--http-port", "0",
            ],
            r"pulsar://[0-9.]+:\d+",
        )
        self.a_url = self.a.find(r"pulsar://[0-9.]+:\d+")
        self.a_http = self.a.find(r"http://[0-9.]+:\d+")

    def on_a(self, method, path, body=None):
        return request(self.a_http, method, path, body)

    def on_b(self, method, path, body=None):
        return request(self.b_https, method, path, body, self.token, self.context)

    def record_b_on_a(self, verb, token):
        """`vela admin clusters create|update b` on `a`, with pulsar-admin's
        flags; the record then reads back as `record_of_b(token)`."""
        vela("admin", "--admin-url", self.a_http, "clusters", verb, "b",
             "--url-secure", self.b_https, "--broker-url-secure", self.b_url,
             "--tls-enable", "--tls-trust-certs-filepath", self.ca_path,
             "--auth-plugin", TOKEN_PLUGIN, "--auth-parameters", "token:" + token)
        status, body = self.on_a("GET", "/admin/v2/clusters/b")
        assert status == 200, body
        assert json.loads(body) == self.record_of_b(token), body

    def record_of_b(self, token):
        """`a`'s record of `b`: its TLS URLs, TLS on, the CA, the token."""
        params = "token:" + token
        return {
            "serviceUrlTls": self.b_https,
            "brokerServiceUrlTls": self.b_url,
            "brokerClientTlsEnabled": True,
            "brokerClientTrustCertsFilePath": self.ca_path,
            "authenticationPlugin": TOKEN_PLUGIN,
            "authenticationParameters": params,
        }

    def client_b(self):
        return pulsar.Client(
            self.b_url,
            authentication=pulsar.AuthenticationToken(self.token),
            tls_trust_certs_file_path=self.ca_path,
            operation_timeout_seconds=10,
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        )

    def client_a(self):
        return pulsar.Client(
            self.a_url,
            operation_timeout_seconds=10,
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        )

    def stop(self):
        for proc in (self.a, self.b):
            proc.terminate()
        shutil.rmtree(self.dir, ignore_errors=True)


def ok(answer, what):
    status, body = answer
    assert 200 <= status < 300, (what, status, body)


@pytest.fixture(scope="module")
def clusters():
    c = Clusters()
    try:
        ok(c.on_b("PUT", "/admin/v2/clusters/a",
                  {"serviceUrl": c.a_http, "brokerServiceUrl": c.a_url}), "b knows a")
        # First without a token: b refuses the replicator.
        c.record_b_on_a("create", "not-a-token")
        for side in (c.on_a, c.on_b):
            ok(side("PUT", "/admin/v2/tenants/geo", {"adminRoles": [], "allowedClusters": ["a", "b"]}),
               "tenant")
            ok(side("PUT", "/admin/v2/namespaces/geo/ns"), "namespace")
            ok(side("POST", "/admin/v2/namespaces/geo/ns/replication", ["a", "b"]), "replication")
        yield c
    finally:
        c.stop()


def wait_for(what, check):
    deadline = time.monotonic() + WAIT_S
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, "never: " + what
        time.sleep(0.2)


def receive_all(consumer, expected, what):
    got = []
    while len(got) < len(expected):
        message = consumer.receive(timeout_millis=WAIT_S * 1000)
        consumer.acknowledge(message)
        got.append(message.value())
    assert sorted(got) == sorted(expected), what
    return got


def test_replication_to_a_tls_token_cluster_carries_schemas_and_partitions(clusters):
    c = clusters
    topic = "persistent://geo/ns/secure-" + uuid.uuid4().hex[:8]
    client_a = c.client_a()
    producer = client_a.create_producer(
        topic, schema=pulsar.schema.StringSchema(), batching_enabled=False)
    first = ["before-token-%d" % i for i in range(COUNT)]
    for value in first:
        producer.send(value)

    # Refused without the token: nothing arrives on b, a keeps the backlog.
    def backlog():
        status, body = c.on_a("GET", "/admin/v2/persistent/geo/ns/%s/stats" % topic.rsplit("/", 1)[1])
        assert status == 200, body
        replication = json.loads(body).get("replication", {}).get("b", {})
        return replication
    wait_for("a's replicator to b shows the backlog", lambda: backlog().get("replicationBacklog") == COUNT)
    assert backlog().get("connected") is False, backlog()

    # With the token (the record changed: the replicator starts again).
    c.record_b_on_a("update", c.token)
    # The replicator registers the topic's schema on b before the first
    # message (a consumer may not add one to a topic with a producer).
    local = topic.rsplit("/", 1)[1]

    def schema_on_b():
        status, body = c.on_b("GET", "/admin/v2/schemas/geo/ns/%s/schema" % local)
        return status == 200 and json.loads(body)
    assert wait_for("the schema on b", schema_on_b)["type"] == "STRING"
    client_b = c.client_b()
    consumer = client_b.subscribe(
        topic, "check", schema=pulsar.schema.StringSchema(),
        initial_position=pulsar.InitialPosition.Earliest,
    )
    receive_all(consumer, first, "every message produced before the token")
    second = ["after-token-%d" % i for i in range(COUNT)]
    for value in second:
        producer.send(value)
    got = receive_all(consumer, second, "every message produced after")
    assert got == second, "in order"

    # A partitioned topic created on a only.
    parts = "secure-parts-" + uuid.uuid4().hex[:8]
    ok(c.on_a("PUT", "/admin/v2/persistent/geo/ns/%s/partitions" % parts, 3), "partitioned on a")
    parts_topic = "persistent://geo/ns/" + parts
    parts_producer = client_a.create_producer(parts_topic)

    def partitions_on_b():
        status, body = c.on_b("GET", "/admin/v2/persistent/geo/ns/%s/partitions" % parts)
        return status == 200 and json.loads(body).get("partitions") == 3
    wait_for("b has the partitioned metadata", partitions_on_b)
    parts_consumer = client_b.subscribe(
        parts_topic, "check", initial_position=pulsar.InitialPosition.Earliest)
    values = [("p-%d" % i).encode() for i in range(COUNT)]
    for value in values:
        parts_producer.send(value, partition_key=value.decode())
    got = []
    while len(got) < COUNT:
        message = parts_consumer.receive(timeout_millis=WAIT_S * 1000)
        assert "-partition-" in message.topic_name(), message.topic_name()
        got.append(message.data())
    assert sorted(got) == sorted(values)
    client_a.close()
    client_b.close()
