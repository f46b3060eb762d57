"""A self-signed CA and a server certificate for `rbroker-server setup --self-signed`.

The CA's private key is never written: it signs the one server certificate and is
discarded, so it can sign nothing else. Computers trust `ca.pem` (copy it to them).
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from rbroker_protocol.files import private_dir

CA_DAYS = 3650
SERVER_DAYS = 825


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Paths of the generated PEM files."""

    ca_cert: Path
    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "rbroker coordinator"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64]),
        ]
    )


def _san(hostname: str, extra: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    seen: set[str] = set()
    for name in [hostname, "localhost", "127.0.0.1", "::1", *extra]:
        if not name or name in seen:
            continue
        seen.add(name)
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write `data` to `path` with exactly `mode`, whatever the umask (and the mode an
    existing file had): created with it, then set again, since the umask narrows only."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags, mode)
    with os.fdopen(fd, "wb") as f:
        if hasattr(os, "fchmod"):
            os.fchmod(f.fileno(), mode)
        f.write(data)


CERT_MODE = 0o644
"""Mode of the written certificates (public: readable, writable by the owner only)."""
KEY_MODE = 0o600
"""Mode of the written private key."""


def generate_self_signed(
    directory: Path, hostname: str, extra_names: list[str] | None = None
) -> TlsFiles:
    """Write `ca.pem` and `server.pem` (0644) and `server.key` (0600) into `directory`
    (0700), whatever the umask.

    The server certificate names `hostname`, `localhost`, 127.0.0.1, ::1 and `extra_names`
    (DNS names or IP addresses).
    """
    private_dir(directory)
    now = datetime.now(UTC) - timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"rbroker coordinator CA ({hostname})")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hostname))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + timedelta(days=SERVER_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(_san(hostname, extra_names or []), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    files = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    _write(files.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM), CERT_MODE)
    _write(files.cert, cert.public_bytes(serialization.Encoding.PEM), CERT_MODE)
    _write(
        files.key,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        KEY_MODE,
    )
    return files
