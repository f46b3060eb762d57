"""`rbroker-server install-system` / `uninstall-system`: the coordinator's unit installed
for real on this computer (its account made and removed) into a temporary root (`--root`),
verified with `systemd-analyze verify`, its ExecStart= the coordinator's own command line;
the uninstall keeps the data dir."""

from __future__ import annotations

from pathlib import Path

from rbroker_server.cli.main import build_parser
from tests.system_units import (
    RBROKER_SERVER,
    accounts,
    as_root,
    cli,
    exec_start,
    gone,
    mode,
    owner,
    verify,
)


@as_root
def test_the_coordinator_installs_and_uninstalls(tmp_path: Path) -> None:
    with accounts("rbroker-server"):
        _install_uninstall(tmp_path / "root")


def _install_uninstall(root: Path) -> None:
    args = ["install-system", "--root", str(root), "--exec", str(RBROKER_SERVER)]
    done = cli(*args, module="rbroker_server")
    assert done.returncode == 0, done.stderr
    assert "not started: /var/lib/rbroker-server has no config.toml" in done.stdout
    unit = root / "etc/systemd/system/rbroker-server.service"
    data = root / "var/lib/rbroker-server"
    assert (mode(data), owner(data)) == (0o750, "rbroker-server")
    argv = exec_start(unit)
    assert argv == [str(RBROKER_SERVER), "serve", "--data-dir", "/var/lib/rbroker-server"]
    assert build_parser().parse_args(argv[1:]).command == "serve"
    assert "User=rbroker-server" in unit.read_text()
    verify(unit)
    (data / "keep.txt").write_text("x")
    removed = cli("uninstall-system", "--root", str(root), module="rbroker_server")
    assert removed.returncode == 0, removed.stderr
    assert not unit.exists() and (data / "keep.txt").is_file()
    assert gone("passwd", "rbroker-server")
