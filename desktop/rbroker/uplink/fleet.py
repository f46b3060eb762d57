"""Read the group's fleet from the coordinator, or where in it there is room for N MiB: with a
viewer token, or signed by this computer's own key (architecture.md §7: every fleet read is
scoped to one group)."""

from __future__ import annotations

import ssl
import time
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ValidationError

from rbroker.uplink.config import UplinkConfig
from rbroker.uplink.enroll import http_verify, store_for
from rbroker.uplink.errors import UplinkError, detail_of, network_error
from rbroker.uplink.keyrings import os_account
from rbroker.uplink.keys import KeyStoreError, KeyUnreadable
from rbroker_protocol.fleet import FleetView, RoomView
from rbroker_protocol.signing import sign_request

FRESHNESS = ("online", "stale", "offline")


class FleetError(UplinkError):
    """The fleet could not be read; the message says why, the hints what to do (`str()`
    for the command line, `for_gui()` for the tray)."""


def refusal(status: int, detail: str, token: bool) -> FleetError:
    """A 401/403 from the fleet read in words: which credential was refused and why."""
    low = detail.lower()
    if token:
        what = "the coordinator did not accept the viewer token"
        if "unknown or revoked" in low:
            what += ": it is mistyped or was revoked"
        elif "malformed" in low:
            what += ": it is not in the form of a viewer token (cut short or mistyped?)"
        return FleetError(
            f"{what} (HTTP {status}: {detail})",
            "ask the coordinator's admin for a viewer token",
        )
    what = "the coordinator did not accept this computer's signature"
    cli = gui = ""
    if "timestamp" in low:
        what += ": this computer's clock is too far off"
        cli = gui = "set the clock right (NTP)"
    elif "unknown computer" in low or "revoked" in low:
        what += ": the coordinator does not know this computer (removed or revoked)"
        cli = "enroll again with a new code: rbroker enroll --new-identity URL CODE"
        gui = 'enroll again with a new code ("Enroll again" in Settings)'
    return FleetError(f"{what} (HTTP {status}: {detail})", cli, gui)


def fetch_fleet(
    data_dir: Path,
    url: str | None = None,
    token: str | None = None,
    ca_file: str | None = None,
    timeout_s: float = 10.0,
) -> dict[str, Any]:
    """`GET /api/v1/fleet` as a JSON object, checked against `rbroker_protocol.fleet.FleetView`
    (the coordinator's declared answer) and returned as sent.

    With `token`, a viewer token is sent (`url` required unless enrolled); otherwise the
    request is signed with this computer's key from `data_dir`'s enrollment.

    Raises:
        FleetError: not enrolled and no token, key unavailable, HTTP or network error, an
            answer that is not a `FleetView`.
    """
    body = _read(data_dir, "/api/v1/fleet", {}, url, token, ca_file, timeout_s)
    _check(body, FleetView, "fleet view")
    return body


def fetch_room(
    data_dir: Path,
    mib: int,
    gpus: int = 1,
    url: str | None = None,
    token: str | None = None,
    ca_file: str | None = None,
    timeout_s: float = 10.0,
) -> dict[str, Any]:
    """`GET /api/v1/fleet/room?mib=…&gpus=…` (the group's computers with `gpus` GPUs each
    having `mib` MiB available at their last report, freshest first: a view, never a
    placement or a reservation) as a JSON object, checked against
    `rbroker_protocol.fleet.RoomView` and returned as sent. Credentials as `fetch_fleet`.

    Raises:
        FleetError: as `fetch_fleet`; a query the coordinator refuses (HTTP 400) with its
            one-line reason; an answer that is not a `RoomView`.
    """
    params = {"mib": str(mib), "gpus": str(gpus)}
    body = _read(data_dir, "/api/v1/fleet/room", params, url, token, ca_file, timeout_s)
    _check(body, RoomView, "room view")
    return body


def _check(body: dict[str, Any], shape: type[BaseModel], what: str) -> None:
    """Raises FleetError naming the first field of `body` that does not fit `shape`."""
    try:
        shape.model_validate(body)
    except ValidationError as exc:  # a field missing or of the wrong type
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the view"
        raise FleetError(
            f"the coordinator's {what} is not what rbroker expects ({where}: {first['msg']})",
            "is the URL a rbroker coordinator of this version?",
        ) from None


def _read(
    data_dir: Path,
    path: str,
    params: dict[str, str],
    url: str | None,
    token: str | None,
    ca_file: str | None,
    timeout_s: float,
) -> dict[str, Any]:
    """`GET path?params` of the coordinator (the enrolled one unless `url`) with a viewer
    `token` or signed by this computer's key: the answer's JSON object.

    Raises:
        FleetError: not enrolled and no token, an enrollment that cannot be read or is
            refused (`UnsafeEnrollment`: another account could have written it), key
            unavailable, HTTP or network error, an answer that is not a JSON object.
    """
    try:
        config = UplinkConfig.load(data_dir)
    except ValueError as exc:  # its message names the file and the fix
        raise FleetError(str(exc)) from None
    base = (url or (config.url if config else "")).rstrip("/")
    if not base:
        raise FleetError(
            f"no enrollment in {data_dir}",
            "pass the broker's --data-dir, or --url and --token",
            "enroll this computer in Settings",
        )
    ca = ca_file or (config.ca_file if config else None)
    try:
        verify = http_verify(ca)
    except (OSError, ssl.SSLError) as exc:
        raise FleetError(
            f"cannot use the CA file {ca}: {exc}",
            "pass the coordinator's tls/ca.pem, a PEM certificate",
            "choose the coordinator's tls/ca.pem, a PEM certificate",
        ) from None
    target_url = httpx.URL(base + path, params=params)
    if token:
        headers = {"Authorization": f"Bearer {token}"}
    else:
        if config is None:
            raise FleetError(
                "this computer is not enrolled",
                "pass a viewer --token, or enroll",
                "enroll it in Settings",
            )
        try:
            key = store_for(config, data_dir).load()
        except KeyUnreadable as exc:
            # a user of a shared computer, whose key belongs to the system broker's account:
            # that key is not theirs to take (a chown would stop the broker reporting)
            owner = exc.owner or "the broker's account"
            raise FleetError(
                f"this computer's key in {data_dir} belongs to {owner}, the account its "
                f"broker runs as, and {os_account()} may not read it",
                "ask the coordinator's administrator for a viewer token and pass --url and "
                f"--token, or read the fleet as that account (sudo -u {owner} rbroker fleet "
                f"--data-dir {data_dir})",
                "ask the coordinator's administrator for a viewer token",
            ) from None
        except KeyStoreError as exc:
            raise FleetError(
                f"cannot read this computer's key: {exc}", "or pass a viewer --token", ""
            ) from None
        if key is None:
            raise FleetError(
                "this computer's private key is missing",
                "pass a viewer --token, or enroll again with --new-identity",
                'use "Enroll again" in Settings',
            )
        # sign the target as it goes on the wire: the base URL's path (a reverse proxy's
        # prefix, e.g. /rbroker) included, percent-encoded as httpx sends it
        target = target_url.raw_path.decode("ascii")
        headers = sign_request(key, config.computer_id, "GET", target, int(time.time()))
    try:
        response = httpx.get(target_url, headers=headers, verify=verify, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise FleetError(*network_error(exc, base)) from None
    if response.status_code in (401, 403):
        raise refusal(response.status_code, detail_of(response), bool(token))
    if response.status_code == 404:
        raise FleetError(
            f"the coordinator has no {path} (HTTP 404: {detail_of(response)})",
            "is the URL a rbroker coordinator of this version?",
        )
    if response.status_code != 200:
        raise FleetError(
            f"the coordinator answered HTTP {response.status_code}: {detail_of(response)}"
        )
    try:
        body = response.json()
    except ValueError:
        raise FleetError(
            "the coordinator's answer is not JSON",
            "is the URL a rbroker coordinator of this version?",
        ) from None
    if not isinstance(body, dict):
        raise FleetError("the coordinator's answer is not a JSON object")
    return body


def computers_from_fleet_view(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The coordinator's `GET /api/v1/fleet` answer (`fetch_fleet`) as a list of computers,
    each a plain dict (what the tray's Fleet tab and the demo read)::

        {"computer_id": str, "name": str,
         "freshness": "online" | "stale" | "offline", "last_seen_age_s": float | None,
         "gpus": [...fields of gpus.list...], "leases": [...fields of leases.list...],
         "queue": [...], "jobs": [...fields of jobs.list...]}

    A missing list is `[]`, an unknown freshness `"offline"`, a missing name the reported
    name or else the id."""
    out = []
    for c in body.get("computers") or []:
        fresh = c.get("freshness") or {}
        state = fresh.get("state", "offline")
        out.append(
            {
                "computer_id": str(c.get("id", "")),
                "name": str(c.get("name") or c.get("reported_name") or c.get("id", "")),
                "freshness": state if state in FRESHNESS else "offline",
                "last_seen_age_s": fresh.get("age_s"),
                "gpus": list(c.get("gpus") or []),
                "leases": list(c.get("leases") or []),
                "queue": list(c.get("queue") or []),
                "jobs": list(c.get("jobs") or []),
            }
        )
    return out
