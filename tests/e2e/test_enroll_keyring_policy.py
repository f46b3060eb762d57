"""Which keyring may hold a computer's private key, tried as a user would: real `rbroker
enroll` processes against a real coordinator, real brokers, a real second OS account.

keyrings.alt's plaintext file as keyring's default (picked by itself, or forced with a
keyringrc): enroll refused with the "no keyring" message naming --key-file, nothing written
to the file; --key-file works. A backend of priority 0.5, or a plaintext one claiming a high
priority: refused. A key an older rbroker left in the plaintext file: never used, the
broker says what it does instead and `rbroker status` warns with the fix. A broker running
as another OS account names that account, the backend it asked and the fix.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import rbroker
from rbroker.uplink.keys import KeyringKeyStore
from tests.conftest import SINGLE_24G, short_tmp, start_broker, wait_until
from tests.e2e.conftest import REPO, CoordinatorProcess, enroll_cli, py_env, rbroker_cli
from tests.os_users import create_user, python_as, remove_user

PLAINTEXT = "keyrings.alt.file.PlaintextKeyring"
ENCRYPTED = "tests.e2e.keyring_backends.EncryptedFileKeyring"
ME = pwd.getpwuid(os.geteuid()).pw_name


def _isolated_env(root: Path, keyringrc: str | None = None, **extra: str) -> dict[str, str]:
    """A user's environment of its own under `root`: home, XDG dirs, no D-Bus session (so no
    Secret Service), keyring's choice left to itself unless `extra` or `keyringrc` sets it."""
    config = root / "xdg-config"
    if keyringrc is not None:
        (config / "python_keyring").mkdir(parents=True, exist_ok=True)
        (config / "python_keyring" / "keyringrc.cfg").write_text(
            f"[backend]\ndefault-keyring={keyringrc}\n"
        )
    env = py_env(
        HOME=str(root / "home"),
        XDG_DATA_HOME=str(root / "xdg-data"),
        XDG_CONFIG_HOME=str(config),
        DBUS_SESSION_BUS_ADDRESS=f"unix:path={root / 'no-bus'}",
        **extra,
    )
    if "PYTHON_KEYRING_BACKEND" not in extra:
        env.pop("PYTHON_KEYRING_BACKEND", None)
    return env


def _plaintext_file(root: Path) -> Path:
    """Where keyrings.alt's PlaintextKeyring keeps secrets in `_isolated_env(root)`."""
    return root / "xdg-data" / "python_keyring" / "keyring_pass.cfg"


def _picked(env: dict[str, str]) -> str:
    """The class of the backend keyring picks in `env`."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import keyring; k = keyring.get_keyring(); "
            "print(type(k).__module__ + '.' + type(k).__qualname__)",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def _assert_refused(done: subprocess.CompletedProcess[str], account: str = ME) -> None:
    assert done.returncode == 1, done.stderr
    assert f"cannot use the OS keyring of OS account {account}" in done.stderr, done.stderr
    assert "--key-file" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_plaintext_keyring_is_refused_and_key_file_works(coordinator: CoordinatorProcess) -> None:
    root = short_tmp()
    data = root / "data"
    plaintext = _plaintext_file(root)
    code = coordinator.first_code

    # keyring's own choice here (keyrings.alt installed, no Secret Service): the plaintext file
    natural = _isolated_env(root)
    picked = _picked(natural)
    print(f"keyring picks {picked} by itself")
    if picked == PLAINTEXT:
        done = enroll_cli(coordinator.url, code, data, "lab-p", env=natural)
        _assert_refused(done)
        assert f"keeps secrets unencrypted in a file ({plaintext})" in done.stderr, done.stderr

    # forced as the default with a keyringrc: refused the same way, nothing written anywhere
    forced = _isolated_env(root, keyringrc=PLAINTEXT)
    assert _picked(forced) == PLAINTEXT
    done = enroll_cli(coordinator.url, code, data, "lab-p", env=forced)
    _assert_refused(done)
    assert "keyrings.alt PlaintextKeyring keeps secrets unencrypted" in done.stderr, done.stderr
    assert "accepted: Windows Credential Manager, macOS Keychain, Secret Service" in done.stderr
    assert not plaintext.exists()
    assert not (data / "uplink.json").exists() and not (data / "computer.key").exists()
    assert coordinator.fleet()["computers"] == []

    # the explicit alternative: a 0600 key file, said with its path and mode
    done = enroll_cli(coordinator.url, code, data, "lab-p", "--key-file", env=forced)
    assert done.returncode == 0, done.stderr
    key_file = data / "computer.key"
    assert f"private key kept in the key file {key_file} (mode 0600)" in done.stderr, done.stderr
    assert not plaintext.exists()
    assert [c["name"] for c in coordinator.fleet()["computers"]] == ["lab-p"]

    broker = start_broker(SINGLE_24G, root=root, env=forced)
    try:
        with broker.client() as c:
            wait_until(lambda: c.status()["coordinator"]["link"] == "ok", timeout_s=20)
        done = rbroker_cli("status", "--socket", broker.socket)
        assert f"private key: the key file {key_file} (mode 0600)" in done.stdout, done.stdout
        assert "warning" not in done.stdout
    finally:
        broker.stop()
    assert not plaintext.exists()


def test_low_priority_and_plaintext_backends_are_refused(
    coordinator: CoordinatorProcess,
) -> None:
    root = short_tmp()
    store = root / "keyring.json"

    low = _isolated_env(
        root,
        PYTHON_KEYRING_BACKEND="tests.e2e.keyring_backends.LowPriorityKeyring",
        RBROKER_TEST_KEYRING_FILE=str(store),
    )
    done = enroll_cli(coordinator.url, coordinator.first_code, root / "data", "lab-l", env=low)
    _assert_refused(done)
    assert "rbroker test keyring (low priority) has priority 0.5, below 1" in done.stderr
    assert not store.exists()

    loud = _isolated_env(
        root, PYTHON_KEYRING_BACKEND="tests.e2e.keyring_backends.HighPriorityPlaintext"
    )
    done = enroll_cli(coordinator.url, coordinator.first_code, root / "data", "lab-l", env=loud)
    _assert_refused(done)
    assert "keeps secrets unencrypted in a file" in done.stderr, done.stderr
    assert not _plaintext_file(root).exists()
    assert not (root / "data" / "uplink.json").exists()
    assert coordinator.fleet()["computers"] == []


def test_a_key_left_in_a_plaintext_keyring_is_never_used(coordinator: CoordinatorProcess) -> None:
    """An enrollment made before this check, its key in keyrings.alt's plaintext file."""
    root = short_tmp()
    data = root / "data"
    plaintext = _plaintext_file(root)
    env = _isolated_env(root, keyringrc=PLAINTEXT)
    done = enroll_cli(coordinator.url, coordinator.first_code, data, "lab-old", "--key-file")
    assert done.returncode == 0, done.stderr
    old = json.loads((data / "uplink.json").read_text())
    # what the older rbroker did: the key into keyring's default, the plaintext file
    account = KeyringKeyStore(data).account
    seed_b64 = (data / "computer.key").read_text().strip()
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import keyring, sys; keyring.set_password('rbroker', sys.argv[1], sys.argv[2])",
            account,
            seed_b64,
        ],
        env=env,
        check=True,
        timeout=60,
    )
    stored = base64.b64encode(seed_b64.encode()).decode()  # the file's encoding, no secret
    assert stored in plaintext.read_text()
    (data / "computer.key").unlink()
    # reports every 1 s (default 5 s), so a report interval passes sooner below
    uplink = {**old, "key_backend": "keyring", "report_interval_s": 1.0}
    (data / "uplink.json").write_text(json.dumps(uplink))

    broker = start_broker(SINGLE_24G, root=root, env=env)
    try:
        with broker.client() as c:
            link = wait_until(
                lambda: c.status()["coordinator"].get("warning") and c.status()["coordinator"],
                timeout_s=20,
            )
        assert isinstance(link, dict)
        assert link["link"].startswith("key unavailable: the private key sits unencrypted in")
        assert str(plaintext) in link["link"] and "does not use it" in link["link"], link
        assert "--new-identity" in link["warning"] and "--key-file" in link["warning"]
        assert "Not reporting until then; leasing goes on" in link["warning"], link
        done = rbroker_cli("status", "--socket", broker.socket)
        assert "warning: the private key sits unencrypted in" in done.stdout, done.stdout
        time.sleep(1.2)  # more than a report interval (1 s): nothing was signed with that key
        assert coordinator.computer(old["computer_id"])["reports_applied"] == 0

        # plain `rbroker enroll` says the same; the fix it names works
        done = enroll_cli(coordinator.url, coordinator.new_code(), data, "lab-old", env=env)
        assert done.returncode == 1 and "sits unencrypted" in done.stderr, done.stderr
        done = enroll_cli(
            coordinator.url,
            coordinator.new_code(),
            data,
            "lab-old",
            "--key-file",
            "--new-identity",
            env=env,
        )
        assert done.returncode == 0, done.stderr
        assert f"removed the old identity's unencrypted key from {plaintext}" in done.stderr
        assert stored not in plaintext.read_text()
        new_id = json.loads((data / "uplink.json").read_text())["computer_id"]
        with broker.client() as c:
            link = wait_until(
                lambda: c.status()["coordinator"]["link"] == "ok" and c.status()["coordinator"],
                timeout_s=20,
            )
        assert isinstance(link, dict) and link["computer_id"] == new_id
        assert "warning" not in link
        wait_until(lambda: coordinator.computer(new_id)["reports_applied"] > 0, timeout_s=20)
    finally:
        broker.stop()


# -- a broker under another OS account ------------------------------------------------------


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("runuser") is None,
    reason="needs root and runuser to run a broker as another OS account",
)
def test_a_broker_under_another_account_names_it(coordinator: CoordinatorProcess) -> None:
    root = short_tmp()
    root.chmod(0o755)
    home = root / "home"
    account = create_user("rbt-svc", home=home)
    user = account.name
    procs: list[subprocess.Popen[bytes]] = []
    try:
        python = python_as(user)
        if python is None:
            pytest.skip(f"no Python interpreter with rbroker is reachable by OS account {user}")
        print(f"the broker runs as {user} with {python[0]}")
        # enrolled by this account, the key in its (test, encrypted) keyring
        data = root / "data"
        env = py_env(
            PYTHON_KEYRING_BACKEND=ENCRYPTED, RBROKER_TEST_KEYRING_FILE=str(root / "mine.json")
        )
        done = enroll_cli(coordinator.url, coordinator.first_code, data, "lab-svc", env=env)
        assert done.returncode == 0, done.stderr
        computer_id = json.loads((data / "uplink.json").read_text())["computer_id"]
        home.mkdir()
        (root / "run").mkdir()
        (root / "scenario.toml").write_text(textwrap.dedent(SINGLE_24G))
        for path in (home, data, root / "run"):
            shutil.chown(path, user)
        pw = pwd.getpwnam(user)
        subprocess.run(["chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", str(data)], check=True)

        # a key file that only this account can read, in a data dir the service account owns
        filed = root / "data-file"
        done = enroll_cli(
            coordinator.url, coordinator.new_code(), filed, "lab-svc-file", "--key-file"
        )
        assert done.returncode == 0, done.stderr
        file_id = json.loads((filed / "uplink.json").read_text())["computer_id"]
        shutil.chown(filed, user)
        shutil.chown(filed / "uplink.json", user)

        # the service account asks its own keyring (empty), then has no keyring at all, then
        # finds a key file it may not read
        cases = [
            (data, computer_id, ENCRYPTED),
            (data, computer_id, "keyring.backends.fail.Keyring"),
            (filed, file_id, ENCRYPTED),
        ]
        for n, (data_dir, enrolled_as, backend) in enumerate(cases):
            sock = str(root / "run" / f"broker-{n}.sock")
            log = open(root / f"broker-{n}.log", "wb")  # noqa: SIM115 - closed with the process
            args = ["runuser", "-u", user, "--", "env", f"PYTHONPATH={REPO}"]
            args += [f"PYTHON_KEYRING_BACKEND={backend}", *python, "broker", "--socket", sock]
            args += ["--simulate", str(root / "scenario.toml"), "--data-dir", str(data_dir)]
            # runuser forks the broker: a process group of its own, killed whole at the end
            proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, cwd="/", start_new_session=True
            )
            log.close()
            procs.append(proc)
            wait_until(lambda s=sock: _answers(s), timeout_s=30)
            with rbroker.Client(sock) as c:
                link = wait_until(
                    lambda c=c: (
                        c.status()["coordinator"]["link"].startswith("key unavailable")
                        and c.status()["coordinator"]
                    ),
                    timeout_s=20,
                )
                # leasing goes on
                lease = c.call("lease.acquire", mib=1024, project="t", session="s", purpose="p")
                c.call("lease.release", lease_id=lease["lease"]["lease_id"])
            assert isinstance(link, dict) and link["computer_id"] == enrolled_as
            text = link["link"]
            print(f"as {user}, {data_dir.name}, {backend}: {text}")
            assert f"OS account {user}" in text, text
            if data_dir == filed:
                key_file = filed / "computer.key"
                assert f"cannot read {key_file} as OS account {user}: Permission denied" in text
                assert f"it belongs to {ME}: run the broker as {ME}, or chown" in text, text
            elif backend == ENCRYPTED:
                assert f"not in rbroker test keyring (encrypted) of OS account {user}" in text
                assert f"enroll as {user}" in text and "--key-file" in text, text
                done = rbroker_cli("status", "--socket", sock)
                assert "coordinator: key unavailable: the private key is not in" in done.stdout
                assert f"OS account {user}" in done.stdout, done.stdout
            else:
                assert f"cannot use the OS keyring of OS account {user}: no OS keyring" in text
                assert "--key-file" in text, text
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        remove_user(account)
        shutil.rmtree(root, ignore_errors=True)


def _answers(sock: str) -> bool:
    try:
        with rbroker.Client(sock, timeout_s=2):
            return True
    except rbroker.BrokerUnavailable:
        return False


# -- a real Secret Service (GNOME Keyring on a private session bus) ----------------------


@pytest.fixture
def secret_service() -> Iterator[dict[str, str]]:
    """An environment whose keyring is a real, unlocked GNOME Keyring serving the Secret
    Service on a session bus of its own; skipped where dbus-daemon or gnome-keyring is
    not installed (.ci/run installs both)."""
    if not (shutil.which("dbus-daemon") and shutil.which("gnome-keyring-daemon")):
        pytest.skip("needs dbus-daemon and gnome-keyring-daemon (Debian: dbus, gnome-keyring)")
    root = short_tmp()
    runtime = root / "runtime"
    runtime.mkdir(mode=0o700)
    env = _isolated_env(root, XDG_RUNTIME_DIR=str(runtime))
    (root / "home").mkdir()
    bus = subprocess.Popen(
        ["dbus-daemon", "--session", "--nofork", "--print-address"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    daemons = [bus]
    try:
        assert bus.stdout is not None
        env["DBUS_SESSION_BUS_ADDRESS"] = bus.stdout.readline().decode().strip()
        keyring_daemon = subprocess.Popen(
            ["gnome-keyring-daemon", "--foreground", "--unlock", "--components=secrets"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        daemons.append(keyring_daemon)
        assert keyring_daemon.stdin is not None
        keyring_daemon.stdin.write(b"a test login password")
        keyring_daemon.stdin.close()
        probe = [
            sys.executable,
            "-c",
            "from rbroker.uplink.keys import choose_keyring; print(choose_keyring().name)",
        ]
        wait_until(
            lambda: (
                subprocess.run(probe, capture_output=True, text=True, env=env, timeout=30).stdout
                == "Secret Service (GNOME Keyring)\n"
            ),
            timeout_s=20,
            interval_s=0.2,
        )
        yield env
    finally:
        for daemon in reversed(daemons):
            daemon.terminate()
            try:
                daemon.wait(10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(5)
        if bus.stdout is not None:
            bus.stdout.close()


def test_secret_service_is_accepted_and_named(
    coordinator: CoordinatorProcess, secret_service: dict[str, str]
) -> None:
    root = short_tmp()
    data = root / "data"
    env = secret_service
    done = enroll_cli(coordinator.url, coordinator.first_code, data, "lab-ss", env=env)
    assert done.returncode == 0, done.stderr
    where = f"Secret Service (GNOME Keyring) of OS account {ME} (service rbroker, entry"
    assert f"private key kept in {where}" in done.stderr, done.stderr
    assert not (data / "computer.key").exists()
    assert not Path(env["XDG_DATA_HOME"], "python_keyring", "keyring_pass.cfg").exists()
    computer_id = json.loads((data / "uplink.json").read_text())["computer_id"]

    broker = start_broker(SINGLE_24G, root=root, env=env)
    try:
        with broker.client() as c:
            wait_until(lambda: c.status()["coordinator"]["link"] == "ok", timeout_s=20)
        done = rbroker_cli("status", "--socket", broker.socket)
        assert f"private key: {where}" in done.stdout, done.stdout
        wait_until(lambda: coordinator.computer(computer_id)["reports_applied"] > 0, timeout_s=20)
    finally:
        broker.stop()
