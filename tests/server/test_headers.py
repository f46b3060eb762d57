"""Answer headers and the schema: `no-store` on fleet data, a challenge on every 401,
`nosniff` everywhere, HSTS over HTTPS, the `/schema` page served from the package under the
CSP, and an OpenAPI document that declares the report envelope and every error answer
(tests/server/test_api_schema.py runs schemathesis against it)."""

from __future__ import annotations

import re
from collections.abc import Callable

import httpx

from rbroker_server.admin import operations as admin
from rbroker_server.web.headers import CSP
from tests.server.conftest import Coordinator


def test_fleet_answers_are_no_store_and_every_answer_nosniff(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    assert pc.report().status_code == 200
    answers = {
        "fleet (token)": coordinator.http.get(
            "/api/v1/fleet", headers=coordinator.viewer("vision")
        ),
        "fleet (signed)": pc.get("/api/v1/fleet"),
        "computer": coordinator.http.get(
            f"/api/v1/computers/{pc.id}", headers=coordinator.viewer("vision")
        ),
        "history": coordinator.http.get(
            f"/api/v1/computers/{pc.id}/history", headers=coordinator.viewer("vision")
        ),
        "metrics": coordinator.http.get("/metrics", headers=coordinator.viewer("vision")),
    }
    for name, r in answers.items():
        assert r.status_code == 200, (name, r.text)
        assert r.headers["cache-control"] == "no-store", name
        assert r.headers["x-content-type-options"] == "nosniff", name
    others = [
        coordinator.http.get("/healthz"),
        coordinator.http.get("/nope"),
        coordinator.http.get("/schema"),
        coordinator.http.get("/schema/openapi.json"),
        coordinator.http.get("/static/app.css"),
        pc.report(),
    ]
    for r in others:
        assert r.headers["x-content-type-options"] == "nosniff", r.url
        assert "strict-transport-security" not in r.headers  # plain HTTP: no HSTS
    assert "max-age" in others[4].headers["cache-control"]  # static files keep their caching


def test_every_401_carries_a_challenge(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    forged = pc.envelope()
    forged["sig"] = forged["sig"][:-4] + "AAA="
    answers = {
        "fleet": coordinator.http.get("/api/v1/fleet"),
        "fleet, bad token": coordinator.http.get(
            "/api/v1/fleet", headers={"authorization": "Bearer rbv_x_y"}
        ),
        "metrics": coordinator.http.get("/metrics"),
        "report": pc.send(forged),
        "enroll": coordinator.http.post(
            "/api/v1/enroll",
            json={
                "code": "rbe_" + "a" * 12 + "_" + "b" * 32,
                "name": "pc",
                "public_key": "A" * 43 + "=",
            },
        ),
    }
    for name, r in answers.items():
        assert r.status_code == 401, (name, r.text)
        assert re.match(r'^[A-Za-z-]+ realm="rbroker"', r.headers["www-authenticate"]), name
    assert answers["fleet"].headers["www-authenticate"].startswith("Bearer ")
    assert answers["report"].headers["www-authenticate"].startswith("Rbroker-Signature ")


def test_https_external_url_answers_carry_hsts(
    coordinator_factory: Callable[..., Coordinator],
) -> None:
    c = coordinator_factory(external_url="https://lab.example.org/rbroker/")
    for r in (c.http.get("/healthz"), c.http.get("/api/v1/fleet")):
        assert r.headers["strict-transport-security"] == "max-age=31536000"


def test_the_schema_page_is_served_from_the_package_under_the_csp(
    coordinator: Coordinator,
) -> None:
    r = coordinator.http.get("/schema")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["content-security-policy"] == CSP
    page = r.text
    assert "<script" not in page.lower() and "<style" not in page.lower()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), "loads from elsewhere"
    for words in ("POST /api/v1/reports", "POST /api/v1/enroll", "GET /api/v1/fleet"):
        assert words in page
    assert 'href="/schema/openapi.json"' in page
    assert coordinator.http.get("/schema/docs").text == page


def test_the_openapi_schema_declares_the_envelope_and_every_error(
    coordinator: Coordinator,
) -> None:
    schema = httpx.get(f"{coordinator.url}/schema/openapi.json").json()
    report = schema["paths"]["/api/v1/reports"]["post"]
    body = report["requestBody"]["content"]["application/json"]["schema"]
    assert body["required"] == ["v", "computer_id", "run_id", "seq", "payload", "sig"]
    assert set(body["properties"]) == set(body["required"])
    expected = {
        ("/api/v1/reports", "post"): {"400", "401", "403", "413", "415", "422", "503"},
        ("/api/v1/enroll", "post"): {"400", "401", "409", "413", "415", "429", "503"},
        ("/api/v1/fleet", "get"): {"401", "403", "429", "503"},
        ("/api/v1/computers/{computer_id}", "get"): {"401", "403", "404", "429", "503"},
        ("/api/v1/computers/{computer_id}/history", "get"): {"401", "403", "404", "429", "503"},
        ("/metrics", "get"): {"401", "403", "429", "503"},
        ("/healthz", "get"): {"503"},
    }
    for (path, method), codes in expected.items():
        responses = schema["paths"][path][method]["responses"]
        assert codes <= set(responses), (path, sorted(responses))
        for code in codes:
            ref = responses[code]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/ErrorAnswer"), (path, code)


def test_error_answers_are_json_and_say_so_on_every_route(coordinator: Coordinator) -> None:
    """Before: a refused `/metrics` scrape answered a JSON body labelled `text/plain`."""
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    revoked = coordinator.enroll("vision", name="lab-2")
    assert admin.revoke_computer(coordinator.engine, revoked.id)
    h = coordinator.http
    json_ct = {"content-type": "application/json"}
    answers = {
        "metrics, no token": (h.get("/metrics"), 401),
        "metrics, bad token": (h.get("/metrics", headers={"authorization": "Bearer x"}), 401),
        "metrics, revoked computer": (revoked.get("/metrics"), 403),
        "metrics, POST": (h.post("/metrics"), 405),
        "fleet, no token": (h.get("/api/v1/fleet"), 401),
        "no such route": (h.get("/nope"), 404),
        "enroll, not JSON": (h.post("/api/v1/enroll", content=b"x"), 415),
        "enroll, bad code": (
            h.post(
                "/api/v1/enroll",
                json={"code": "rbe_x", "name": "n", "public_key": "A" * 43 + "="},
            ),
            401,
        ),
        "report, unsigned": (h.post("/api/v1/reports", content=b"{}", headers=json_ct), 401),
    }
    for what, (r, status) in answers.items():
        assert r.status_code == status, (what, r.status_code, r.text)
        assert r.headers["content-type"] == "application/json", (what, r.headers)
        body = r.json()
        assert body["status_code"] == status and body["detail"], (what, body)
    # the success answer keeps Prometheus' text format
    ok = h.get("/metrics", headers=coordinator.viewer("vision"))
    assert ok.status_code == 200
    assert ok.headers["content-type"] == "text/plain; version=1.0.0; charset=utf-8"
    assert pc.get("/metrics").headers["content-type"].startswith("text/plain; version=1.0.0")
