"""Credentials: a bearer token against a cluster with access control on
(``raftlockd dev --acl-file``), and TLS with a client certificate
(mutual TLS) against a one-node cluster run with ``--tls-*``."""

import asyncio
import time

import pytest

import raftlock
import raftlock.aio

from conftest import Cluster

ACL = """
peer_token = "python-suite-peer-token"

[[token]]
identity = "billing"
token = "billing-token"

[[rule]]
identity = "billing"
allow = "lock"
prefix = "billing/"

[[rule]]
identity = "billing"
allow = "read"
prefix = "billing/"
"""


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("acl"), nodes=1, acl=ACL)
    yield c
    c.stop()


def test_a_token_opens_what_its_rules_allow(acl_cluster):
    with raftlock.Client(acl_cluster.endpoints, token="billing-token") as c:
        with c.lock("billing/invoice-7", timeout=0) as lock:
            assert c.check_fence("billing/invoice-7", lock.fence)
        with pytest.raises(raftlock.PermissionDenied):
            c.lock("payroll/run", timeout=0).acquire()
        # The keep-alive stream carries the token too: a 1 s lease held
        # for 2 s stays valid.
        with c.lock("billing/long", ttl=1.0, timeout=0) as lock:
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                assert not lock.lost
                time.sleep(0.1)


def test_a_missing_or_unknown_token_is_unauthenticated(acl_cluster):
    for token in (None, "not-a-token"):
        with raftlock.Client(acl_cluster.endpoints, token=token) as c:
            with pytest.raises(raftlock.Unauthenticated):
                c.lock("billing/invoice-7", timeout=0).acquire()


def test_the_asyncio_client_sends_the_token_too(acl_cluster):
    async def main():
        async with raftlock.aio.Client(acl_cluster.endpoints, token="billing-token") as c:
            async with c.lock("billing/async", timeout=0) as lock:
                assert lock.fence
        async with raftlock.aio.Client(acl_cluster.endpoints) as c:
            with pytest.raises(raftlock.Unauthenticated):
                await c.lock("billing/async", timeout=0).acquire()

    asyncio.run(main())


# ------------------------------------------------------------------- TLS

def _certs(dir):
    """A CA, a node certificate for 127.0.0.1 and a client certificate
    (CN python-client), PEM files in ``dir``."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write(stem, cert, key):
        (dir / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (dir / f"{stem}.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("python-suite-ca")).issuer_name(name("python-suite-ca"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    write("ca", ca, ca_key)
    for stem, cn, sans in (("node", "raftlock-node", [x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                       x509.DNSName("localhost")]),
                           ("client", "python-client", [x509.DNSName("python-client")])):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(ca.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .sign(ca_key, hashes.SHA256()))
        write(stem, cert, key)


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory):
    """One node serving clients over TLS and requiring client certificates."""
    import subprocess
    import time

    from conftest import free_run, raftlockd

    dir = tmp_path_factory.mktemp("tls")
    _certs(dir)
    for _ in range(5):
        port = free_run(1)
        addr = f"127.0.0.1:{port}"
        log = open(dir / f"node-{port}.log", "w")
        proc = subprocess.Popen(
            [raftlockd(), "run", "--id", "1", "--listen", addr, "--peers", f"1={addr}", "--init",
             "--data-dir", str(dir / f"data-{port}"), "--tls-cert", str(dir / "node.pem"),
             "--tls-key", str(dir / "node.key"), "--tls-ca", str(dir / "ca.pem"), "--tls-client-auth"],
            stdout=log, stderr=log)
        c = raftlock.Client(addr, ca=str(dir / "ca.pem"), cert=str(dir / "client.pem"), key=str(dir / "client.key"))
        deadline = time.monotonic() + 30
        ready = False
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                c.describe("ready?")
                ready = True
                break
            except raftlock.RaftlockError:
                time.sleep(0.1)
        c.close()
        if ready:
            break
        proc.kill()
        proc.wait()
    else:
        raise RuntimeError(f"the TLS node did not start: {(dir / f'node-{port}.log').read_text()[-2000:]}")
    yield addr, dir
    proc.terminate()
    proc.wait(10)


def test_mutual_tls_with_a_client_certificate(tls_node):
    addr, dir = tls_node
    with raftlock.Client(addr, ca=dir / "ca.pem", cert=(dir / "client.pem").read_bytes(),
                         key=(dir / "client.key").read_text()) as c:
        with c.lock("tls/one", ttl=1.0, timeout=0) as lock:
            assert c.check_fence("tls/one", lock.fence)


def test_the_asyncio_client_over_mutual_tls(tls_node):
    addr, dir = tls_node

    async def main():
        async with raftlock.aio.Client(addr, ca=dir / "ca.pem", cert=dir / "client.pem", key=dir / "client.key") as c:
            async with c.lock("tls/async", timeout=0) as lock:
                assert lock.fence

    asyncio.run(main())


def test_without_a_client_certificate_or_the_ca_nothing_is_served(tls_node):
    addr, dir = tls_node
    # TLS without a client certificate: the node refuses the handshake.
    with raftlock.Client(addr, ca=dir / "ca.pem") as c:
        with pytest.raises((raftlock.Unavailable, raftlock.Unauthenticated)):
            c.lock("tls/none", timeout=0).acquire()
    # Plaintext to a TLS port: no answer a client could take for one.
    with raftlock.Client(addr) as c:
        with pytest.raises(raftlock.Unavailable):
            c.lock("tls/none", timeout=0).acquire()
