"""`rbroker-server` commands: setup (non-interactive), serve over HTTPS, admin commands."""

from __future__ import annotations

import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import nacl.signing
import pytest

from rbroker_protocol import signing
from rbroker_server.cli.common import parse_duration
from rbroker_server.cli.main import main
from tests.ports import free_port


def _setup_args(data: Path, backend: str, database_url: str, *extra: str) -> list[str]:
    args = ["setup", "--non-interactive", "--data-dir", str(data), *extra]
    if backend != "sqlite":
        args += ["--database-url", database_url]
    return args


def _field(out: str, label: str) -> str:
    m = re.search(rf"^{label}:\s+(\S+)", out, re.M)
    assert m, out
    return m.group(1)


def test_setup_self_signed_then_serve_https(
    tmp_path: Path, backend: str, database_url: str
) -> None:
    data = tmp_path / "srv"
    port = free_port()
    cmd = [sys.executable, "-m", "rbroker_server"]
    setup = subprocess.run(
        cmd
        + _setup_args(
            data,
            backend,
            database_url,
            "--self-signed",
            "--public-hostname",
            "localhost",
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--group",
            "lab",
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert setup.returncode == 0, setup.stderr
    token = _field(setup.stdout, "viewer token")
    code = _field(setup.stdout, "enrollment code")
    assert token.startswith("rbv_") and code.startswith("rbe_")
    ca = data / "tls" / "ca.pem"
    assert ca.exists()
    if os.name == "posix":  # Windows keeps access in ACLs, not in the mode
        assert (data / "tls" / "server.key").stat().st_mode & 0o077 == 0

    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen([*cmd, "serve", "--data-dir", str(data)], stdout=log, stderr=log)
    try:
        url = f"https://127.0.0.1:{port}"
        context = ssl.create_default_context(cafile=str(ca))
        with httpx.Client(base_url=url, verify=context, timeout=5) as http:
            deadline = time.monotonic() + 30
            while True:
                try:
                    r = http.get("/healthz")
                    break
                except httpx.TransportError:
                    assert proc.poll() is None, (tmp_path / "serve.log").read_text()
                    assert time.monotonic() < deadline, "serve did not answer"
                    time.sleep(0.1)
            assert r.status_code == 200 and r.json()["status"] == "ok"
            assert r.headers["strict-transport-security"] == "max-age=31536000"  # HTTPS: HSTS
            # The generated CA is what makes it trusted.
            with (
                httpx.Client(base_url=url, timeout=5) as untrusted,
                pytest.raises(httpx.ConnectError),
            ):
                untrusted.get("/healthz")
            # Setup's enrollment code and viewer token work end to end.
            key = nacl.signing.SigningKey.generate()
            r = http.post(
                "/api/v1/enroll",
                json={"code": code, "name": "pc-1", "public_key": signing.public_key_b64(key)},
            )
            assert r.status_code == 201, r.text
            fleet = http.get("/api/v1/fleet", headers={"authorization": f"Bearer {token}"})
            assert fleet.status_code == 200 and fleet.json()["group"] == "lab"
            assert [c["name"] for c in fleet.json()["computers"]] == ["pc-1"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def test_admin_commands(
    tmp_path: Path, backend: str, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "srv"
    assert main(_setup_args(data, backend, database_url)) == 0
    capsys.readouterr()
    # A second setup refuses to overwrite the config.
    assert main(_setup_args(data, backend, database_url)) == 1
    assert "exists already" in capsys.readouterr().err

    d = ["--data-dir", str(data)]
    assert main(["group", "create", "vision", *d]) == 0
    assert main(["group", "create", "vision", *d]) == 1
    capsys.readouterr()
    assert main(["group", "list", *d]) == 0
    listed = capsys.readouterr().out
    assert "default" in listed and "vision" in listed

    assert main(["enroll-code", "create", "--group", "vision", "--ttl", "30m", *d]) == 0
    code = capsys.readouterr().out.strip()
    assert code.startswith("rbe_")
    assert main(["enroll-code", "create", "--group", "nope", *d]) == 1

    assert main(["token", "create", "--group", "vision", "--name", "wall screen", *d]) == 0
    token = capsys.readouterr().out.strip()
    token_id = token.split("_")[1]
    assert main(["token", "list", "--group", "vision", *d]) == 0
    assert f"{token_id}\tactive" in capsys.readouterr().out
    assert main(["token", "revoke", "--group", "default", token_id, *d]) == 1  # other group
    assert main(["token", "revoke", "--group", "vision", token, *d]) == 0
    capsys.readouterr()
    assert main(["token", "list", "--group", "vision", *d]) == 0
    assert f"{token_id}\trevoked" in capsys.readouterr().out

    # Enroll through the service, then list and revoke through the CLI.
    from rbroker_protocol.enroll import EnrollRequest
    from rbroker_server.db import engine as db
    from rbroker_server.enroll.service import enroll
    from rbroker_server.settings import Settings

    engine = db.make_engine(Settings.load(data).db_url)
    try:
        key = signing.public_key_b64(nacl.signing.SigningKey.generate())
        computer_id = enroll(
            engine, EnrollRequest(code=code, name="pc-9", public_key=key)
        ).computer_id
    finally:
        engine.dispose()
    assert main(["computer", "list", *d]) == 0
    out = capsys.readouterr().out
    assert computer_id in out and "pc-9" in out and "ok" in out
    assert main(["computer", "revoke", computer_id, *d]) == 0
    capsys.readouterr()
    assert main(["computer", "list", "--group", "vision", *d]) == 0
    assert "revoked" in capsys.readouterr().out
    assert main(["computer", "revoke", "c_nope", *d]) == 1
    assert main(["db", "upgrade", *d]) == 0
    assert "revision" in capsys.readouterr().out


def test_setup_with_own_tls_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rbroker_server.edge import tls
    from rbroker_server.settings import Settings

    files = tls.generate_self_signed(tmp_path / "pki", "hub.example.org")
    data = tmp_path / "srv"
    base = ["setup", "--non-interactive", "--data-dir", str(data)]
    assert main([*base, "--tls-cert", str(files.cert)]) == 1
    assert main([*base, "--tls-cert", str(files.cert), "--tls-key", str(tmp_path / "no")]) == 1
    assert "not found" in capsys.readouterr().err
    assert main([*base, "--tls-cert", str(files.cert), "--tls-key", str(files.key)]) == 0
    s = Settings.load(data)
    assert s.tls_enabled and s.tls_cert == str(files.cert.resolve()) and s.tls_ca == ""


def test_commands_without_setup_say_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["group", "list"], ["enroll-code", "list", "--group", "g"], ["serve"]):
        assert main([*command, "--data-dir", str(tmp_path / "none")]) == 1
        err = capsys.readouterr().err
        assert f"no config.toml in {tmp_path / 'none'}" in err, err
        for words in ("--data-dir", "RBROKER_SERVER_DATA_DIR", "rbroker-server setup"):
            assert words in err, err


class _Prompts:
    """Answers `input()` prompts in order and remembers each prompt's offered default."""

    def __init__(self, answers: list[str]) -> None:
        self.answers = answers
        self.prompts: list[str] = []

    def __call__(self, prompt: str = "") -> str:
        self.prompts.append(prompt)
        return self.answers.pop(0)


@pytest.mark.parametrize(("bind", "loopback"), [("0.0.0.0", False), ("127.0.0.1", True)])
def test_interactive_setup_offers_this_machines_name_when_binding_all_addresses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bind: str, loopback: bool
) -> None:

    data = tmp_path / "asked"
    prompts = _Prompts([str(data), bind, "", "9443", "", "n", ""])
    monkeypatch.setattr("builtins.input", prompts)
    monkeypatch.setattr(sys, "stdin", _Tty([]))
    assert main(["setup", "--data-dir", str(data)]) == 0
    host_prompt = next(p for p in prompts.prompts if p.startswith("Public hostname"))
    offered = host_prompt.rsplit("[", 1)[1].split("]")[0]
    from rbroker_server.settings import Settings

    assert Settings.load(data).public_hostname == offered
    if loopback:
        assert offered == "localhost"
    else:
        assert offered != "localhost"
        assert offered in (socket.getfqdn(), socket.gethostname())


def test_enroll_code_list_and_revoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "srv"
    d = ["--data-dir", str(data)]
    assert main(["setup", "--non-interactive", "--group", "lab", *d]) == 0
    capsys.readouterr()
    assert main(["enroll-code", "create", "--group", "lab", "--ttl", "1h", *d]) == 0
    code = capsys.readouterr().out.strip()
    code_id = code.split("_")[1]
    assert main(["enroll-code", "list", "--group", "lab", *d]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 2  # the one from setup and this one, both unused
    assert any(line.startswith(f"{code_id}\tunused\t") for line in listed), listed

    assert main(["enroll-code", "revoke", "--group", "lab", code, *d]) == 0
    assert f"enrollment code {code_id} revoked" in capsys.readouterr().out
    assert main(["enroll-code", "list", "--group", "lab", *d]) == 0
    assert code_id not in capsys.readouterr().out
    assert main(["enroll-code", "list", "--group", "lab", "--all", *d]) == 0
    assert f"{code_id}\texpired\t" in capsys.readouterr().out
    assert main(["enroll-code", "revoke", "--group", "lab", "nope", *d]) == 1
    assert "no enrollment code nope in group lab" in capsys.readouterr().err

    # a revoked code no longer enrolls
    import nacl.signing

    from rbroker_protocol import signing
    from rbroker_protocol.enroll import EnrollRequest
    from rbroker_server.db import engine as db
    from rbroker_server.enroll.service import EnrollRefused, enroll
    from rbroker_server.settings import Settings

    engine = db.make_engine(Settings.load(data).db_url)
    try:
        key = signing.public_key_b64(nacl.signing.SigningKey.generate())
        with pytest.raises(EnrollRefused):
            enroll(engine, EnrollRequest(code=code, name="pc-1", public_key=key))
    finally:
        engine.dispose()


def test_data_dir_from_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RBROKER_SERVER_DATA_DIR", str(tmp_path / "env"))
    assert main(["setup", "--non-interactive"]) == 0
    assert (tmp_path / "env" / "config.toml").exists()
    assert os.fspath(tmp_path / "env") in capsys.readouterr().out


def test_parse_duration() -> None:
    assert parse_duration("90") == 90
    assert parse_duration("30m") == 1800
    assert parse_duration("24h") == 86400
    assert parse_duration("7d") == 7 * 86400


class _Tty:
    """Stands in for a terminal on stdin: answers the prompts in order."""

    def __init__(self, answers: list[str]) -> None:
        self.lines = [a + "\n" for a in answers]

    def isatty(self) -> bool:
        return True

    def readline(self) -> str:
        return self.lines.pop(0)


def test_interactive_setup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "asked"
    answers = [str(data), "127.0.0.1", "hub.example.org", "9443", "", "s", "research"]
    monkeypatch.setattr(sys, "stdin", _Tty(answers))
    assert main(["setup", "--data-dir", str(tmp_path / "unused")]) == 0
    out = capsys.readouterr().out
    assert "https://hub.example.org:9443" in out
    assert "group:            research" in out
    from rbroker_server.settings import Settings

    s = Settings.load(data)
    assert (s.public_hostname, s.bind_host, s.bind_port) == ("hub.example.org", "127.0.0.1", 9443)
    assert s.tls_enabled and Path(s.tls_ca).exists()


def test_setup_behind_a_reverse_proxy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rbroker_server.settings import Settings

    data = tmp_path / "data"
    base = ["setup", "--non-interactive", "--data-dir", str(data), "--bind", "127.0.0.1"]
    assert main([*base, "--external-url", "lab.example.org/rbroker"]) == 1
    assert "external_url must be an http(s) URL" in capsys.readouterr().err
    assert main([*base, "--trusted-proxy", "proxy.local"]) == 1
    assert "not an IP address or network" in capsys.readouterr().err
    args = ["--external-url", "https://lab.example.org/rbroker/", "--trusted-proxy", "127.0.0.1"]
    assert main([*base, *args, "--trusted-proxy", "10.0.0.0/8"]) == 0
    out = capsys.readouterr().out
    assert _field(out, "coordinator URL") == "https://lab.example.org/rbroker"
    assert "rbroker enroll https://lab.example.org/rbroker rbe_" in out
    settings = Settings.load(data)
    assert settings.external_url == "https://lab.example.org/rbroker/"
    assert settings.root_path == "/rbroker"
    assert settings.trusted_proxies == ("127.0.0.1", "10.0.0.0/8")
    assert 'trusted_proxies = ["127.0.0.1", "10.0.0.0/8"]' in (data / "config.toml").read_text()
