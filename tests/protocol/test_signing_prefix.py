"""Signed fleet reads behind a reverse proxy: the signature covers the target the client
sent (prefix included); the server verifies the prefix joined with what it received."""

from __future__ import annotations

import time

import httpx
import nacl.signing
import pytest

from rbroker_protocol import signing

KEY = nacl.signing.SigningKey(bytes(range(32)))
PUBLIC = signing.public_key_b64(KEY)


def _signed(target: str) -> signing.SignedRequest:
    headers = signing.sign_request(KEY, "c_0001", "GET", target, int(time.time()))
    parsed = signing.parse_request_headers(headers)
    assert parsed is not None
    return parsed


@pytest.mark.parametrize(
    ("target", "canonical"),
    [
        ("/api/v1/fleet", "/api/v1/fleet"),
        ("/api/v1/computers/c_0003?x=1", "/api/v1/computers/c_0003?x=1"),
        ("/%7erb/%41pi", "/~rb/Api"),  # unreserved escapes decode
        ("/lab%2ftools", "/lab%2Ftools"),  # reserved escapes keep their form, hex upper
        ("/lab tools/ré", "/lab%20tools/r%C3%A9"),  # raw text is escaped as UTF-8
        ("/100%", "/100%25"),  # a % that starts no escape
        ("/a%zz", "/a%25zz"),
        ("/a:b@c!$&'()*+,;=/?q=/?", "/a:b@c!$&'()*+,;=/?q=/?"),
    ],
)
def test_canonical_target(target: str, canonical: str) -> None:
    assert signing.canonical_target(target) == canonical
    assert signing.canonical_target(canonical) == canonical  # idempotent


def test_without_prefix() -> None:
    signed = _signed("/api/v1/fleet")
    signing.verify_request(signed, PUBLIC, "GET", signing.external_target("", "/api/v1/fleet"))
    with pytest.raises(signing.BadSignature):
        signing.verify_request(
            signed, PUBLIC, "GET", signing.external_target("/rbroker", "/api/v1/fleet")
        )


@pytest.mark.parametrize("prefix", ["/rbroker", "/rbroker/", "/tools/rbroker"])
def test_with_prefix(prefix: str) -> None:
    client_url = "https://lab.example.org" + prefix.rstrip("/") + "/api/v1/fleet?group=a"
    target = httpx.URL(client_url).raw_path.decode()
    signed = _signed(target)
    # the proxy removed the prefix; the server joins its configured prefix back on
    received = "/api/v1/fleet?group=a"
    signing.verify_request(signed, PUBLIC, "GET", signing.external_target(prefix, received))
    # a server that does not know its prefix refuses, and so does a different prefix
    for wrong in ("", "/other"):
        with pytest.raises(signing.BadSignature):
            signing.verify_request(signed, PUBLIC, "GET", signing.external_target(wrong, received))
    # the signature still binds the rest of the target
    with pytest.raises(signing.BadSignature):
        signing.verify_request(
            signed, PUBLIC, "GET", signing.external_target(prefix, "/api/v1/fleet?group=b")
        )


@pytest.mark.parametrize(
    ("client_base", "server_prefix"),
    [
        # httpx escapes the space and the é; the server's config spells them escaped
        ("https://lab.example.org/lab tools/ré", "/lab%20tools/r%C3%A9"),
        # lower-case hex on the client, upper-case in the server's config
        ("https://lab.example.org/lab%20tools/r%c3%a9", "/lab%20tools/r%C3%A9/"),
        # an escaped unreserved character on one side only
        ("https://lab.example.org/%7Eteam/rbroker", "/~team/rbroker"),
        # an escaped reserved character kept escaped on both sides
        ("https://lab.example.org/a%2Fb/rbroker", "/a%2fb/rbroker"),
    ],
)
def test_prefix_with_encoded_characters(client_base: str, server_prefix: str) -> None:
    target = httpx.URL(client_base + "/api/v1/fleet").raw_path.decode()
    signed = _signed(target)
    signing.verify_request(
        signed, PUBLIC, "GET", signing.external_target(server_prefix, "/api/v1/fleet")
    )


def test_encoded_slash_is_not_a_slash() -> None:
    signed = _signed("/a%2Fb/rbroker/api/v1/fleet")
    with pytest.raises(signing.BadSignature):
        signing.verify_request(
            signed, PUBLIC, "GET", signing.external_target("/a/b/rbroker", "/api/v1/fleet")
        )


def test_signed_bytes_cover_the_canonical_prefixed_target() -> None:
    """What is signed, written out independently of the implementation."""
    message = signing.request_message(
        "c_0001", "get", "/r%c3%a9/api/v1/fleet", 1_700_000_000, "n" * 22
    )

    def lp(b: bytes) -> bytes:
        return len(b).to_bytes(8, "big") + b

    assert message == (
        b"rbroker/request/v1\x00"
        + lp(b"c_0001")
        + lp(b"GET")
        + lp(b"/r%C3%A9/api/v1/fleet")
        + (1_700_000_000).to_bytes(8, "big", signed=True)
        + lp(b"n" * 22)
    )
