"""The coordinator behind a real Caddy under `/rbroker/`, with the shipped
`packaging/caddy/Caddyfile.prefix`: a broker enrolls through it, reports, and reads the
fleet signed with its key; a viewer token reads it too. Skips when Caddy is not installed."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import wait_until
from tests.e2e.conftest import (
    REPO,
    CoordinatorProcess,
    UplinkBroker,
    by_name,
    free_port,
    rbroker_cli,
)
from tests.e2e.proxy.conftest import PROXY_SECRET, ProxyProcess, wait_tls

SHIPPED = REPO / "packaging" / "caddy" / "Caddyfile.prefix"


def render_caddyfile(root: Path, port: int, upstream_port: int, cert: Path, key: Path) -> str:
    """The shipped Caddyfile with this test's site address, certificate and upstream, and
    global options that keep Caddy to the test's directory (no admin port, no redirects)."""
    text = SHIPPED.read_text()
    replacements = {
        "lab.example.org {": f"https://127.0.0.1:{port} {{\n\ttls {cert} {key}",
        "reverse_proxy 127.0.0.1:8787": f"reverse_proxy 127.0.0.1:{upstream_port}",
        "REPLACE-WITH-trusted_proxy_secret": PROXY_SECRET,
    }
    for old, new in replacements.items():
        assert old in text, f"{SHIPPED.name} has no {old!r} any more: update this test"
        text = text.replace(old, new)
    head = (
        "{\n\tadmin off\n\tauto_https disable_redirects\n"
        f"\tstorage file_system {root}/data\n}}\n\n"
    )
    return head + text


@pytest.fixture
def caddy_proxy(tmp_path: Path) -> Iterator[Callable[[CoordinatorProcess, int], ProxyProcess]]:
    binary = shutil.which("caddy")
    if binary is None:
        pytest.skip("Caddy is not installed (Debian: apt-get install caddy)")
    from rbroker_server.edge import tls

    started: list[ProxyProcess] = []

    def factory(coordinator: CoordinatorProcess, port: int) -> ProxyProcess:
        root = tmp_path / "caddy"
        root.mkdir()
        files = tls.generate_self_signed(root / "tls", "127.0.0.1")
        (root / "Caddyfile").write_text(
            render_caddyfile(root, port, coordinator.port, files.cert, files.key)
        )
        env = {**os.environ, "HOME": str(root), "XDG_DATA_HOME": str(root / "data"),
               "XDG_CONFIG_HOME": str(root / "config")}  # fmt: skip
        with open(root / "stderr.log", "wb") as err:
            proc = subprocess.Popen(
                [binary, "run", "--config", str(root / "Caddyfile"), "--adapter", "caddyfile"],
                stdout=err,
                stderr=subprocess.STDOUT,
                env=env,
            )
        proxy = ProxyProcess(
            port, f"https://127.0.0.1:{port}/rbroker", str(files.ca_cert), proc, root
        )
        started.append(proxy)
        try:
            wait_tls(proxy)
        except RuntimeError:
            raise RuntimeError((root / "stderr.log").read_text()) from None
        return proxy

    yield factory
    for proxy in started:
        if proxy.proc.poll() is None:
            proxy.proc.send_signal(signal.SIGTERM)
            try:
                proxy.proc.wait(10)
            except subprocess.TimeoutExpired:
                proxy.proc.kill()
                proxy.proc.wait(5)


def test_broker_enrolls_reports_and_reads_through_caddy_under_a_prefix(
    coordinator_factory: Callable[..., CoordinatorProcess],
    caddy_proxy: Callable[[CoordinatorProcess, int], ProxyProcess],
    uplink_broker: Callable[..., UplinkBroker],
) -> None:
    port = free_port()
    coordinator = coordinator_factory(
        external_url=f"https://127.0.0.1:{port}/rbroker/",
        trusted_proxies=["127.0.0.1"],
        trusted_proxy_secret=PROXY_SECRET,
    )
    proxy = caddy_proxy(coordinator, port)
    through_proxy = dataclasses.replace(coordinator, ca_file=proxy.ca_file, proc=None)
    lab = uplink_broker(through_proxy, "lab-caddy", url=proxy.url)
    wait_until(lambda: lab.link()["link"] == "ok" and lab.link()["reports_sent"] >= 2, 30, 0.1)
    viewer = httpx.get(
        proxy.url + "/api/v1/fleet",
        headers={"Authorization": f"Bearer {coordinator.token}"},
        verify=proxy.verify,
        timeout=10,
    )
    assert viewer.status_code == 200, viewer.text
    assert by_name(viewer.json())["lab-caddy"]["id"] == lab.computer_id
    signed = rbroker_cli("fleet", "--data-dir", str(lab.broker.data_dir), "--json")
    assert signed.returncode == 0, signed.stderr
    assert by_name(json.loads(signed.stdout))["lab-caddy"]["reports_applied"] >= 2
