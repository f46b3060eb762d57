"""Rate limits per client address: failed enrollments and failed fleet-read credentials get
429 with Retry-After past their limit (sign-in has its own, tests/server/test_web.py), one
log line per episode, and honest reports are still answered while someone hammers
enrollment (the latency figure is bench/abuse.py's)."""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable, Iterator

import httpx
import nacl.signing
import pytest
import sqlalchemy as sa

from rbroker_protocol import signing
from rbroker_server.admin import operations as admin
from rbroker_server.edge.ratelimit import (
    CREDENTIAL_FAILURES,
    CREDENTIAL_ID_FAILURES,
    ENROLL_FAILURES,
    Throttle,
)
from tests.conftest import wait_until
from tests.server.conftest import Coordinator, EnrolledComputer

ATTACKER = {"X-Forwarded-For": "203.0.113.7"}
SAME_NETWORK = {"X-Forwarded-For": "203.0.113.99"}  # the attacker's /24
NEIGHBOUR = {"X-Forwarded-For": "198.51.100.8"}  # another /24


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def limits(self, what: str) -> list[str]:
        return [m for m in self.lines if m.startswith("rate limit:") and what in m]


@pytest.fixture
def limit_log() -> Iterator[_Lines]:
    logger = logging.getLogger("rbroker_server.edge.ratelimit")
    lines = _Lines()
    logger.addHandler(lines)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(lines)
        logger.setLevel(old)


@pytest.fixture
def proxied(coordinator_factory: Callable[..., Coordinator]) -> Coordinator:
    """A coordinator that believes X-Forwarded-For from 127.0.0.1 (the test's proxy)."""
    return coordinator_factory(trusted_proxies=("127.0.0.1",))


def _enroll_body(code: str) -> dict[str, str]:
    key = nacl.signing.SigningKey.generate()
    return {"code": code, "name": "pc", "public_key": signing.public_key_b64(key)}


def test_failed_enrollments_get_429_per_address_and_one_log_line(
    proxied: Coordinator, limit_log: _Lines
) -> None:
    c = proxied
    c.group("vision")
    wrong = "rbe_" + "a" * 12 + "_" + "b" * 32
    codes = [
        c.http.post("/api/v1/enroll", json=_enroll_body(wrong), headers=ATTACKER).status_code
        for _ in range(ENROLL_FAILURES)
    ]
    assert codes == [401] * ENROLL_FAILURES
    for _ in range(50):
        r = c.http.post("/api/v1/enroll", json=_enroll_body(wrong), headers=ATTACKER)
        assert r.status_code == 429, r.text
        assert 1 <= int(r.headers["retry-after"]) <= 60
        assert "failed enrollments" in r.json()["detail"]
    # The address is refused before any work, even with a good code ...
    good = admin.create_enroll_code(c.engine, "vision", 600).text
    assert c.http.post("/api/v1/enroll", json=_enroll_body(good), headers=ATTACKER).status_code == (
        429
    )
    # ... which another address can still use.
    r = c.http.post("/api/v1/enroll", json=_enroll_body(good), headers=NEIGHBOUR)
    assert r.status_code == 201, r.text
    assert len(limit_log.limits("failed enrollments")) == 1, limit_log.lines
    assert "203.0.113.0/24" in limit_log.limits("failed enrollments")[0]


def test_honest_reports_are_answered_while_enrollment_is_hammered(proxied: Coordinator) -> None:
    c = proxied
    c.group("vision")
    pc = c.enroll("vision")
    stop = threading.Event()
    answers: list[int] = []

    def hammer() -> None:
        with httpx.Client(base_url=c.url, timeout=30) as http:
            while not stop.is_set():
                body = _enroll_body("rbe_" + "c" * 12 + "_" + "d" * 32)
                answers.append(http.post("/api/v1/enroll", json=body, headers=ATTACKER).status_code)

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        # honest reports while the hammering is refused (on a busy machine 30 reports could
        # all be answered before the hammer's first few attempts: no limit was reached yet)
        wait_until(lambda: 429 in answers, timeout_s=30)
        for _ in range(30):
            r = pc.report()
            assert r.status_code == 200 and r.json()["applied"], r.text
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert set(answers) <= {401, 429}
    # attempts in flight when the limit is reached still finish (one per thread), and the
    # bucket refills one every 6 s
    assert answers.count(401) <= ENROLL_FAILURES + len(threads) + 1
    assert answers.count(429) > 1  # refused all along, not only once


def test_failed_viewer_tokens_get_401_with_a_challenge_then_429(
    proxied: Coordinator, limit_log: _Lines
) -> None:
    c = proxied
    c.group("vision")
    bad = {"authorization": "Bearer rbv_" + "a" * 12 + "_" + "b" * 32}
    for _ in range(CREDENTIAL_FAILURES):
        r = c.http.get("/api/v1/fleet", headers=bad | ATTACKER)
        assert r.status_code == 401
        assert r.headers["www-authenticate"].startswith("Bearer")
    r = c.http.get("/api/v1/fleet", headers=bad | ATTACKER)
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    # blocked with a right token too; the neighbour reads on
    assert c.http.get("/api/v1/fleet", headers=c.viewer("vision") | ATTACKER).status_code == 429
    assert c.http.get("/api/v1/fleet", headers=c.viewer("vision") | NEIGHBOUR).status_code == 200
    assert len(limit_log.limits("failed fleet-read credentials")) == 1


def _random_token() -> dict[str, str]:
    return {"authorization": f"Bearer rbv_{secrets.token_hex(6)}_{secrets.token_urlsafe(24)}"}


def test_a_revoked_token_does_not_lock_out_a_valid_one_on_its_network(proxied: Coordinator) -> None:
    c = proxied
    c.group("vision")
    valid = c.viewer("vision")
    stale_text = admin.create_token(c.engine, "vision", "old scrape job").text
    stale = {"authorization": f"Bearer {stale_text}"}
    assert c.http.get("/metrics", headers=stale | ATTACKER).status_code == 200
    assert c.http.get("/metrics", headers=valid | SAME_NETWORK).status_code == 200
    assert admin.revoke_token(c.engine, "vision", stale_text)
    stale_answers = []
    for i in range(3 * CREDENTIAL_FAILURES):
        stale_answers.append(c.http.get("/metrics", headers=stale | ATTACKER).status_code)
        path = "/metrics" if i % 2 else "/api/v1/fleet"
        r = c.http.get(path, headers=valid | SAME_NETWORK)
        assert r.status_code == 200, (i, r.text)
    assert stale_answers[:CREDENTIAL_FAILURES] == [401] * CREDENTIAL_FAILURES
    assert set(stale_answers[CREDENTIAL_FAILURES:]) == {429}
    # A guesser on that network is refused before its guess is checked, a good token that
    # was never served there too; another network reads on.
    for _ in range(5):
        r = c.http.get("/metrics", headers=_random_token() | ATTACKER)
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    other = admin.create_token(c.engine, "vision", "never used").text
    never = {"authorization": f"Bearer {other}"}
    assert c.http.get("/metrics", headers=never | ATTACKER).status_code == 429
    assert c.http.get("/metrics", headers=never | NEIGHBOUR).status_code == 200
    # A guess at the valid token's secret (its id is no secret) is another credential,
    # never served there: refused unchecked, and the valid token reads on (a guess used to
    # take it off its network's served list: one wrong secret a second kept it out)
    valid_id = c.tokens["vision"].split("_")[1]
    for _ in range(3):
        guess = {"authorization": f"Bearer rbv_{valid_id}_{secrets.token_urlsafe(24)}"}
        assert c.http.get("/metrics", headers=guess | ATTACKER).status_code == 429
        assert c.http.get("/metrics", headers=valid | SAME_NETWORK).status_code == 200


def test_one_credential_is_limited_across_networks(proxied: Coordinator) -> None:
    c = proxied
    c.group("vision")
    bad = _random_token()
    for i in range(CREDENTIAL_ID_FAILURES):
        r = c.http.get("/api/v1/fleet", headers=bad | {"X-Forwarded-For": f"10.0.{i}.1"})
        assert r.status_code == 401
    r = c.http.get("/api/v1/fleet", headers=bad | {"X-Forwarded-For": "10.200.0.1"})
    assert r.status_code == 429 and "this credential" in r.json()["detail"]
    # the networks it came from are not over their own limits
    r = c.http.get("/api/v1/fleet", headers=c.viewer("vision") | {"X-Forwarded-For": "10.0.0.1"})
    assert r.status_code == 200


def test_guesses_at_a_valid_tokens_secret_from_everywhere_do_not_lock_it_out(
    proxied: Coordinator, limit_log: _Lines
) -> None:
    """The token's id with wrong secrets from many networks: each guess is its own
    credential (401), so the token's own count never fills and its scraper reads on (the
    guesses used to count against the id: 20 of them kept the scraper out for a minute)."""
    c = proxied
    c.group("vision")
    valid = c.viewer("vision")
    assert c.http.get("/metrics", headers=valid).status_code == 200
    valid_id = c.tokens["vision"].split("_")[1]
    for i in range(2 * CREDENTIAL_ID_FAILURES):
        guess = {"authorization": f"Bearer rbv_{valid_id}_{secrets.token_urlsafe(24)}"}
        r = c.http.get("/metrics", headers=guess | {"X-Forwarded-For": f"10.1.{i}.1"})
        assert r.status_code == 401, (i, r.text)
    assert c.http.get("/metrics", headers=valid).status_code == 200
    # logs name the token by its id, never by a digest of what was sent
    assert not any(valid_id + " " in line for line in limit_log.lines)


def test_every_key_fits_its_column_from_the_longest_networks(proxied: Coordinator) -> None:
    """`rate_limit_hits.key` holds 64 characters (PostgreSQL refuses more): a served token
    and a computer's forged id from a full IPv6 network, and an over-long computer name
    (counted against its network only) all fit."""
    c = proxied
    c.group("vision")
    far = {"X-Forwarded-For": "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff"}
    assert c.http.get("/metrics", headers=c.viewer("vision") | far).status_code == 200
    real = c.enroll("vision", "lab-1")
    for name in (real.id, "c_" + "f" * 22, "c_" + "f" * 38):
        forger = EnrolledComputer(c, name, nacl.signing.SigningKey.generate(), "vision")
        headers = forger.signed_headers("GET", "/api/v1/fleet")
        assert c.http.get("/api/v1/fleet", headers=headers | far).status_code == 401
    bad = {"authorization": f"Bearer rbv_{'a' * 12}_{'b' * 32}"}
    assert c.http.get("/metrics", headers=bad | far).status_code == 401
    with c.engine.connect() as conn:
        longest = conn.execute(sa.text("SELECT max(length(key)) FROM rate_limit_hits")).scalar()
    assert 0 < longest <= 64


def test_forged_signatures_in_a_computers_name_do_not_lock_it_out(proxied: Coordinator) -> None:
    """Anyone can name a computer; only its key signs for it: forged signatures count in the
    forger's networks, and the computer's own signed reads go on."""
    c = proxied
    c.group("vision")
    real = c.enroll("vision", "lab-1")
    assert real.get("/api/v1/fleet").status_code == 200
    forger = EnrolledComputer(c, real.id, nacl.signing.SigningKey.generate(), "vision")
    for i in range(2 * CREDENTIAL_ID_FAILURES):
        headers = forger.signed_headers("GET", "/api/v1/fleet")
        r = c.http.get("/api/v1/fleet", headers=headers | {"X-Forwarded-For": f"10.2.{i}.1"})
        assert r.status_code == 401, (i, r.text)
    assert real.get("/api/v1/fleet").status_code == 200
    # from one network the forgeries fill that network's count for that name, as before
    for _ in range(CREDENTIAL_ID_FAILURES):
        headers = forger.signed_headers("GET", "/api/v1/fleet")
        c.http.get("/api/v1/fleet", headers=headers | NEIGHBOUR)
    headers = forger.signed_headers("GET", "/api/v1/fleet")
    assert c.http.get("/api/v1/fleet", headers=headers | NEIGHBOUR).status_code == 429


def test_a_throttle_logs_once_per_episode(limit_log: _Lines) -> None:
    now = [0.0]
    throttle = Throttle("failed things", 2, 60.0, clock=lambda: now[0])
    throttle.spend("a")
    throttle.spend("a")
    for _ in range(100):
        assert 29 <= throttle.refusal_s("a") <= 31
        now[0] += 0.01
    assert len(limit_log.limits("failed things")) == 1
    assert throttle.refused_count("a") == 100
    assert throttle.refusal_s("b") == 0  # per address
    now[0] += 61.0  # quiet for a window: full again, the episode is over
    assert throttle.refusal_s("a") == 0
    throttle.spend("a")
    throttle.spend("a")
    assert throttle.refusal_s("a") > 0
    lines = limit_log.limits("failed things")
    assert len(lines) == 2 and "the last episode refused 100" in lines[1]
