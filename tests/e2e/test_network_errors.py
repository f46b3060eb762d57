"""`rbroker enroll` and `rbroker fleet` explain network and HTTP failures in words.

Against a real coordinator served over HTTPS with its own CA (as the operator guide recommends) and
a plain-HTTP one: plain HTTP sent to the HTTPS port, HTTPS sent to the plain port, an
unknown host name, a refused port, a certificate without its CA file, a bad enrollment code
and a bad viewer token. Each message names the problem and what to do; the tray's form of
the same error (`for_gui()`) never names a command-line flag.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rbroker.uplink.errors import UplinkError
from rbroker.uplink.fleet import fetch_fleet
from tests.conftest import short_tmp
from tests.e2e.conftest import CoordinatorProcess, enroll_cli, free_port, rbroker_cli


@pytest.fixture
def tls_coordinator(coordinator_factory: Callable[..., CoordinatorProcess]) -> CoordinatorProcess:
    return coordinator_factory(tls=True)


def _enroll_err(url: str, *extra: str) -> str:
    done = enroll_cli(url, "rbe_not-a-real-code", short_tmp() / "data", "lab", "--key-file", *extra)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    return " ".join(done.stderr.split())


def test_enroll_explains_network_failures(
    tls_coordinator: CoordinatorProcess, shared_coordinator: CoordinatorProcess
) -> None:
    c = tls_coordinator
    assert c.ca_file is not None
    plain_url = f"http://{c.host}:{c.port}"
    err = _enroll_err(plain_url, "--ca-file", c.ca_file)
    assert "dropped the plain-HTTP request" in err, err
    assert f"use https://{c.host}:{c.port}" in err, err

    err = _enroll_err(c.url)
    assert "certificate is not trusted here" in err and "--ca-file" in err, err

    err = _enroll_err("https://no-such-host.invalid:8787", "--ca-file", c.ca_file)
    assert "the host name no-such-host.invalid is unknown" in err, err

    err = _enroll_err(f"https://127.0.0.1:{free_port()}", "--ca-file", c.ca_file)
    assert "nothing accepts connections at 127.0.0.1:" in err, err
    assert "is the coordinator running" in err

    https_to_plain = shared_coordinator.url.replace("http://", "https://")
    err = _enroll_err(https_to_plain)
    assert "cannot talk HTTPS to" in err and "does not speak HTTPS" in err, err

    err = _enroll_err(c.url, "--ca-file", c.ca_file)  # reaches it: the code is refused
    assert "the enrollment code is not valid" in err, err
    assert "HTTP 401" in err and "ask the coordinator's admin for a new code" in err, err


def test_fleet_explains_a_refused_token_and_the_tray_form_has_no_flags(
    tls_coordinator: CoordinatorProcess, tmp_path: Path
) -> None:
    c = tls_coordinator
    assert c.ca_file is not None
    fleet = ("fleet", "--url", c.url, "--ca-file", c.ca_file, "--token")
    wrong = c.token[:-4] + ("aaaa" if not c.token.endswith("aaaa") else "bbbb")
    done = rbroker_cli(*fleet, wrong)
    assert done.returncode == 1
    err = " ".join(done.stderr.split())
    assert "did not accept the viewer token: it is mistyped or was revoked" in err, err
    assert "HTTP 401" in err and "ask the coordinator's admin for a viewer token" in err
    done = rbroker_cli(*fleet, "rbv_x_nope")
    assert "not in the form of a viewer token" in done.stderr, done.stderr

    with pytest.raises(UplinkError) as caught:
        fetch_fleet(tmp_path / "not-enrolled", url=c.url, token=c.token)  # no CA: untrusted
    assert "--ca-file" in str(caught.value)
    gui = caught.value.for_gui()
    assert "CA file" in gui and "Settings" in gui and "--" not in gui, gui

    with pytest.raises(UplinkError) as caught:
        fetch_fleet(tmp_path / "not-enrolled", url=c.url, ca_file=c.ca_file)
    assert "--token" in str(caught.value)
    assert "--" not in caught.value.for_gui() and "Settings" in caught.value.for_gui()
