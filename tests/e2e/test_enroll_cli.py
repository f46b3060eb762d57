"""`rbroker enroll` against a real coordinator: where the private key goes and when it refuses.

No usable keyring: refuses, naming the fix (--key-file), and uses up nothing. A keyring
that hangs: cut off after a few seconds, and the command exits. --key-file: a 0600 file in
the data dir. Enrolled before but the key is gone: says so, never a silent new identity.
A working keyring (a test backend shared by processes): the broker reads its key there.
"""

from __future__ import annotations

import json
import os
import pwd
import stat
import time
from collections.abc import Callable
from pathlib import Path

from tests.conftest import SINGLE_24G, short_tmp, start_broker, wait_until
from tests.e2e.conftest import (
    CoordinatorProcess,
    UplinkBroker,
    enroll_cli,
    py_env,
    rbroker_cli,
)

NO_KEYRING = "keyring.backends.fail.Keyring"
HANGING = "tests.e2e.keyring_backends.HangingKeyring"
ENCRYPTED = "tests.e2e.keyring_backends.EncryptedFileKeyring"


def _env(backend: str, **extra: str) -> dict[str, str]:
    return py_env(PYTHON_KEYRING_BACKEND=backend, **extra)


def _computers(coordinator: CoordinatorProcess) -> list[str]:
    return [c["name"] for c in coordinator.fleet()["computers"]]


def test_enroll_key_storage_and_refusals(coordinator: CoordinatorProcess) -> None:
    root = short_tmp()
    data = root / "data"
    code = coordinator.first_code

    # no OS keyring: refused, with the fix named; nothing written, the code still unused
    done = enroll_cli(coordinator.url, code, data, "lab-1", env=_env(NO_KEYRING))
    assert done.returncode == 1
    assert "keyring" in done.stderr and "--key-file" in done.stderr, done.stderr
    assert not (data / "uplink.json").exists() and not (data / "computer.key").exists()

    # a keyring that never answers: cut off after a few seconds, and the process ends
    started = time.monotonic()
    done = enroll_cli(coordinator.url, code, data, "lab-1", env=_env(HANGING), timeout=30)
    took = time.monotonic() - started
    assert done.returncode == 1
    assert "did not answer within 5 s" in done.stderr, done.stderr
    assert "--key-file" in done.stderr
    assert took < 20, took
    print(f"hanging keyring: enroll exited after {took:.1f} s")
    assert _computers(coordinator) == []

    # --key-file: the same code now works; the key is a 0600 file in the data dir
    done = enroll_cli(coordinator.url, code, data, "lab-1", "--key-file", env=_env(NO_KEYRING))
    assert done.returncode == 0, done.stderr
    assert f"private key kept in the key file {data / 'computer.key'} (mode 0600)" in done.stderr
    config = json.loads((data / "uplink.json").read_text())
    assert config["key_backend"] == "file" and config["url"] == coordinator.url
    key_file = data / "computer.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert _computers(coordinator) == ["lab-1"]

    # enrolled already: refused, whatever the flags
    again = coordinator.new_code()
    done = enroll_cli(coordinator.url, again, data, "lab-1", "--key-file")
    assert done.returncode == 1
    assert "already enrolled as " + config["computer_id"] in done.stderr

    # the coordinator knows this computer but its key is gone: it says so, no new identity
    saved = key_file.read_bytes()
    key_file.unlink()
    done = enroll_cli(coordinator.url, again, data, "lab-1", "--key-file")
    assert done.returncode == 1
    assert "private key cannot be read" in done.stderr, done.stderr
    assert "--new-identity" in done.stderr
    assert _computers(coordinator) == ["lab-1"]
    assert json.loads((data / "uplink.json").read_text()) == config

    # a broker on that data dir keeps leasing and says why it does not report
    broker = start_broker(SINGLE_24G, root=root)
    try:
        with broker.client() as c:
            link = wait_until(
                lambda: (
                    c.status()["coordinator"]["link"].startswith("key unavailable")
                    and c.status()["coordinator"]
                ),
                timeout_s=10,
            )
            assert isinstance(link, dict) and link["computer_id"] == config["computer_id"]
            lease = c.call(
                "lease.acquire", mib=1024, project="tests", session="s", purpose="still leasing"
            )
            c.call("lease.release", lease_id=lease["lease"]["lease_id"])
    finally:
        broker.stop()

    # a key file readable by others is not used (and not silently fixed)
    key_file.write_bytes(saved)
    key_file.chmod(0o644)
    done = enroll_cli(coordinator.url, again, data, "lab-1", "--key-file")
    assert done.returncode == 1
    assert "readable by others" in done.stderr, done.stderr
    key_file.chmod(0o600)

    # --new-identity that fails (a bad code) leaves the old identity as it was
    done = enroll_cli(
        coordinator.url, "rbe_nope_nope", data, "lab-1", "--key-file", "--new-identity"
    )
    assert done.returncode == 1
    assert "the enrollment code is not valid" in done.stderr and "HTTP 401" in done.stderr
    assert key_file.read_bytes() == saved
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert json.loads((data / "uplink.json").read_text()) == config

    # --new-identity that succeeds: a second computer, asked for explicitly
    done = enroll_cli(coordinator.url, again, data, "lab-1", "--key-file", "--new-identity")
    assert done.returncode == 0, done.stderr
    assert json.loads((data / "uplink.json").read_text())["computer_id"] != config["computer_id"]
    assert key_file.read_bytes() != saved
    assert _computers(coordinator) == ["lab-1", "lab-1"]

    # an unreadable enrollment file: said plainly, nothing changed
    broken = short_tmp() / "data"
    broken.mkdir()
    (broken / "uplink.json").write_text("{not json")
    done = enroll_cli(coordinator.url, again, broken, "lab-3", "--key-file")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "uplink.json is unreadable" in done.stderr, done.stderr
    assert not (broken / "computer.key").exists()

    # a bad code: refused by the coordinator, and no key is left behind
    other = short_tmp() / "data"
    done = enroll_cli(coordinator.url, "rbe_nope_nope", other, "lab-2", "--key-file")
    assert done.returncode == 1
    assert "the enrollment code is not valid: it is mistyped, already used" in done.stderr
    assert not (other / "computer.key").exists() and not (other / "uplink.json").exists()


def test_enroll_into_a_keyring_while_the_broker_runs(
    coordinator: CoordinatorProcess, tmp_path: Path
) -> None:
    """The default path: the key in a (test) keyring shared by processes; a running broker
    picks up the new enrollment by itself and starts reporting."""
    store = tmp_path / "keyring.json"
    env = _env(ENCRYPTED, RBROKER_TEST_KEYRING_FILE=str(store))
    root = short_tmp()
    broker = start_broker(SINGLE_24G, root=root, env=env)
    try:
        with broker.client() as c:
            assert c.status()["coordinator"]["link"] == "not enrolled"
        done = rbroker_cli("status", "--socket", broker.socket)
        assert "coordinator: not enrolled" in done.stdout, done.stdout

        done = enroll_cli(coordinator.url, coordinator.first_code, root / "data", "lab-k", env=env)
        enrolled_at = time.monotonic()
        assert done.returncode == 0, done.stderr
        account = pwd.getpwuid(os.geteuid()).pw_name
        where = f"rbroker test keyring (encrypted) of OS account {account} (service rbroker"
        assert f"private key kept in {where}" in done.stderr, done.stderr
        config = json.loads((root / "data" / "uplink.json").read_text())
        assert config["key_backend"] == "keyring"
        assert not (root / "data" / "computer.key").exists()
        entries = json.loads(store.read_text())
        assert len(entries) == 1 and next(iter(entries)).startswith("rbroker/computer-key-")
        assert next(iter(entries.values())).startswith("secretbox:")  # stored encrypted

        wait_until(
            lambda: coordinator.computer(config["computer_id"])["reports_applied"] > 0,
            timeout_s=20,
            interval_s=0.2,
        )
        print(f"first report stored {time.monotonic() - enrolled_at:.1f} s after enrolling")
        with broker.client() as c:
            link = c.status()["coordinator"]
        assert link["link"] == "ok" and link["computer_id"] == config["computer_id"], link
        assert link["key"].startswith(where), link
        done = rbroker_cli("status", "--socket", broker.socket)
        assert f"private key: {where}" in done.stdout, done.stdout
        assert "warning" not in done.stdout
    finally:
        broker.stop()


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no thread count")


def test_broker_with_a_hanging_keyring_keeps_leasing_and_says_why() -> None:
    """The key lookup is cut off, the link says why, and lookups that never return do not
    pile up (one stuck call at a time)."""
    from rbroker.uplink.config import UplinkConfig

    root = short_tmp()
    UplinkConfig(url="http://127.0.0.1:9", computer_id="c_hung", group="g", name="lab-hung").save(
        root / "data"
    )
    broker = start_broker(SINGLE_24G, root=root, env=_env(HANGING))
    try:
        with broker.client() as c:
            link = wait_until(
                lambda: (
                    c.status()["coordinator"]["link"].startswith("key unavailable")
                    and c.status()["coordinator"]["link"]
                ),
                timeout_s=20,
            )
            assert "did not answer" in str(link) and "--key-file" in str(link), link
            first = _threads(broker.proc.pid)
            time.sleep(12)  # more polls of the enrollment (one every 2 s + 5 s cut-off)
            later = _threads(broker.proc.pid)
            print(f"hanging keyring: broker threads {first} -> {later} over 12 s")
            assert later <= first
            assert c.status()["coordinator"]["link"].startswith("key unavailable")
            lease = c.call("lease.acquire", mib=1024, project="t", session="s", purpose="p")
            c.call("lease.release", lease_id=lease["lease"]["lease_id"])
    finally:
        broker.stop()


def test_broker_with_a_missing_ca_file_says_so() -> None:
    """An enrollment whose pinned CA file is gone: the link names the file, leasing goes on."""
    import nacl.signing

    from rbroker.uplink.config import UplinkConfig
    from rbroker.uplink.keys import FileKeyStore

    root = short_tmp()
    FileKeyStore(root / "data" / "computer.key").save(nacl.signing.SigningKey.generate())
    missing = str(root / "moved-away" / "ca.pem")
    UplinkConfig(
        url="https://127.0.0.1:9",
        computer_id="c_ca",
        group="g",
        name="lab-ca",
        key_backend="file",
        ca_file=missing,
    ).save(root / "data")
    broker = start_broker(SINGLE_24G, root=root)
    try:
        with broker.client() as c:
            link = wait_until(
                lambda: (
                    c.status()["coordinator"]["link"].startswith("config error")
                    and c.status()["coordinator"]["link"]
                ),
                timeout_s=10,
            )
            assert missing in str(link), link
            lease = c.call("lease.acquire", mib=1024, project="t", session="s", purpose="p")
            c.call("lease.release", lease_id=lease["lease"]["lease_id"])
    finally:
        broker.stop()


def test_reenrolling_a_running_broker_switches_its_identity(
    coordinator: CoordinatorProcess, uplink_broker: Callable[..., UplinkBroker]
) -> None:
    """`enroll --new-identity` beside a running broker: it reports as the new computer from
    then on (not as the old one with a key that is gone from the store)."""
    lab = uplink_broker(coordinator, "lab-re")
    wait_until(lambda: lab.link()["link"] == "ok", timeout_s=20, interval_s=0.2)
    data = lab.broker.data_dir
    done = enroll_cli(
        coordinator.url, coordinator.new_code(), data, "lab-re", "--key-file", "--new-identity"
    )
    switched_at = time.monotonic()
    assert done.returncode == 0, done.stderr
    new_id = json.loads((data / "uplink.json").read_text())["computer_id"]
    assert new_id != lab.computer_id
    link = wait_until(
        lambda: lab.link()["computer_id"] == new_id and lab.link()["link"] == "ok" and lab.link(),
        timeout_s=20,
        interval_s=0.2,
    )
    assert isinstance(link, dict)
    wait_until(lambda: coordinator.computer(new_id)["reports_applied"] > 0, timeout_s=10)
    print(
        f"re-enrolled: reporting as the new computer {time.monotonic() - switched_at:.1f} s later"
    )
    old = coordinator.computer(lab.computer_id)["reports_applied"]
    time.sleep(6)  # more than one report interval: the old identity is silent
    assert coordinator.computer(lab.computer_id)["reports_applied"] == old
