"""A real nginx (Debian's package) in front of a real coordinator process on 127.0.0.1.

`nginx_proxy(coordinator, conf)` renders the shipped `packaging/nginx/<conf>` for this
test (the listen address, the certificate paths and the coordinator's port are the only
things replaced; `proxy_bind` is added) inside a minimal main config of its own (temp
prefix, pid and logs in the test's directory, `daemon off`), and runs nginx in the
foreground with TLS from a generated CA. No system service is touched. Tests skip when
nginx is not installed.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, CoordinatorProcess, free_port

PACKAGING = REPO / "packaging" / "nginx"


def nginx_binary() -> str | None:
    """The nginx executable (also looked for in /usr/sbin, often not on a user's PATH)."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


@dataclass
class ProxyProcess:
    """A running proxy (nginx or Caddy): `url` is the coordinator's external URL through it (prefix
    included, no trailing slash); `ca_file` is the CA its certificate chains to."""

    port: int
    url: str
    ca_file: str
    proc: subprocess.Popen[bytes]
    root: Path

    @property
    def verify(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca_file)

    @property
    def error_log(self) -> str:
        return (self.root / "error.log").read_text(errors="replace")

    @property
    def access_log(self) -> str:
        return (self.root / "access.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful shutdown
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def render_site(
    conf: str, port: int, upstream_port: int, cert: Path, key: Path, strip: bool = False
) -> str:
    """The shipped site config with this test's listen address, certificate, upstream and
    the address nginx connects from (`PROXY_SOURCE`); `strip`: `proxy_pass` with a `/`
    after the address, so nginx replaces the location's prefix with `/` (the variant that
    strips the prefix).

    Raises:
        AssertionError: the shipped file no longer has a line this replaces.
    """
    text = (PACKAGING / conf).read_text()
    replacements = {
        "listen 443 ssl http2;": f"listen 127.0.0.1:{port} ssl http2;",
        "listen [::]:443 ssl http2;": "",
        "/etc/ssl/rbroker/fullchain.pem": str(cert),
        "/etc/ssl/rbroker/privkey.pem": str(key),
        "server 127.0.0.1:8787;": f"server 127.0.0.1:{upstream_port};",
        "REPLACE-WITH-trusted_proxy_secret": PROXY_SECRET,
        # the proxy reaches the coordinator from its own address, as from another host, so
        # the coordinator can tell it from clients on this machine (which come from 127.0.0.1)
        "proxy_pass http://rbroker_coordinator;": (
            f"proxy_pass http://rbroker_coordinator;\n        proxy_bind {PROXY_SOURCE};"
        ),
    }
    for old, new in replacements.items():
        assert old in text, f"{conf} has no {old!r} any more: update this test"
        text = text.replace(old, new)
    if strip:
        text = text.replace(
            "proxy_pass http://rbroker_coordinator;", "proxy_pass http://rbroker_coordinator/;"
        )
    return text


PROXY_SOURCE = "127.0.0.2"
"""The address nginx connects to the coordinator from (the coordinator's trusted proxy)."""
PROXY_SECRET = "test-proxy-secret-0123456789abcdef"
"""The coordinator's `trusted_proxy_secret`, put where the shipped configs' placeholder is."""

MAIN_CONF = """\
daemon off;
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log {root}/access.log;
    client_body_temp_path {root}/client_body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    include {root}/site.conf;
}}
"""


@pytest.fixture
def nginx_proxy(tmp_path: Path) -> Iterator[Callable[..., ProxyProcess]]:
    """`nginx_proxy(coordinator, conf="rbroker-prefix.conf", port=None, strip=False)` → a running
    ProxyProcess in front of `coordinator` (plain HTTP on 127.0.0.1). Stopped at teardown."""
    binary = nginx_binary()
    if binary is None:
        pytest.skip("nginx is not installed (Debian: apt-get install nginx)")
    from rbroker_server.edge import tls

    started: list[ProxyProcess] = []

    def factory(
        coordinator: CoordinatorProcess,
        conf: str = "rbroker-prefix.conf",
        port: int | None = None,
        strip: bool = False,
    ) -> ProxyProcess:
        root = tmp_path / f"nginx{len(started)}"
        root.mkdir()
        files = tls.generate_self_signed(root / "tls", "127.0.0.1")
        port = port or free_port()
        site = render_site(conf, port, coordinator.port, files.cert, files.key, strip)
        (root / "site.conf").write_text(site)
        (root / "nginx.conf").write_text(MAIN_CONF.format(root=root))
        check = subprocess.run(
            [
                binary,
                "-t",
                "-p",
                str(root),
                "-c",
                str(root / "nginx.conf"),
                "-e",
                str(root / "error.log"),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert check.returncode == 0, check.stderr
        with open(root / "stderr.log", "wb") as err:
            proc = subprocess.Popen(
                [
                    binary,
                    "-p",
                    str(root),
                    "-c",
                    str(root / "nginx.conf"),
                    "-e",
                    str(root / "error.log"),
                ],
                stdout=err,
                stderr=subprocess.STDOUT,
            )
        prefix = "/rbroker" if "prefix" in conf else ""
        proxy = ProxyProcess(
            port, f"https://127.0.0.1:{port}{prefix}", str(files.ca_cert), proc, root
        )
        started.append(proxy)
        wait_tls(proxy)
        return proxy

    yield factory
    for proxy in started:
        proxy.stop()


def wait_tls(proxy: ProxyProcess, timeout_s: float = 15) -> None:
    context = ssl.create_default_context(cafile=proxy.ca_file)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proxy.proc.poll() is not None:
            raise RuntimeError(f"nginx exited:\n{(proxy.root / 'stderr.log').read_text()}")
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", proxy.port), timeout=2) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1"),
        ):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nginx did not answer on {proxy.port}:\n{proxy.error_log}")
