"""`uplink.json` keeps keys this version does not know, so versions can share a data dir."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rbroker.uplink.config import FILE_NAME, UplinkConfig


def test_unknown_keys_are_loaded_and_saved_intact(tmp_path: Path) -> None:
    written = {
        "url": "https://lab.example.org/rbroker",
        "computer_id": "c_0001",
        "group": "vision",
        "name": "lab-1",
        "key_backend": "file",
        "ca_file": None,
        "report_interval_s": 5.0,
        "proxy_hint": {"mode": "auto", "hops": [1, 2]},
        "telemetry_v2": True,
    }
    (tmp_path / FILE_NAME).write_text(json.dumps(written))
    config = UplinkConfig.load(tmp_path)
    assert config is not None
    assert config.url == "https://lab.example.org/rbroker" and config.key_backend == "file"
    assert config.extra == {"proxy_hint": {"mode": "auto", "hops": [1, 2]}, "telemetry_v2": True}
    config.save(tmp_path)
    assert json.loads((tmp_path / FILE_NAME).read_text()) == written
    # known settings win over a clashing extra entry
    clash = UplinkConfig("http://x", "c_2", "g", "n", extra={"url": "http://evil", "k": 1})
    clash.save(tmp_path)
    assert json.loads((tmp_path / FILE_NAME).read_text())["url"] == "http://x"
    assert UplinkConfig.load(tmp_path) == UplinkConfig("http://x", "c_2", "g", "n", extra={"k": 1})


@pytest.mark.parametrize(
    ("text", "why"),
    [("[1, 2]", "not an object"), ('{"url": "http://x"}', "missing"), ("{", "unreadable")],
)
def test_bad_files_say_why(tmp_path: Path, text: str, why: str) -> None:
    (tmp_path / FILE_NAME).write_text(text)
    with pytest.raises(ValueError, match=why):
        UplinkConfig.load(tmp_path)
