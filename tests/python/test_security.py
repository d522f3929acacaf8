"""TLS and token authentication/authorization with the official client:
`pulsar+ssl://` with `AuthenticationToken` and a trusted CA, refusals
without or with a bad token and for a role without a grant, the admin API's
401/403/200 over HTTPS, and certificate reload (a new connection sees the
new certificate). The certificates are made here (a CA and leaves signed by
it) with the `cryptography` package; tokens and an RS256 key pair with `vela
admin tokens`."""

import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid

import pulsar
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from certs import make_ca, write_leaf
from pulsarframes import base_command, field_bytes, field_varint, read_command, simple_frame
from velaproc import Proc, vela_binary

AUTHENTICATION_ERROR = 3
READY = r"pulsar\+ssl://[0-9.]+:\d+"


def vela(*args):
    out = subprocess.run([vela_binary(), *args], check=True, capture_output=True, text=True)
    return out.stdout.strip()


class SecureBroker:
    """`vela standalone` with TLS ports only and token auth: HS256 (a
    secret key) or, with `rs256`, RS256 (Pulsar's DER public key file), or
    RS256 with `key_pair`'s (private, public) files."""

    def __init__(self, rs256=False, key_pair=None):
        self.dir = tempfile.mkdtemp(prefix="vela-secure-")
        self.ca_key, self.ca_cert, self.ca_path = make_ca(self.dir)
        self.cert_path = os.path.join(self.dir, "broker.cert.pem")
        self.key_path = os.path.join(self.dir, "broker.key.pem")
        self.leaf_der = write_leaf(self.ca_key, self.ca_cert, self.cert_path, self.key_path)
        if key_pair:
            self.signing = ["--private-key", key_pair[0]]
            key_args = ["--auth-token-public-key", key_pair[1]]
        elif rs256:
            private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            self.signing = ["--private-key", os.path.join(self.dir, "private.pem")]
            with open(self.signing[1], "wb") as f:
                f.write(private.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                ))
            public = os.path.join(self.dir, "public.der")
            with open(public, "wb") as f:
                f.write(private.public_key().public_bytes(
                    serialization.Encoding.DER,
                    serialization.PublicFormat.SubjectPublicKeyInfo,
                ))
            key_args = ["--auth-token-public-key", public]
        else:
            self.secret = os.path.join(self.dir, "secret.key")
            vela("admin", "tokens", "create-secret-key", "--output", self.secret)
            self.signing = ["--secret-key", self.secret]
            key_args = ["--auth-token-secret-key", self.secret]
        self.proc = Proc(
            "secure-broker",
            [
                vela_binary(), "standalone",
                "--data-dir", os.path.join(self.dir, "data"),
                "--disable-plain-ports",
                "--tls-port", "0", "--https-port", "0",
                "--tls-cert-file", self.cert_path, "--tls-key-file", self.key_path,
                "--tls-cert-refresh-check-s", "1",
                *key_args,
                "--superuser-roles", "admin",
            ],
            READY,
        )
        self.url = self.proc.find(READY)
        self.https_url = self.proc.find(r"https://[0-9.]+:\d+")
        host, port = self.url[len("pulsar+ssl://"):].split(":")
        self.host, self.port = host, int(port)
        self.admin_token = self.token("admin")

    def token(self, role, expiry=None):
        args = ["admin", "tokens", "create", *self.signing, "--subject", role]
        if expiry:
            args += ["--expiry", expiry]
        return vela(*args)

    def http(self, method, path, token=None, body=None):
        context = ssl.create_default_context(cafile=self.ca_path)
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.https_url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if token:
            req.add_header("Authorization", "Bearer " + token)
        try:
            with urllib.request.urlopen(req, timeout=10, context=context) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def client(self, token=None, **kwargs):
        if token is not None:
            kwargs["authentication"] = pulsar.AuthenticationToken(token)
        return pulsar.Client(
            self.url,
            tls_trust_certs_file_path=self.ca_path,
            operation_timeout_seconds=5,
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
            **kwargs,
        )

    def raw_connect(self, token=None):
        """CONNECT over TLS by hand; returns the first answer (type, body)."""
        context = ssl.create_default_context(cafile=self.ca_path)
        with socket.create_connection((self.host, self.port), timeout=5) as raw:
            with context.wrap_socket(raw, server_hostname="localhost") as sock:
                body = field_bytes(1, "raw-test") + field_varint(4, 21)
                if token is not None:
                    body += field_bytes(3, token) + field_bytes(5, "token")
                sock.sendall(simple_frame(base_command(2, 2, body)))
                return read_command(sock)

    def assert_round_trip(self, name, payload):
        """An admin-token client produces `payload` to a new topic and reads it back."""
        client = self.client(self.token("admin", expiry="1h"))
        topic = "persistent://public/default/%s-%s" % (name, uuid.uuid4().hex[:8])
        consumer = client.subscribe(topic, "s")
        client.create_producer(topic).send(payload)
        assert consumer.receive(timeout_millis=5000).data() == payload
        client.close()

    def assert_refused(self, token):
        """`token` gets ERROR(AuthenticationError) on CONNECT and 401 over HTTPS."""
        cmd_type, body = self.raw_connect(token)
        assert cmd_type == 14 and body[2] == [AUTHENTICATION_ERROR], (cmd_type, body)
        assert self.http("GET", "/admin/v2/tenants", token)[0] == 401

    def stop(self):
        self.proc.terminate()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def secure():
    broker = SecureBroker()
    ns = "public/secure-" + uuid.uuid4().hex[:8]
    status, body = broker.http("PUT", "/admin/v2/namespaces/" + ns, broker.admin_token)
    assert status == 204, (status, body)
    for role, actions in (("alice", ["produce", "consume"]), ("writer", ["produce"])):
        status, body = broker.http(
            "POST", "/admin/v2/namespaces/%s/permissions/%s" % (ns, role), broker.admin_token, actions
        )
        assert status == 204, (status, body)
    broker.ns = ns
    yield broker
    broker.stop()


def topic_in(broker):
    return "persistent://%s/t-%s" % (broker.ns, uuid.uuid4().hex[:8])


def test_tls_token_produce_consume(secure):
    client = secure.client(secure.token("alice", expiry="1h"))
    topic = topic_in(secure)
    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(topic)
    for i in range(10):
        producer.send(("m%d" % i).encode())
    got = [consumer.receive(timeout_millis=5000).data().decode() for _ in range(10)]
    assert got == ["m%d" % i for i in range(10)]
    client.close()


def test_connect_refused_without_or_with_bad_token(secure):
    # On the wire: ERROR(AuthenticationError), as the Java broker answers.
    cmd_type, body = secure.raw_connect()
    assert cmd_type == 14 and body[2] == [AUTHENTICATION_ERROR], (cmd_type, body)
    other_key = os.path.join(secure.dir, "other-%s.key" % uuid.uuid4().hex[:6])
    vela("admin", "tokens", "create-secret-key", "--output", other_key)
    forged = vela("admin", "tokens", "create", "--secret-key", other_key, "--subject", "admin")
    cmd_type, body = secure.raw_connect(forged)
    assert cmd_type == 14 and body[2] == [AUTHENTICATION_ERROR], (cmd_type, body)
    # Pulsar's wording; the reason goes to the broker's log only.
    assert body[3][0] == b"Failed to authenticate", body
    cmd_type, _ = secure.raw_connect(secure.token("alice"))
    assert cmd_type == 3  # CONNECTED

    # The official (C++) client drops a connection answered with anything
    # but CONNECTED and retries until its operation timeout.
    for token in (None, forged, "not-a-jwt"):
        client = secure.client(token)
        with pytest.raises((pulsar.ConnectError, pulsar.Timeout, pulsar.AuthenticationError)):
            client.create_producer(topic_in(secure))
        client.close()
    assert "authentication failed" in secure.proc.log_text()
    assert "bad token signature" in secure.proc.log_text()


def test_role_without_grant_is_refused(secure):
    topic = topic_in(secure)
    stranger = secure.client(secure.token("bob"))
    with pytest.raises(pulsar.AuthorizationError):
        stranger.create_producer(topic)
    with pytest.raises(pulsar.AuthorizationError):
        stranger.subscribe(topic, "sub")
    stranger.close()

    writer = secure.client(secure.token("writer"))
    producer = writer.create_producer(topic)
    producer.send(b"allowed")
    with pytest.raises(pulsar.AuthorizationError):
        writer.subscribe(topic, "sub")
    writer.close()


def test_admin_api_statuses(secure):
    status, body = secure.http("GET", "/admin/v2/tenants")
    assert status == 401, (status, body)
    assert "reason" in json.loads(body)
    status, _ = secure.http("GET", "/admin/v2/tenants", "not-a-jwt")
    assert status == 401
    status, body = secure.http("GET", "/admin/v2/tenants", secure.token("bob"))
    assert status == 403, (status, body)
    status, body = secure.http("GET", "/admin/v2/tenants", secure.admin_token)
    assert status == 200 and "public" in json.loads(body)
    # Probes and Prometheus need no token (as Pulsar's defaults).
    assert secure.http("GET", "/admin/v2/brokers/health")[0] == 200
    assert secure.http("GET", "/metrics")[0] == 200

    status, body = secure.http("GET", "/admin/v2/namespaces/%s/permissions" % secure.ns, secure.admin_token)
    assert status == 200
    assert json.loads(body) == {"alice": ["produce", "consume"], "writer": ["produce"]}

    # A tenant admin administers its tenant only.
    tenant = "acme-" + uuid.uuid4().hex[:6]
    info = {"adminRoles": ["carol"], "allowedClusters": ["standalone"]}
    status, body = secure.http("PUT", "/admin/v2/tenants/" + tenant, secure.admin_token, info)
    assert status == 204, (status, body)
    carol = secure.token("carol")
    assert secure.http("PUT", "/admin/v2/namespaces/%s/ns" % tenant, carol)[0] == 204
    assert secure.http("GET", "/admin/v2/namespaces/" + tenant, carol)[0] == 200
    assert secure.http("PUT", "/admin/v2/tenants/%s-2" % tenant, carol, info)[0] == 403
    assert secure.http("GET", "/admin/v2/namespaces/public", carol)[0] == 403
    assert secure.http("GET", "/admin/v2/persistent/%s/ns" % tenant, carol)[0] == 200
    # A role with a grant reads its topics' stats but cannot administer.
    alice = secure.token("alice")
    assert secure.http("GET", "/admin/v2/persistent/%s" % secure.ns, alice)[0] == 200
    assert secure.http("PUT", "/admin/v2/persistent/%s/x" % secure.ns, alice)[0] == 403

    # vela admin over HTTPS with a token file.
    token_file = os.path.join(secure.dir, "admin.token")
    with open(token_file, "w") as f:
        f.write(secure.admin_token + "\n")
    out = vela("admin", "--admin-url", secure.https_url, "--tls-trust-certs-file", secure.ca_path,
               "--auth-token-file", token_file, "namespaces", "permissions", secure.ns)
    assert json.loads(out)["writer"] == ["produce"]
    denied = subprocess.run(
        [vela_binary(), "admin", "--admin-url", secure.https_url, "--tls-trust-certs-file", secure.ca_path,
         "tenants", "list"],
        capture_output=True, text=True,
    )
    assert denied.returncode != 0 and "401" in denied.stderr


def test_tls_only_lookups_name_no_plain_url(secure):
    # --disable-plain-ports: nothing listens on a plain port, so the lookup
    # has no brokerUrl to give (Pulsar leaves it out; the HTTP answer keeps
    # the key, empty, for the C++ client) and brokerUrlTls is the one.
    status, body = secure.http("GET", "/lookup/v2/topic/persistent/%s/looked-up" % secure.ns, secure.admin_token)
    assert status == 200, (status, body)
    answer = json.loads(body)
    assert answer["brokerUrl"] == "" and answer["nativeUrl"] == ""
    assert answer["brokerUrlTls"] == secure.url


def served_certificate(broker, port):
    """DER of the certificate a new TLS connection to `port` is served."""
    context = ssl.create_default_context(cafile=broker.ca_path)
    with socket.create_connection((broker.host, port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as sock:
            return sock.getpeercert(binary_form=True)


def test_certificate_reload():
    broker = SecureBroker()
    try:
        https_port = int(broker.https_url.rsplit(":", 1)[1])
        assert served_certificate(broker, broker.port) == broker.leaf_der
        client = broker.client(broker.admin_token)
        topic = "persistent://public/default/reload-" + uuid.uuid4().hex[:8]
        producer = client.create_producer(topic)
        producer.send(b"before")

        new_der = write_leaf(broker.ca_key, broker.ca_cert, broker.cert_path, broker.key_path)
        assert new_der != broker.leaf_der
        deadline = time.time() + 20
        while time.time() < deadline and served_certificate(broker, broker.port) != new_der:
            time.sleep(0.2)
        assert served_certificate(broker, broker.port) == new_der
        assert served_certificate(broker, https_port) == new_der
        # The connection made before the reload goes on; new ones work too.
        producer.send(b"after")
        other = broker.client(broker.admin_token)
        consumer = other.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        assert consumer.receive(timeout_millis=5000).data() == b"before"
        assert consumer.receive(timeout_millis=5000).data() == b"after"
        other.close()
        client.close()
    finally:
        broker.stop()


def test_rs256_tokens():
    broker = SecureBroker(rs256=True)
    try:
        broker.assert_round_trip("rs256", b"signed with RS256")
        assert broker.http("GET", "/admin/v2/tenants", broker.admin_token)[0] == 200
        # An HS256 token is not accepted by an RS256 broker, whatever its key.
        secret = os.path.join(broker.dir, "hs.key")
        vela("admin", "tokens", "create-secret-key", "--output", secret)
        hs = vela("admin", "tokens", "create", "--secret-key", secret, "--subject", "admin")
        broker.assert_refused(hs)
    finally:
        broker.stop()


def create_key_pair(directory, name):
    """`vela admin tokens create-key-pair` into DIRECTORY/NAME-{private,public}.key."""
    private = os.path.join(directory, name + "-private.key")
    public = os.path.join(directory, name + "-public.key")
    vela("admin", "tokens", "create-key-pair", "--output-private-key", private, "--output-public-key", public)
    return private, public


def test_key_pair_made_by_vela_admin_tokens():
    keys = tempfile.mkdtemp(prefix="vela-keys-")
    try:
        private, public = create_key_pair(keys, "broker")
        # Pulsar's files: raw DER, PKCS#8 and SubjectPublicKeyInfo, RSA 2048.
        with open(private, "rb") as f:
            private_key = serialization.load_der_private_key(f.read(), password=None)
        with open(public, "rb") as f:
            public_key = serialization.load_der_public_key(f.read())
        assert isinstance(private_key, rsa.RSAPrivateKey) and private_key.key_size == 2048
        assert public_key.public_numbers() == private_key.public_key().public_numbers()
        assert os.stat(private).st_mode & 0o777 == 0o600
        # Never overwritten.
        again = subprocess.run(
            [vela_binary(), "admin", "tokens", "create-key-pair",
             "--output-private-key", private, "--output-public-key", public + ".new"],
            capture_output=True, text=True,
        )
        assert again.returncode != 0 and "exists" in again.stderr, again.stderr
        assert not os.path.exists(public + ".new")
        other_private, _ = create_key_pair(keys, "other")

        broker = SecureBroker(key_pair=(private, public))
        try:
            broker.assert_round_trip("key-pair", b"signed with the new pair")
            # A token of another pair is refused, on the wire and over HTTPS.
            forged = vela("admin", "tokens", "create", "--private-key", other_private, "--subject", "admin")
            broker.assert_refused(forged)
            assert broker.http("GET", "/admin/v2/tenants", broker.admin_token)[0] == 200
        finally:
            broker.stop()
    finally:
        shutil.rmtree(keys, ignore_errors=True)
