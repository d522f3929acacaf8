"""Several authentication providers at once, as the official clients' CI
configures Pulsar: token, Basic (an htpasswd file with APR1 and bcrypt
users) and TLS (the role is the CN of the client certificate, version 1
certificates included, as Pulsar's own test certificates are), plus an
anonymous role for clients without credentials, with authorization on; for
the Pulsar port and the admin API (Basic header, client certificates over
HTTPS). Certificates for clients are made with the openssl CLI (`x509 -req`
makes version 1 certificates); the broker's with `cryptography`."""

import base64
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.request
import uuid

import bcrypt
import pulsar
import pytest

from certs import make_ca, write_leaf
from pulsarframes import base_command, field_bytes, field_varint, read_command, simple_frame
from velaproc import Proc, vela_binary

AUTHENTICATION_ERROR = 3
READY = r"pulsar\+ssl://[0-9.]+:\d+"


def run(*args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout.strip()


def client_cert(directory, ca_cert, ca_key, cn, key_spec):
    """A version 1 client certificate for `cn`, signed by the client CA."""
    key, csr, cert = (os.path.join(directory, "%s.%s" % (cn, ext)) for ext in ("key", "csr", "pem"))
    run("openssl", "req", "-newkey", key_spec, "-nodes", "-keyout", key, "-out", csr,
        "-subj", "/O=Vela tests/CN=%s" % cn)
    run("openssl", "x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key,
        "-CAcreateserial", "-out", cert, "-days", "1")
    assert "Version: 1" in run("openssl", "x509", "-in", cert, "-noout", "-text")
    return cert, key


class MultiAuthBroker:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="vela-multiauth-")
        d = self.dir
        ca_key, ca_cert, self.ca_path = make_ca(d)
        self.cert_path, self.key_path = os.path.join(d, "broker.pem"), os.path.join(d, "broker.key")
        write_leaf(ca_key, ca_cert, self.cert_path, self.key_path)
        # The CA of client certificates (RSA, as Pulsar's test CA).
        self.client_ca = os.path.join(d, "client-ca.pem")
        self.client_ca_key = os.path.join(d, "client-ca.key")
        run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", self.client_ca_key,
            "-out", self.client_ca, "-subj", "/CN=vela-client-ca", "-days", "1")
        self.rsa_cert = client_cert(d, self.client_ca, self.client_ca_key, "cert-rsa", "rsa:2048")
        self.ec_cert = client_cert(d, self.client_ca, self.client_ca_key, "cert-ec", "ec:" + self._ec_params())
        apr1 = run("openssl", "passwd", "-apr1", "apr-secret")
        bcrypted = bcrypt.hashpw(b"bcrypt-secret", bcrypt.gensalt(5)).decode()
        self.htpasswd = os.path.join(d, "htpasswd")
        with open(self.htpasswd, "w") as f:
            f.write("apr:%s\nbc:%s\n" % (apr1, bcrypted))
        self.secret = os.path.join(d, "secret.key")
        run(vela_binary(), "admin", "tokens", "create-secret-key", "--output", self.secret)
        self.proc = Proc("multiauth-broker", [
            vela_binary(), "standalone", "--data-dir", os.path.join(d, "data"),
            "--port", "0", "--http-port", "0", "--tls-port", "0", "--https-port", "0",
            "--tls-cert-file", self.cert_path, "--tls-key-file", self.key_path,
            "--tls-trust-certs-file", self.client_ca,
            "--authentication-providers", "tls,token,basic",
            "--auth-token-secret-key", self.secret, "--basic-auth-conf", self.htpasswd,
            "--anonymous-user-role", "anonymous", "--superuser-roles", "admin",
        ], READY)
        self.tls_url = self.proc.find(READY)
        self.url = self.proc.find(r"pulsar://[0-9.]+:\d+")
        self.http_url = self.proc.find(r"http://[0-9.]+:\d+")
        self.https_url = self.proc.find(r"https://[0-9.]+:\d+")
        self.admin = self.token("admin")

    def _ec_params(self):
        path = os.path.join(self.dir, "p256.pem")
        run("openssl", "ecparam", "-name", "prime256v1", "-out", path)
        return path

    def token(self, role):
        return run(vela_binary(), "admin", "tokens", "create", "--secret-key", self.secret, "--subject", role)

    def http(self, method, path, headers=(), body=None, cert=None):
        base = self.https_url if cert else self.http_url
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(base + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for name, value in headers:
            req.add_header(name, value)
        context = None
        if cert:
            context = ssl.create_default_context(cafile=self.ca_path)
            context.load_cert_chain(*cert)
        try:
            with urllib.request.urlopen(req, timeout=10, context=context) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def client(self, tls=False, **kwargs):
        if tls:
            kwargs["tls_trust_certs_file_path"] = self.ca_path
        return pulsar.Client(self.tls_url if tls else self.url, operation_timeout_seconds=5,
                             logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error), **kwargs)

    def stop(self):
        self.proc.terminate()
        shutil.rmtree(self.dir, ignore_errors=True)


def basic_header(user, password):
    return ("Authorization", "Basic " + base64.b64encode(("%s:%s" % (user, password)).encode()).decode())


@pytest.fixture(scope="module")
def multi():
    b = MultiAuthBroker()
    bearer = [("Authorization", "Bearer " + b.admin)]
    b.open_ns = "public/open-" + uuid.uuid4().hex[:6]
    b.private_ns = "public/private-" + uuid.uuid4().hex[:6]
    for ns in (b.open_ns, b.private_ns):
        assert b.http("PUT", "/admin/v2/namespaces/" + ns, bearer)[0] == 204
    grants = {b.open_ns: ["anonymous"], b.private_ns: ["alice", "apr", "bc", "cert-rsa", "cert-ec"]}
    for ns, roles in grants.items():
        for role in roles:
            status, body = b.http("POST", "/admin/v2/namespaces/%s/permissions/%s" % (ns, role), bearer,
                                  ["produce", "consume"])
            assert status == 204, (status, body)
    yield b
    b.stop()


def round_trip(client, ns):
    topic = "persistent://%s/t-%s" % (ns, uuid.uuid4().hex[:8])
    consumer = client.subscribe(topic, "s")
    client.create_producer(topic).send(b"hello")
    assert consumer.receive(timeout_millis=5000).data() == b"hello"
    client.close()


def test_anonymous_role_is_authorized_like_any_role(multi):
    round_trip(multi.client(), multi.open_ns)
    client = multi.client()
    with pytest.raises(pulsar.AuthorizationError):
        client.create_producer("persistent://%s/nope" % multi.private_ns)
    client.close()
    # An auth method no provider has is anonymous too (Pulsar's rule).
    client = multi.client(authentication=pulsar.AuthenticationBasic("apr", "apr-secret", "unknown"))
    with pytest.raises(pulsar.AuthorizationError):
        client.create_producer("persistent://%s/nope" % multi.private_ns)
    client.close()


def test_token_basic_and_certificates_give_their_roles(multi):
    round_trip(multi.client(authentication=pulsar.AuthenticationToken(multi.token("alice"))), multi.private_ns)
    round_trip(multi.client(authentication=pulsar.AuthenticationBasic("apr", "apr-secret")), multi.private_ns)
    round_trip(multi.client(authentication=pulsar.AuthenticationBasic("bc", "bcrypt-secret")), multi.private_ns)
    for cert, key in (multi.rsa_cert, multi.ec_cert):
        round_trip(multi.client(tls=True, authentication=pulsar.AuthenticationTLS(cert, key)), multi.private_ns)
    # A certificate for TLS only, with Basic credentials: the Basic role.
    cert, key = multi.rsa_cert
    round_trip(multi.client(tls=True, tls_certificate_file_path=cert, tls_private_key_file_path=key,
                            authentication=pulsar.AuthenticationBasic("bc", "bcrypt-secret")),
               multi.private_ns)


def test_refused_credentials_are_never_anonymous(multi):
    for auth in (pulsar.AuthenticationBasic("apr", "wrong"), pulsar.AuthenticationBasic("nobody", "x"),
                 pulsar.AuthenticationToken("not-a-jwt")):
        client = multi.client(authentication=auth)
        # The C++ client takes the ERROR answering CONNECT as a disconnect.
        with pytest.raises((pulsar.ConnectError, pulsar.Timeout)):
            client.create_producer("persistent://%s/t" % multi.open_ns)
        client.close()
    # On the wire: Pulsar's ERROR(AuthenticationError, "Failed to authenticate").
    host, port = multi.url[len("pulsar://"):].split(":")
    import socket
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        body = field_bytes(1, "raw") + field_varint(4, 21) + field_bytes(3, "apr:wrong") + field_bytes(5, "basic")
        sock.sendall(simple_frame(base_command(2, 2, body)))
        cmd_type, fields = read_command(sock)
    assert cmd_type == 14 and fields[2] == [AUTHENTICATION_ERROR], (cmd_type, fields)
    assert fields[3] == [b"Failed to authenticate"]
    assert "apr-secret" not in multi.proc.log_text() and "wrong" not in multi.proc.log_text()


def test_admin_api_takes_basic_and_client_certificates(multi):
    tenants = "/admin/v2/tenants"
    ns_topics = "/admin/v2/namespaces/%s/topics" % multi.private_ns
    assert multi.http("GET", tenants, [("Authorization", "Bearer " + multi.admin)])[0] == 200
    assert multi.http("GET", ns_topics, [basic_header("apr", "apr-secret")])[0] == 200
    assert multi.http("GET", ns_topics, [basic_header("bc", "bcrypt-secret")])[0] == 200
    assert multi.http("GET", ns_topics, cert=multi.rsa_cert)[0] == 200
    assert multi.http("GET", ns_topics, cert=multi.ec_cert)[0] == 200
    # Without credentials, or with refused ones, HTTP falls back to the
    # anonymous role (Pulsar's AuthenticationService): 403, not 401.
    assert multi.http("GET", ns_topics)[0] == 403
    assert multi.http("GET", ns_topics, [basic_header("apr", "wrong")])[0] == 403
    assert multi.http("GET", tenants, [basic_header("apr", "apr-secret")])[0] == 403
    # An HTTP lookup with Basic credentials, as the client does with an http:// service URL.
    client = pulsar.Client(multi.http_url, authentication=pulsar.AuthenticationBasic("apr", "apr-secret"),
                           operation_timeout_seconds=5, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    round_trip(client, multi.private_ns)


def test_namespace_created_with_grants_in_its_policies(multi):
    # As the clients' CI creates `private/auth`: the grants ride in the
    # Policies body of the creating PUT (Pulsar stores auth_policies).
    ns = "public/granted-" + uuid.uuid4().hex[:6]
    body = {"auth_policies": {"namespace_auth": {"apr": ["produce", "consume"]}},
            "replication_clusters": ["standalone"]}
    status, reply = multi.http("PUT", "/admin/v2/namespaces/" + ns,
                               [("Authorization", "Bearer " + multi.admin)], body)
    assert status == 204, (status, reply)
    round_trip(multi.client(authentication=pulsar.AuthenticationBasic("apr", "apr-secret")), ns)
    client = multi.client(authentication=pulsar.AuthenticationBasic("bc", "bcrypt-secret"))
    with pytest.raises(pulsar.AuthorizationError):
        client.create_producer("persistent://%s/t" % ns)
    client.close()


def test_a_tenant_that_does_not_exist_is_topic_not_found(multi):
    # Pulsar's validateTenantAdminAccess: for any role but a superuser a
    # missing tenant is NOT_FOUND, before grants are looked at (the official
    # asyncio suite's test_create_producer_failure expects TopicNotFound).
    tenant = "no-tenant-" + uuid.uuid4().hex[:6]
    for auth in (None, pulsar.AuthenticationToken(multi.token("alice"))):
        client = multi.client(**({"authentication": auth} if auth else {}))
        with pytest.raises(pulsar.TopicNotFound):
            client.create_producer("persistent://%s/ns/t" % tenant)
        with pytest.raises(pulsar.TopicNotFound):
            client.subscribe("persistent://%s/ns/t" % tenant, "s")
        client.close()
    bearer = [("Authorization", "Bearer " + multi.token("alice"))]
    for method, path, body in (("GET", "/admin/v2/namespaces/%s" % tenant, None),
                               ("PUT", "/admin/v2/namespaces/%s/ns/schemaCompatibilityStrategy" % tenant, "FULL")):
        status, reply = multi.http(method, path, bearer, body)
        assert status == 404 and json.loads(reply)["reason"] == "Tenant does not exist", (status, reply)
    # A tenant that exists but is not the role's stays a refusal.
    client = multi.client(authentication=pulsar.AuthenticationToken(multi.token("alice")))
    with pytest.raises(pulsar.AuthorizationError):
        client.create_producer("persistent://%s/t" % multi.open_ns)
    client.close()
