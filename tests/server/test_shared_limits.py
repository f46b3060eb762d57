"""Rate limits shared by every coordinator process on one database and keyed by network
(architecture.md §7 "Rate limits"). Before: each process counted alone (two `serve`
processes allowed 20 sign-in guesses a minute, not 10) and per exact address (rotating
127.0.x.y or addresses of one IPv6 /64 escaped every limit); with `--trusted-proxy
127.0.0.1` any local process could choose its client address with X-Forwarded-For.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import nacl.signing
import pytest
import sqlalchemy as sa

from rbroker_protocol import signing
from rbroker_server.admin import operations as admin
from rbroker_server.db import engine as db
from rbroker_server.db.maintenance import prune
from rbroker_server.edge.net import limit_key
from rbroker_server.edge.ratelimit import SIGNIN_ATTEMPTS, DbHits, Throttle
from rbroker_server.settings import Settings
from tests.ports import free_port
from tests.server.conftest import Coordinator

LINUX = sys.platform == "linux"  # the whole 127.0.0.0/8 is local: any 127.x.y.z is a source
SECRET = "s3cret-of-the-proxy-0123456789abcdef"


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, html
    return found.group(1)


class _Browser:
    """A sign-in form at one coordinator, from one source address."""

    def __init__(self, url: str, source: str = "127.0.0.1") -> None:
        self.client = httpx.Client(
            base_url=url, timeout=30, transport=httpx.HTTPTransport(local_address=source)
        )
        self.csrf = _csrf(self.client.get("/signin").text)

    def guess(self, token: str = "rbv_x_wrong") -> httpx.Response:
        r = self.client.post("/signin", data={"token": token, "csrf_token": self.csrf})
        if "csrf_token" in r.text:
            self.csrf = _csrf(r.text)
        return r

    def close(self) -> None:
        self.client.close()


@contextlib.contextmanager
def _serve(data: Path, port: int) -> Iterator[str]:
    command = [sys.executable, "-m", "rbroker_server", "serve", "--data-dir", str(data)]
    proc = subprocess.Popen(
        [*command, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                _, err = proc.communicate(timeout=10)
                raise AssertionError(f"serve did not start: {err}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
        assert "Traceback" not in err, err


def test_two_serve_processes_on_one_database_share_the_sign_in_limit(
    database_url: str, tmp_path: Path
) -> None:
    data = tmp_path / "srv"
    Settings(data_dir=data, database_url=database_url).save()
    engine = db.make_engine(database_url)
    try:
        db.upgrade(engine)
        admin.create_group(engine, "alpha")
        token = admin.create_token(engine, "alpha").text
    finally:
        engine.dispose()
    with _serve(data, free_port()) as one, _serve(data, free_port()) as two:
        first, second = _Browser(one), _Browser(two)
        try:
            codes = [first.guess().status_code for _ in range(5)]
            codes += [second.guess().status_code for _ in range(SIGNIN_ATTEMPTS - 5)]
            assert codes == [401] * SIGNIN_ATTEMPTS
            refused = second.guess(token)  # the 11th attempt: refused, even the right token
            assert refused.status_code == 429, refused.text
            assert 1 <= int(refused.headers["retry-after"]) <= 61
            assert first.guess(token).status_code == 429
        finally:
            first.close()
            second.close()


@pytest.mark.skipif(not LINUX, reason="Linux: every 127.x.y.z is a local source address")
def test_rotated_addresses_in_one_24_share_the_limit(coordinator: Coordinator) -> None:
    coordinator.group("alpha")
    browsers = [_Browser(coordinator.url, f"127.0.7.{10 + i}") for i in range(SIGNIN_ATTEMPTS)]
    other = _Browser(coordinator.url, "127.0.8.10")
    last = _Browser(coordinator.url, "127.0.7.200")
    try:
        assert [b.guess().status_code for b in browsers] == [401] * SIGNIN_ATTEMPTS
        assert last.guess().status_code == 429  # a fresh address of the same /24
        assert other.guess().status_code == 401  # another /24 is counted on its own
    finally:
        for b in [*browsers, other, last]:
            b.close()


def test_the_keys_are_networks() -> None:
    assert limit_key("203.0.113.7") == limit_key("203.0.113.250") == "203.0.113.0/24"
    assert limit_key("203.0.114.7") == "203.0.114.0/24"
    assert limit_key("::ffff:203.0.113.7") == "203.0.113.0/24"
    assert limit_key("2001:db8:1:2::1") == limit_key("2001:db8:1:2:ffff:ffff:ffff:fffe")
    assert limit_key("2001:db8:1:2::1") == "2001:db8:1:2::/64"
    assert limit_key("2001:db8:1:3::1") != limit_key("2001:db8:1:2::1")
    assert limit_key("") == ""


def test_ipv6_addresses_of_one_64_share_a_database_limit(tmp_path: Path) -> None:
    engine = db.make_engine(f"sqlite:///{(tmp_path / 'l.db').as_posix()}")
    try:
        db.upgrade(engine)
        now = [1000.0]
        hits = DbHits(engine, "signin", 3, 60.0, clock=lambda: now[0])
        throttle = Throttle("sign-in attempts", 3, 60.0, hits=hits)
        for i in range(3):
            assert throttle.refusal_s(f"2001:db8:1:2::{i + 1:x}") == 0
            throttle.spend(f"2001:db8:1:2:{i + 1:x}::9")
        assert throttle.refusal_s("2001:db8:1:2:abcd::1") == 61  # all three in the window
        assert throttle.refusal_s("2001:db8:1:3::1") == 0
        assert throttle.quick_refusal_s("2001:db8:1:2::77") > 0  # remembered, no database
        now[0] += 30.0
        assert throttle.refusal_s("2001:db8:1:2::1") == 31
        now[0] += 31.0  # the oldest hit left the window
        assert throttle.refusal_s("2001:db8:1:2::1") == 0
        # old rows are pruned
        from datetime import UTC, datetime

        pruned = prune(engine, Settings(data_dir=tmp_path), datetime.fromtimestamp(now[0], UTC))
        assert pruned.rate_limit_hits == 3
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM rate_limit_hits")).scalar() == 0
    finally:
        engine.dispose()


def _enroll(c: Coordinator, headers: dict[str, str]) -> int:
    key = nacl.signing.SigningKey.generate()
    body = {"code": "rbe_wrong_code", "name": "pc", "public_key": signing.public_key_b64(key)}
    return c.http.post("/api/v1/enroll", json=body, headers=headers).status_code


def test_x_forwarded_for_needs_the_proxy_secret_when_one_is_set(
    coordinator_factory: Callable[..., Coordinator],
) -> None:
    c = coordinator_factory(trusted_proxies=("127.0.0.1",), trusted_proxy_secret=SECRET)
    # a local process without the secret: its X-Forwarded-For is ignored, every guess counts
    # against its own address (127.0.0.0/24), whatever address it claims
    forged = [_enroll(c, {"X-Forwarded-For": f"198.51.{i}.9"}) for i in range(10)]
    assert forged == [401] * 10
    assert _enroll(c, {"X-Forwarded-For": "198.51.99.9"}) == 429
    # the proxy (the secret sent): the client it names is believed, a fresh network
    wrong = {"X-Forwarded-For": "203.0.113.7", "X-Rbroker-Proxy-Secret": SECRET[:-1] + "x"}
    assert _enroll(c, wrong) == 429  # a wrong secret is no secret
    proxied = {"X-Forwarded-For": "203.0.113.7", "X-Rbroker-Proxy-Secret": SECRET}
    assert _enroll(c, proxied) == 401


def test_a_short_proxy_secret_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="trusted_proxy_secret must be 16 or more"):
        Settings(data_dir=tmp_path, trusted_proxy_secret="short")
