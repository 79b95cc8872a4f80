"""TLS is verified unless the connection says not to: a server with a self-signed
certificate is refused with the reason, and accepted once verification is off."""

from __future__ import annotations

import datetime as dt
import ipaddress

import pytest

from engine import events as ev
from engine.remote.connection import RemoteConnection
from tests.engine.remote.remote_runner import RemoteRunner
from tests.engine.remote.server import start_server


def self_signed(folder):
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    key_path, cert_path = folder / "key.pem", folder / "cert.pem"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))  # fmt: skip
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_path, cert_path


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    server = start_server(tmp_path_factory, tls=self_signed(tmp_path_factory.mktemp("tls")))
    yield server
    server.stop()


def test_self_signed_certificate_is_refused_by_default(tls_server):
    r = RemoteRunner()
    try:
        failed = r.connect(RemoteConnection(tls_server.url))
    finally:
        r.close()
    assert isinstance(failed, ev.Failed)
    assert failed.message.startswith(
        f"The server at {tls_server.url} did not pass TLS verification"
    )
    assert "certificate verify failed" in failed.message


def test_verification_off_accepts_it(tls_server):
    r = RemoteRunner()
    try:
        loaded = r.connect(RemoteConnection(tls_server.url, verify_tls=False))
        assert isinstance(loaded, ev.ModelLoaded)
        finished, _ = r.generate([("user", "Hi")])
    finally:
        r.close()
    assert isinstance(finished, ev.Finished) and finished.text
