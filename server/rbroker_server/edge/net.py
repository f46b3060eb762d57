"""The coordinator's network edge behind a reverse proxy: the client address of a request
(`X-Forwarded-For` believed only from configured trusted proxies) and the external path
prefix (`Settings.external_url`).

A proxy may pass requests on with the prefix (nginx `proxy_pass http://127.0.0.1:8787;`,
Caddy `handle /rbroker/*`) or without it (nginx `proxy_pass http://127.0.0.1:8787/;`, Caddy
`handle_path`); `PrefixStrip` removes a leading prefix so routes match either way, and the
signed-read check joins the prefix back on (`rbroker_protocol.signing.external_target`).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import unquote

from litestar.types import ASGIApp, Receive, Scope, Send

from rbroker_protocol.signing import canonical_target

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

STATE_TRUSTED = "trusted_proxies"
"""Key of the parsed trusted networks in the app's `state`."""
STATE_PROXY_SECRET = "trusted_proxy_secret"
"""Key of `Settings.trusted_proxy_secret` in the app's `state`."""
PROXY_SECRET_HEADER = b"x-rbroker-proxy-secret"
"""The header a trusted proxy sets to `trusted_proxy_secret` on every request it passes on
(nginx `proxy_set_header X-Rbroker-Proxy-Secret ...;`)."""


def parse_networks(entries: Iterable[str]) -> tuple[Network, ...]:
    """`["127.0.0.1", "10.0.0.0/8", "::1"]` → networks (a bare address is a /32 or /128).

    Raises:
        ValueError: an entry is neither an address nor a network.
    """
    return tuple(ipaddress.ip_network(e.strip(), strict=False) for e in entries)


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An address from a header entry: `1.2.3.4`, `1.2.3.4:5678`, `::1`, `[::1]:5678`."""
    text = text.strip().strip('"')
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def peer_ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """A peer's address as the server gives it (`1.2.3.4`, `::1`, `fe80::1%eth0`), an
    IPv4-mapped IPv6 address as IPv4; None for anything else (a Unix socket's name)."""
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def in_networks(
    addr: ipaddress.IPv4Address | ipaddress.IPv6Address, networks: Sequence[Network]
) -> bool:
    """`addr` (IPv4-mapped IPv6 read as IPv4) lies in one of `networks`."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return any(addr.version == n.version and addr in n for n in networks)


def forwarded_client(peer: str, forwarded_for: Sequence[str], trusted: Sequence[Network]) -> str:
    """The client address given the direct peer, the `X-Forwarded-For` header values (in
    order) and the trusted proxies.

    From an untrusted peer the header is ignored: the peer is the client. From a trusted
    peer the header's entries are read from the right (each proxy appends the address it
    received from): the first address that is not a trusted proxy is the client; when all
    are trusted, the leftmost. An entry that is not an IP address ends the walk at the last
    good hop, so a forged value never becomes a client address. The rule is the one of
    MDN's `X-Forwarded-For` guidance ("rightmost untrusted") and uvicorn's proxy headers.
    """
    current = _ip(peer)
    if current is None or not in_networks(current, trusted):
        return peer
    hops = [h for value in forwarded_for for h in value.split(",") if h.strip()]
    for hop in reversed(hops):
        addr = _ip(hop)
        if addr is None:
            break
        current = addr
        if not in_networks(addr, trusted):
            break
    return str(current)


def proxy_vouched(headers: Iterable[tuple[bytes, bytes]], secret: str) -> bool:
    """Whether a request's headers carry the trusted proxy's `secret` (always, when no secret
    is configured: then every process that can connect from a trusted address is believed
    like the proxy). Compared in constant time."""
    if not secret:
        return True
    want = secret.encode()
    return any(
        k.lower() == PROXY_SECRET_HEADER and hmac.compare_digest(v.strip(), want)
        for k, v in headers
    )


def scope_client(scope: Any, trusted: Sequence[Network], secret: str = "") -> str:
    """The client address of an ASGI `scope`: the peer, or from a trusted peer that also
    sends the proxy `secret` (when one is configured), `forwarded_client`'s answer; '' when
    the server gives no peer."""
    client = scope.get("client")
    peer = str(client[0]) if client else ""
    if not trusted or not peer:
        return peer
    headers = scope.get("headers", ())
    if not proxy_vouched(headers, secret):
        return peer
    values = [v.decode("latin-1") for k, v in headers if k.lower() == b"x-forwarded-for"]
    return forwarded_client(peer, values, trusted)


def client_address(request: Any) -> str:
    """The address of the client behind `request` (a Litestar `Request` or any ASGI
    connection): `X-Forwarded-For` is used only when the direct peer is one of the app's
    `trusted_proxies` (`Settings.trusted_proxies`) and, when `trusted_proxy_secret` is set,
    the request carries it; '' when the server gives no peer."""
    trusted: Sequence[Network] = request.app.state.get(STATE_TRUSTED, ())
    secret: str = request.app.state.get(STATE_PROXY_SECRET, "")
    return scope_client(request.scope, trusted, secret)


def limit_key(address: str) -> str:
    """The network a rate limit counts `address` under: its /24 for IPv4, its /64 for IPv6
    (IPv4-mapped IPv6 as IPv4), so rotating addresses inside one network (127.0.x.y is all
    local, a host picks any address of its /64) shares one limit; anything else as given."""
    addr = peer_ip(address)
    if addr is None:
        return address
    prefix = 24 if addr.version == 4 else 64
    return str(ipaddress.ip_network((addr, prefix), strict=False))


class PrefixStrip:
    """ASGI wrapper: a request whose path starts with `prefix` (a percent-encoded path like
    `/rbroker`) is routed without it, so the same app serves behind a proxy that keeps the
    prefix and behind one that removes it; either way `root_path` is the prefix, so that
    redirects, links, form actions and cookie paths carry it (the browser only ever sees
    the external URL, whatever the proxy passed on)."""

    def __init__(self, app: ASGIApp, prefix: str) -> None:
        self.app = app
        self.prefix = canonical_target(prefix).rstrip("/")
        self.root_path = unquote(self.prefix)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.prefix and scope["type"] in ("http", "websocket"):
            raw = scope.get("raw_path") or scope["path"].encode()
            target = canonical_target(raw.decode("utf-8", "surrogateescape"))
            root = scope.get("root_path", "") + self.root_path
            if target == self.prefix or target.startswith(self.prefix + "/"):
                rest = target[len(self.prefix) :] or "/"
                scope = {  # type: ignore[assignment]
                    **scope,
                    "path": unquote(rest, errors="surrogateescape"),
                    "raw_path": rest.encode("ascii"),
                    "root_path": root,
                }
            else:  # a proxy that strips the prefix: the browser still sees it
                scope = {**scope, "root_path": root}  # type: ignore[assignment]
        await self.app(scope, receive, send)
