"""`rbroker enroll URL CODE`: join a coordinator group with a new Ed25519 identity."""

from __future__ import annotations

import contextlib
import functools
import ssl
from dataclasses import fields
from pathlib import Path
from typing import Any

import httpx
import nacl.signing

from rbroker.uplink.config import UplinkConfig
from rbroker.uplink.errors import UplinkError, detail_of, network_error
from rbroker.uplink.keys import FileKeyStore, KeyringKeyStore, KeyStore, KeyStoreError
from rbroker_protocol.enroll import EnrollRequest, EnrollResponse
from rbroker_protocol.signing import public_key_b64


class EnrollError(UplinkError):
    """Enrollment failed; the message says why, the hints what to do (`str()` for the
    command line, `for_gui()` for the tray)."""


REFUSED = {
    400: "the coordinator refused the request",
    401: "the enrollment code is not valid: it is mistyped, already used, revoked or expired",
    409: "this public key is already enrolled",
}
"""What an enrollment refusal means, by HTTP status (the server's detail follows)."""


def http_verify(ca_file: str | None) -> ssl.SSLContext:
    """httpx's `verify`: a context trusting the pinned CA file, else httpx's own default
    (certifi's bundle, or `SSL_CERT_FILE` / `SSL_CERT_DIR`), made once per process.

    Raises:
        OSError, ssl.SSLError: the CA file cannot be read or is not a PEM certificate.
    """
    return ssl.create_default_context(cafile=ca_file) if ca_file else _default_trust()


@functools.cache
def _default_trust() -> ssl.SSLContext:
    """What httpx makes for `verify=True`, kept: loading the bundle took about 30 ms of CPU
    at every request of a new client (issue 44: the tray's fleet read every 15 s)."""
    return httpx.create_ssl_context()


def enroll(
    url: str,
    code: str,
    name: str,
    data_dir: Path,
    ca_file: str | None = None,
    key_file: bool = False,
    new_identity: bool = False,
    timeout_s: float = 15.0,
    notes: list[str] | None = None,
) -> UplinkConfig:
    """Create a key pair, keep the private key, register the public key, save the config.

    Never replaces an identity silently: when this data dir is already enrolled, it
    refuses unless `new_identity` (and then the coordinator shows a second computer). A new
    identity takes what this call gives (URL, name, key store, CA file: `ASKED`) and keeps
    the previous enrollment's other settings (`report_interval_s`, a newer version's keys).
    The key goes into an accepted OS keyring (see `rbroker.uplink.keyrings.judge`) or, with
    `key_file`, a 0600 file; after success an unencrypted copy of this data dir's old key
    left in a plaintext keyring backend is deleted, and so is the old identity's key in the
    other store when the new key went elsewhere (the old `computer.key` file, or the old
    keyring entry); `notes` (when given) says what was removed.

    Raises:
        EnrollError: already enrolled, the key cannot be stored, or the coordinator refused.
    """
    url = url.rstrip("/")
    try:
        verify = http_verify(ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise EnrollError(
            f"cannot use the CA file {ca_file}: {exc}",
            "pass the coordinator's tls/ca.pem, a PEM certificate",
            "choose the coordinator's tls/ca.pem, a PEM certificate",
        ) from None
    try:
        existing = UplinkConfig.load(data_dir)
    except ValueError as exc:
        raise EnrollError(f"{exc}; fix or remove it first") from None
    store: KeyStore = (
        FileKeyStore(data_dir / "computer.key") if key_file else KeyringKeyStore(data_dir)
    )
    if existing is not None and not new_identity:
        try:
            old = store_for(existing, data_dir).load()
        except KeyStoreError as exc:
            old, why = None, str(exc)
        else:
            why = "it is missing"
        if old is None:
            raise EnrollError(
                f"this computer is already enrolled as {existing.computer_id} at "
                f"{existing.url}, but its private key cannot be read ({why})",
                "restore the key, or enroll again with --new-identity (the coordinator will "
                "then show a second computer; revoke the old one there)",
                'restore the key, or use "Enroll again" (the coordinator will then show a '
                "second computer; revoke the old one there)",
            )
        raise EnrollError(
            f"this computer is already enrolled as {existing.computer_id} at {existing.url} "
            f"(group {existing.group})",
            "use --new-identity to enroll it again",
            'use "Enroll again" to enroll it with a new identity',
        )
    previous: nacl.signing.SigningKey | None = None
    if new_identity:  # the old key comes back if this enrollment fails
        try:
            with contextlib.suppress(KeyStoreError):
                previous = store.load()
            store.delete()
        except KeyStoreError as exc:
            raise EnrollError(str(exc)) from None
    key = nacl.signing.SigningKey.generate()
    try:
        store.save(key)
    except KeyStoreError as exc:  # nothing was stored (a key already there stays)
        if previous is not None:
            with contextlib.suppress(KeyStoreError):
                store.save(previous)
        raise EnrollError(str(exc)) from None
    try:
        response = httpx.post(
            f"{url}/api/v1/enroll",
            # the declared shape, unchecked here: the coordinator checks it and says what is wrong
            json=EnrollRequest.model_construct(
                code=code, name=name, public_key=public_key_b64(key)
            ).model_dump(),
            verify=verify,
            timeout=timeout_s,
        )
    except httpx.HTTPError as exc:
        _undo(store, previous)
        raise EnrollError(*network_error(exc, url)) from None
    if response.status_code != 201:
        _undo(store, previous)
        detail = detail_of(response)
        what = REFUSED.get(response.status_code, "the coordinator refused the enrollment")
        hint = "ask the coordinator's admin for a new code" if response.status_code == 401 else ""
        raise EnrollError(f"{what} (HTTP {response.status_code}: {detail})", hint)
    try:
        answer = EnrollResponse.model_validate(response.json())
    except ValueError as exc:  # not JSON, or not the declared shape
        _undo(store, previous)
        first = str(exc).splitlines()[0]
        raise EnrollError(
            f"the coordinator's answer to the enrollment is not what rbroker expects ({first})",
            "is the URL a rbroker coordinator of this version?",
        ) from None
    config = UplinkConfig(
        url=url,
        computer_id=answer.computer_id,
        group=answer.group,
        name=name,
        key_backend="file" if key_file else "keyring",
        ca_file=str(Path(ca_file).resolve()) if ca_file else None,
        **_kept(existing),
    )
    config.save(data_dir)
    removed = KeyringKeyStore(data_dir).forget_plaintext_copies()
    if removed and notes is not None:
        notes.append(f"removed the old identity's unencrypted key from {', '.join(removed)}")
    if existing is not None and existing.key_backend != config.key_backend:
        # the old identity's key lived in the other store: no key of a revoked identity
        # stays behind (a `computer.key` file when the new key went to the keyring)
        old_store = store_for(existing, data_dir)
        try:
            where = old_store.where()
            old_store.delete()
        except KeyStoreError:
            # a keyring this account may not use (refused or gone): nothing there is read
            # by rbroker, and a plaintext copy of the key was removed just above
            pass
        else:
            if notes is not None:
                notes.append(f"removed the old identity's key from {where}")
    return config


ASKED = frozenset({"url", "computer_id", "group", "name", "key_backend", "ca_file"})
"""The settings of `uplink.json` an enrollment sets; a new identity keeps the others."""


def _kept(existing: UplinkConfig | None) -> dict[str, Any]:
    """The previous enrollment's settings that a new identity keeps: those not in `ASKED`
    (`report_interval_s`, `extra`), by field name; none without a previous enrollment."""
    if existing is None:
        return {}
    return {f.name: getattr(existing, f.name) for f in fields(existing) if f.name not in ASKED}


def _undo(store: KeyStore, previous: nacl.signing.SigningKey | None) -> None:
    """Remove the key of a failed enrollment and put back the one it replaced."""
    with contextlib.suppress(KeyStoreError):
        store.delete()
        if previous is not None:
            store.save(previous)


def store_for(config: UplinkConfig, data_dir: Path) -> KeyStore:
    """The key store an enrolled config uses."""
    if config.key_backend == "file":
        return FileKeyStore(data_dir / "computer.key")
    return KeyringKeyStore(data_dir)
