"""A private redis-server that speaks only TLS and knows one ACL user, for tests.

Certificates are made here: with the ``cryptography`` package when it is installed, else with
the ``openssl`` command line. The server listens on a free loopback port with ``--tls-port``
and ``--port 0`` (no plain port), the default user is switched off, and one ACL user with a
password may use every key and channel (what Celery's broker and schedproj's state need).
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certs:
    ca: Path
    cert: Path
    key: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def make_certs(directory: Path, name: str = "test") -> Certs:
    """A CA and a server certificate it signed, for 127.0.0.1 and localhost."""
    directory.mkdir(parents=True, exist_ok=True)
    certs = Certs(directory / f"{name}-ca.pem", directory / f"{name}-server.pem",
                  directory / f"{name}-server.key")
    try:
        import cryptography  # noqa: F401
    except ImportError:
        _make_with_openssl(certs, name)
    else:
        _make_with_cryptography(certs, name)
    return certs


def _make_with_cryptography(certs: Certs, name: str) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"schedproj {name} CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
                critical=False)
            .sign(ca_key, hashes.SHA256()))
    certs.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    certs.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    certs.key.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                            serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption()))


def _make_with_openssl(certs: Certs, name: str) -> None:
    openssl = shutil.which("openssl")
    assert openssl, "neither the cryptography package nor the openssl command is available"
    d = certs.ca.parent
    ca_key, csr, ext = d / f"{name}-ca.key", d / f"{name}-server.csr", d / f"{name}-ext.cnf"

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True)

    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(ca_key), "-out", str(certs.ca), "-days", "1",
        "-subj", f"/CN=schedproj {name} CA")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(certs.key), "-out", str(csr), "-subj", "/CN=127.0.0.1")
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", str(csr), "-CA", str(certs.ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(certs.cert), "-days", "1", "-extfile", str(ext))


@dataclass
class TlsRedis:
    """A running TLS-only redis-server with one ACL user."""

    port: int
    certs: Certs
    user: str
    password: str
    process: subprocess.Popen[bytes]
    log: Path

    def url(self, *, scheme: str = "rediss", password: str | None = None, db: int = 0) -> str:
        return (f"{scheme}://{self.user}:{self.password if password is None else password}"
                f"@127.0.0.1:{self.port}/{db}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_tls_redis(directory: Path, user: str, password: str) -> TlsRedis:
    """Start redis-server with ``--tls-port`` only and the ACL user; wait until it answers."""
    binary = shutil.which("redis-server")
    assert binary, "redis-server is not installed"
    certs = make_certs(directory / "certs")
    port = free_port()
    log = directory / "redis-tls.log"
    process = subprocess.Popen(
        [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(certs.cert), "--tls-key-file", str(certs.key),
         "--tls-ca-cert-file", str(certs.ca), "--tls-auth-clients", "no",
         "--save", "", "--appendonly", "no", "--dir", str(directory),
         "--logfile", str(log),
         "--user", "default", "off",
         "--user", user, "on", f">{password}", "~*", "&*", "+@all"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = TlsRedis(port, certs, user, password, process, log)
    context = ssl.create_default_context(cafile=str(certs.ca))
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as raw, \
                    context.wrap_socket(raw, server_hostname="127.0.0.1"):
                return server
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                server.stop()
                text = log.read_text() if log.exists() else ""
                raise AssertionError(f"TLS redis-server did not start: {text[-2000:]}") from None
            time.sleep(0.05)
