"""`rbroker-server serve` that cannot start: one line on stderr with the fix and a distinct
exit code (docs/user-guide.md "Exit codes"), never a traceback. Real `serve` processes, real
sockets, a real PostgreSQL server for the unreachable-database case (a port nothing listens on).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rbroker_protocol.startup import (
    EXIT_ADDRESS_IN_USE,
    EXIT_DATABASE,
    EXIT_PERMISSION,
    EXIT_TLS,
)
from rbroker_server.settings import Settings
from tests.ports import free_port

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
NO_PRIVILEGES = [
    "setpriv",
    "--inh-caps=-dac_override,-dac_read_search,-net_bind_service",
    "--bounding-set=-dac_override,-dac_read_search,-net_bind_service",
]


@pytest.fixture
def data(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "srv"
    Settings(data_dir=d, bind_host="127.0.0.1", bind_port=free_port()).save()
    yield d
    for p in (d, *d.rglob("*")):
        if p.is_dir():
            p.chmod(0o755)


def _serve(data: Path, *extra: str, prefix: list[str] | None = None) -> tuple[int, str]:
    command = [sys.executable, "-m", "rbroker_server", "serve", "--data-dir", str(data)]
    done = subprocess.run(
        [*(prefix or []), *command, *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return done.returncode, lines[0]


def _unprivileged() -> list[str]:
    if not IS_ROOT:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to drop root's privileges")
    return NO_PRIVILEGES


def _in_use_words(port: int) -> str:
    """What this OS says when binding `port` while another socket listens there ("Address
    already in use" on Linux; Windows' words for WSAEADDRINUSE)."""
    with socket.socket() as probe, pytest.raises(OSError) as refused:
        probe.bind(("127.0.0.1", port))
    return str(refused.value.strerror)


def test_address_in_use(data: Path) -> None:
    port = Settings.load(data).bind_port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        # before: uvicorn's startup log lines, "[Errno 98] error while attempting to bind on
        # address ...", exit code 1
        code, line = _serve(data)
        words = _in_use_words(port)
    assert code == EXIT_ADDRESS_IN_USE == 12
    assert line == (
        f"rbroker-server: cannot listen on 127.0.0.1:{port}: {words}; another "
        "process (another coordinator?) listens there: stop it or choose --port"
    )


def test_a_port_bound_but_not_yet_listened_on_is_in_use() -> None:
    """Before: two coordinators started at the same moment both bound the port (SO_REUSEADDR
    lets a second socket bind while nobody listens yet); the second then served nothing,
    said nothing and stayed up. Right: `bind` listens, so the second fails at once."""
    from rbroker_server.cli.startup import StartupFailure, bind

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    first = bind("127.0.0.1", port)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # it listens already: a client is accepted into its backlog
        with pytest.raises(StartupFailure) as second:
            bind("127.0.0.1", port)
        assert second.value.code == EXIT_ADDRESS_IN_USE
        assert f"cannot listen on 127.0.0.1:{port}: {_in_use_words(port)}" in str(second.value)
    finally:
        first.close()


@pytest.mark.skipif(sys.platform != "linux", reason="Linux only: privileged ports below 1024")
def test_privileged_port(data: Path) -> None:
    if Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text().strip() == "0":
        pytest.skip("every port is unprivileged here")
    code, line = _serve(data, "--port", "443", prefix=_unprivileged())
    assert code == EXIT_PERMISSION == 11
    assert line.startswith("rbroker-server: cannot listen on 127.0.0.1:443: Permission denied; ")
    assert "choose --port 1024 or above" in line


@pytest.mark.skipif(
    os.name != "posix", reason="POSIX only: chmod takes write access away (not on Windows)"
)
def test_data_dir_without_write_permission(data: Path) -> None:
    data.chmod(0o555)  # config.toml readable, but SQLite cannot create its files there
    code, line = _serve(data, prefix=_unprivileged())
    assert code == EXIT_PERMISSION == 11
    assert line.startswith(
        f"rbroker-server: cannot start: the database directory: Permission denied: '{data}'"
    ), line


@pytest.mark.skipif(
    os.name != "posix", reason="POSIX only: chmod takes read access away (not on Windows)"
)
def test_unreadable_config(data: Path) -> None:
    (data / "config.toml").chmod(0o000)
    code, line = _serve(data, prefix=_unprivileged())
    assert code == EXIT_PERMISSION == 11
    assert line.startswith(f"rbroker-server: Permission denied: '{data / 'config.toml'}'; ")


@pytest.mark.parametrize(
    ("line", "says"),
    [
        # before: "rbroker-server: Illegal character '\n' (at line 23, column 12)"
        ('public_hostname = "lab\n', "not valid TOML: Illegal character '\\n' (at line "),
        ("bind_port = 'x'", "bind_port must be a whole number, not 'x'"),
        ("bind_port = 80.5", "bind_port must be a whole number, not 80.5"),
        # before: float([1]) raised TypeError, a traceback
        ("stale_after_s = [1]", "stale_after_s must be a number, not [1]"),
        ("stale_after_s = true", "stale_after_s must be a number, not True"),
        ("public_hostname = 7", "public_hostname must be a string, not 7"),
        (
            'trusted_proxies = "10.0.0.1"',
            "trusted_proxies must be a list of strings, not '10.0.0.1'",
        ),
        ("trusted_proxies = ['nope']", "trusted_proxies: 'nope' is not an IP address or network"),
        ("stale_after_s = 900.0", "need 0 < stale_after_s <= offline_after_s"),
        ("colour = 'blue'", "unknown settings colour"),
    ],
)
def test_a_broken_config_names_its_file(data: Path, line: str, says: str) -> None:
    config = data / "config.toml"
    lines = config.read_text().splitlines()
    lines.insert(4, line)
    for key in ("public_hostname", "bind_port", "stale_after_s", "trusted_proxies"):
        if line.startswith(key):  # TOML refuses a key given twice: replace the saved one
            lines = [x for i, x in enumerate(lines) if i == 4 or not x.startswith(f"{key} =")]
    config.write_text("\n".join(lines) + "\n")
    # every command loads the config the same way: all of them for the TOML case
    commands = [["serve"], ["db", "upgrade"], ["group", "list"]] if "TOML" in says else [["serve"]]
    for command in commands:
        done = subprocess.run(
            [sys.executable, "-m", "rbroker_server", *command, "--data-dir", str(data)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "Traceback" not in done.stderr, done.stderr
        assert done.returncode == 1, (command, done.returncode, done.stderr)
        assert done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith(f"rbroker-server: {config}: {says}"), done.stderr


def test_database_unreachable(data: Path) -> None:
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql+psycopg://postgres:secret@127.0.0.1:{port}/rbroker"
    Settings.load(data).replace(database_url=url).save()
    code, line = _serve(data)
    assert code == EXIT_DATABASE == 15
    assert line.startswith(
        f"rbroker-server: cannot start: the database postgresql+psycopg://postgres:***@127.0.0.1:"
        f"{port}/rbroker cannot be opened or migrated: "
    )
    assert "secret" not in line and "check database_url in" in line


def test_missing_tls_key(data: Path) -> None:
    cert, key = data / "tls" / "server.pem", data / "tls" / "server.key"
    Settings.load(data).replace(tls_cert=str(cert), tls_key=str(key)).save()
    code, line = _serve(data)
    assert code == EXIT_TLS == 16
    assert line == (
        f"rbroker-server: cannot load the TLS certificate and key ({cert}, {key}): No such file "
        "or directory; fix tls_cert and tls_key in the config, or run `rbroker-server setup "
        "--force --self-signed` for a new pair"
    )


@pytest.mark.skipif(sys.platform == "win32", reason="no RLIMIT_NOFILE on Windows")
def test_serve_raises_its_soft_fd_limit_to_the_hard_one() -> None:
    """A child with the soft limit at 1024 (systemd's default) and a higher hard limit
    ends with the hard one as its soft limit."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 1024:
        pytest.skip(f"the hard limit here is {hard}: nothing to raise")
    code = (
        "import resource\n"
        "from rbroker_server.cli.startup import raise_fd_limit\n"
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))\n"
        "print(raise_fd_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    limits, soft = out.stdout.split(") ")
    assert limits.startswith("(1024, ")
    assert int(soft) > 1024 and int(soft) == int(limits.split(", ")[1])


def test_the_unit_sets_a_file_limit() -> None:
    unit = Path(__file__).resolve().parents[2] / "packaging" / "linux" / "rbroker-server.service"
    assert "\nLimitNOFILE=65536\n" in unit.read_text()
