"""Bearer secrets (viewer tokens, enrollment codes): made once, shown once, kept hashed.

A credential reads ``<prefix>_<id>_<secret>``: the id finds the row, the SHA-256 of the
secret is compared in constant time. Only the hash is stored.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import Final

VIEWER_PREFIX: Final = "rbv"
ENROLL_PREFIX: Final = "rbe"
_FORMAT: Final = re.compile(r"^(rb[a-z])_([0-9a-f]{12})_([A-Za-z0-9_-]{20,100})$")


@dataclass(frozen=True, slots=True)
class Credential:
    """A parsed or new credential; `text` is what the person copies (shown once)."""

    prefix: str
    id: str
    secret: str

    @property
    def text(self) -> str:
        return f"{self.prefix}_{self.id}_{self.secret}"

    @property
    def secret_hash(self) -> str:
        return hash_secret(self.secret)


def new_credential(prefix: str) -> Credential:
    """A fresh credential with a 12-hex-digit id and a 192-bit secret."""
    return Credential(prefix, secrets.token_hex(6), secrets.token_urlsafe(24))


def parse_credential(prefix: str, text: str) -> Credential | None:
    """The credential in `text` when it is well-formed and has `prefix`, else None."""
    m = _FORMAT.match(text.strip())
    if m is None or m.group(1) != prefix:
        return None
    return Credential(prefix, m.group(2), m.group(3))


def hash_secret(secret: str) -> str:
    """SHA-256 hex of the secret (the secrets are random, so no salt or stretching is needed)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def secret_matches(credential: Credential, stored_hash: str) -> bool:
    """Constant-time comparison of the credential's hash with the stored one."""
    return hmac.compare_digest(credential.secret_hash.encode(), stored_hash.encode())
