"""The coordinator behind a reverse proxy: an external path prefix from `external_url`
(signed reads verified against it, routes found with or without it) and client addresses
from `X-Forwarded-For` only when the direct peer is a trusted proxy. Real HTTP to a real
uvicorn server; the proxy's part is played by sending what a proxy sends."""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable

import httpx
import pytest

from rbroker_server.edge.net import forwarded_client, parse_networks
from rbroker_server.settings import Settings
from tests.server.conftest import Coordinator


@pytest.fixture
def behind_prefix(coordinator_factory: Callable[..., Coordinator]) -> Coordinator:
    c = coordinator_factory(external_url="https://lab.example.org/lab%20tools/rbroker/")
    c.group("alpha")
    return c


def test_signed_read_through_a_stripping_and_a_keeping_proxy(behind_prefix: Coordinator) -> None:
    c = behind_prefix
    a = c.enroll("alpha")  # enrollment needs no signature: routes match without the prefix
    signed_for = httpx.URL("https://lab.example.org/lab tools/rbroker/api/v1/fleet").raw_path
    assert signed_for == b"/lab%20tools/rbroker/api/v1/fleet"
    # a proxy that removes the prefix (nginx `proxy_pass http://127.0.0.1:8787/;`)
    headers = a.signed_headers("GET", signed_for.decode())
    r = c.http.get("/api/v1/fleet", headers=headers)
    assert r.status_code == 200, r.text
    assert [x["id"] for x in r.json()["computers"]] == [a.id]
    # a proxy that passes the prefix on (nginx `proxy_pass http://127.0.0.1:8787;`)
    headers = a.signed_headers("GET", "/lab%20tools/rbroker/api/v1/fleet")
    r = c.http.get("/lab%20tools/rbroker/api/v1/fleet", headers=headers)
    assert r.status_code == 200, r.text
    # lower-case hex in the client's URL signs the same
    headers = a.signed_headers("GET", "/lab%20tools/rbroker/api/v1/fleet".lower())
    assert c.http.get("/api/v1/fleet", headers=headers).status_code == 200
    # a signature over the path without the prefix does not hold behind the prefix
    headers = a.signed_headers("GET", "/api/v1/fleet")
    r = c.http.get("/api/v1/fleet", headers=headers)
    assert r.status_code == 401, r.text
    assert "signature" in r.text
    # viewer tokens do not depend on the path
    r = c.http.get("/lab%20tools/rbroker/api/v1/fleet", headers=c.viewer("alpha"))
    assert r.status_code == 200
    assert c.http.get("/lab%20tools/rbroker/healthz").status_code == 200
    assert c.http.get("/other/api/v1/fleet", headers=c.viewer("alpha")).status_code == 404


def test_signed_read_at_the_root(coordinator_factory: Callable[..., Coordinator]) -> None:
    c = coordinator_factory()
    c.group("alpha")
    a = c.enroll("alpha")
    assert a.get("/api/v1/fleet").status_code == 200
    headers = a.signed_headers("GET", "/rbroker/api/v1/fleet")
    assert c.http.get("/api/v1/fleet", headers=headers).status_code == 401


def test_settings_check_external_url_and_proxies(tmp_path) -> None:  # type: ignore[no-untyped-def]
    s = Settings(data_dir=tmp_path, external_url="https://lab.example.org/rbroker/")
    assert s.root_path == "/rbroker"
    assert s.base_url == "https://lab.example.org/rbroker"
    assert Settings(data_dir=tmp_path).root_path == ""
    for bad in ("lab.example.org/rbroker", "ftp://x/", "https://x/r?y=1"):
        with pytest.raises(ValueError, match="external_url"):
            Settings(data_dir=tmp_path, external_url=bad)
    with pytest.raises(ValueError, match="not an IP address"):
        Settings(data_dir=tmp_path, trusted_proxies=("proxy.local",))
    saved = Settings(
        data_dir=tmp_path,
        external_url="https://lab.example.org/rbroker/",
        trusted_proxies=("127.0.0.1", "10.0.0.0/8", "::1"),
    )
    saved.save()
    assert Settings.load(tmp_path) == saved


TRUSTED = parse_networks(["127.0.0.1", "10.0.0.0/8", "::1"])


@pytest.mark.parametrize(
    ("peer", "forwarded", "client"),
    [
        ("203.0.113.9", ["198.51.100.1"], "203.0.113.9"),  # untrusted peer: header ignored
        ("127.0.0.1", [], "127.0.0.1"),  # trusted peer without a header
        ("127.0.0.1", ["198.51.100.1"], "198.51.100.1"),
        ("127.0.0.1", ["6.6.6.6, 198.51.100.1"], "198.51.100.1"),  # forged left entry
        ("127.0.0.1", ["198.51.100.1, 10.1.2.3"], "198.51.100.1"),  # two proxies
        ("127.0.0.1", ["198.51.100.1", "10.1.2.3"], "198.51.100.1"),  # header given twice
        ("127.0.0.1", ["10.0.0.7, 10.1.2.3"], "10.0.0.7"),  # all trusted: leftmost
        ("127.0.0.1", ["not-an-ip"], "127.0.0.1"),  # garbage never becomes the client
        ("127.0.0.1", ["198.51.100.1, junk, 10.1.2.3"], "10.1.2.3"),
        ("::1", ["2001:db8::5"], "2001:db8::5"),
        ("::ffff:127.0.0.1", ["[2001:db8::5]:4711"], "2001:db8::5"),
        ("127.0.0.1", ["198.51.100.1:5555"], "198.51.100.1"),
    ],
)
def test_forwarded_client(peer: str, forwarded: list[str], client: str) -> None:
    assert forwarded_client(peer, forwarded, TRUSTED) == client
    ipaddress.ip_address(client)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _refused_enrollment_address(c: Coordinator, forwarded: str) -> str:
    """The client address the coordinator logs for a refused enrollment (a handler on the
    module's own logger: the app's logging setup replaces the root logger's handlers)."""
    logger = logging.getLogger("rbroker_server.enroll.controller")
    records = _Records()
    logger.addHandler(records)
    try:
        r = c.http.post(
            "/api/v1/enroll",
            json={"code": "rbe_nope_nope", "name": "x", "public_key": "A" * 43 + "="},
            headers={"X-Forwarded-For": forwarded},
        )
    finally:
        logger.removeHandler(records)
    assert r.status_code in (400, 401), r.text
    lines = [m for m in records.messages if "refused" in m]
    assert len(lines) == 1, records.messages
    return lines[0].rsplit(" ", 1)[-1]


def test_log_names_the_forwarded_client_only_behind_a_trusted_proxy(
    coordinator_factory: Callable[..., Coordinator],
) -> None:
    trusting = coordinator_factory(trusted_proxies=("127.0.0.1",))
    assert _refused_enrollment_address(trusting, "198.51.100.23") == "198.51.100.23"
    assert _refused_enrollment_address(trusting, "6.6.6.6, 198.51.100.23") == "198.51.100.23"
    untrusting = coordinator_factory(trusted_proxies=("10.0.0.0/8",))
    assert _refused_enrollment_address(untrusting, "198.51.100.23") == "127.0.0.1"
    default = coordinator_factory()
    assert _refused_enrollment_address(default, "198.51.100.23") == "127.0.0.1"


@pytest.mark.parametrize("kept", [True, False], ids=["prefix-kept", "prefix-stripped"])
def test_the_web_view_carries_the_prefix_whether_the_proxy_keeps_or_strips_it(
    behind_prefix: Coordinator, kept: bool
) -> None:
    """nginx `proxy_pass http://127.0.0.1:8787;` keeps `/lab%20tools/rbroker`, `proxy_pass
    http://127.0.0.1:8787/;` strips it: either way the browser gets redirects, form
    actions, links and cookie paths under the external prefix, and the schema page links
    the schema under it."""
    c = behind_prefix
    prefix = "/lab%20tools/rbroker"
    at = prefix if kept else ""
    http = httpx.Client(base_url=c.url, timeout=30)
    r = http.get(f"{at}/")
    assert r.status_code == 303 and r.headers["location"] == f"{prefix}/signin"
    assert http.head(f"{at}/").headers["location"] == f"{prefix}/signin"
    form = http.get(f"{at}/signin")
    assert form.status_code == 200
    assert f'action="{prefix}/signin"' in form.text
    assert f'href="{prefix}/static/app.css"' in form.text
    assert f"Path={prefix}" in form.headers["set-cookie"]
    csrf = form.text.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
    csrf_cookie = form.headers["set-cookie"].split(";")[0]
    r = http.post(  # Secure cookies: a browser sends them over https, httpx here needs help
        f"{at}/signin",
        data={"token": c.tokens["alpha"], "csrf_token": csrf},
        headers={"cookie": csrf_cookie},
    )
    assert r.status_code == 303 and r.headers["location"] == f"{prefix}/fleet", r.text
    cookies = r.headers.get_list("set-cookie")
    assert cookies and all(f"Path={prefix}" in x for x in cookies), cookies
    session = next(x.split(";")[0] for x in cookies if x.startswith("rbroker_session="))
    page = http.get(f"{at}/fleet", headers={"cookie": session})
    assert page.status_code == 200
    assert f'data-refresh-url="{prefix}/fleet/live"' in page.text
    assert f'action="{prefix}/signout"' in page.text
    docs = http.get(f"{at}/schema")
    assert docs.status_code == 200
    assert f'href="{prefix}/schema/openapi.json"' in docs.text
    assert http.get(f"{at}/schema/openapi.json").status_code == 200
    http.close()
