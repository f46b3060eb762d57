"""Frameworks capped to their grant (docs/architecture.md §6a): the fractions and their
rounding, the environment and placeholders `rbroker run` gives a real child, and
`limit_torch()` / `limit_tensorflow()` in a real process holding a real lease, with a test
double at the framework boundary (tests/fakes: a CPU build of PyTorch cannot take
`set_per_process_memory_fraction`; the real call is checked by tests/desktop/gpu/test_real_gpu.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rbroker._frameworks import (
    floor_fraction,
    fraction_text,
    framework_env,
    memory_fraction,
    smallest_fraction,
    substitute,
)
from rbroker.broker.capacity import default_headroom_mib
from tests.conftest import GPU0, GPU1, WORKER, BrokerProcess
from tests.fakes.gpu_scenarios import gpu, scenario

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

FAKES = Path(__file__).parents[2] / "fakes"
REPORT = str(WORKER / "report_framework_env.py")
LIMIT = str(WORKER / "limit_framework.py")

TWO_SIZES = scenario(
    gpu(GPU0, name="Simulated RTX 4090"), gpu(GPU1, name="Simulated A100 80GB", total_mib=81920)
)


# -- fractions --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("granted", "total", "fraction", "text"),
    [
        (8192, 24576, 0.333333, "0.333333"),  # 8 GiB of 24 GiB: 1/3 rounded down
        (20000, 81920, 0.24414, "0.244140"),  # 0.244140625 rounded down
        (1, 24576, 0.00004, "0.000040"),  # 1 MiB: 0.0000406… → still above 0
        (1, 81920, 0.000012, "0.000012"),
        (24576 - 1229, 24576, 0.949991, "0.949991"),  # whole GPU minus default headroom
        (81920 - 4096, 81920, 0.95, "0.950000"),  # exact: no rounding needed
        (24576, 24576, 1.0, "1.000000"),
    ],
)
def test_fraction_of_common_sizes(granted: int, total: int, fraction: float, text: str) -> None:
    got = memory_fraction(granted, total)
    assert got == fraction
    assert fraction_text(got) == text
    assert got * total <= granted  # never past the grant
    assert round(got + 1e-6, 6) * total > granted or got == 1.0  # the largest such fraction


def test_whole_gpu_minus_headroom_is_what_the_broker_grants() -> None:
    for total in (24576, 81920, 143771):
        usable = total - default_headroom_mib(total)
        f = memory_fraction(usable, total)
        assert f * total <= usable < (f + 2e-6) * total


@given(st.integers(1, 16 * 1024 * 1024), st.integers(1, 16 * 1024 * 1024))
def test_fraction_never_rounds_up_past_the_grant(a: int, b: int) -> None:
    granted, total = min(a, b), max(a, b)
    f = memory_fraction(granted, total)
    assert 0.0 <= f <= 1.0
    assert f * total <= granted
    assert granted / total - f < 2e-6
    assert floor_fraction(granted * 2**20, total * 2**20) * total * 2**20 <= granted * 2**20


def test_bad_totals_are_refused() -> None:
    with pytest.raises(ValueError, match="total must be positive"):
        memory_fraction(1, 0)
    with pytest.raises(ValueError, match="cannot be negative"):
        memory_fraction(-1, 24576)
    with pytest.raises(ValueError, match="unknown"):
        smallest_fraction(8192, [])


def test_gpus_of_different_sizes_get_the_smallest_fraction() -> None:
    assert smallest_fraction(8192, [24576, 81920]) == 0.1
    env = framework_env(8192, [24576, 81920])
    assert env == {
        "RBROKER_GRANTED_MIB": "8192",
        "RBROKER_GPU_TOTAL_MIB": "24576,81920",
        "RBROKER_MEMORY_FRACTION": "0.100000",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.100000",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    }


def test_placeholders_are_replaced_and_other_braces_left_alone() -> None:
    values = {"mib": "20000", "fraction": "0.244140", "gpu": "0"}
    args = [
        "--gpu-memory-utilization",
        "{fraction}",
        "--max={mib}MiB",
        "cuda:{gpu}",
        '{"a": {"b": 1}}',
        "{other}",
        "{mib",
        "{{mib}}",
        "{ mib }",
    ]
    assert substitute(args, values) == [
        "--gpu-memory-utilization",
        "0.244140",
        "--max=20000MiB",
        "cuda:0",
        '{"a": {"b": 1}}',
        "{other}",
        "{mib",
        "{20000}",
        "{ mib }",
    ]


# -- rbroker run: a real child reads back its environment and arguments --------------------
def _rbroker_run(
    broker: BrokerProcess, mib: int, *cmd: str, gpus: int = 1
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "XLA_", "TF_"))}
    return subprocess.run(
        [sys.executable, "-m", "rbroker", "run", "--socket", broker.socket, "--mib", str(mib),
         "--gpus", str(gpus), "--", *cmd],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_child_of_rbroker_run_reads_the_framework_environment(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    out = tmp_path / "report.json"
    done = _rbroker_run(
        broker, 8192, sys.executable, REPORT, str(out),
        "--gpu-memory-utilization", "{fraction}", "--mib={mib}", "--device=cuda:{gpu}",
        '{"json": {"stays": true}}', "{unknown}", "{",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    env = report["env"]
    assert env["RBROKER_GRANTED_MIB"] == "8192"
    assert env["RBROKER_GPU_TOTAL_MIB"] == "24576"
    assert env["RBROKER_MEMORY_FRACTION"] == "0.333333"
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.333333"
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["RBROKER_LEASE_ID"].startswith("lease-")
    assert report["argv"] == [
        "--gpu-memory-utilization", "0.333333", "--mib=8192", "--device=cuda:0",
        '{"json": {"stays": true}}', "{unknown}", "{",
    ]  # fmt: skip
    assert "smallest" not in done.stderr  # one GPU: nothing to say


def test_lease_on_gpus_of_different_sizes_uses_the_smallest_fraction_and_says_so(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    broker = broker_factory(TWO_SIZES)
    out = tmp_path / "report.json"
    done = _rbroker_run(broker, 20000, sys.executable, REPORT, str(out), "{fraction}", gpus=2)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    # 20 000 of 24 576 is 0.813802; of 81 920 it is 0.244140: the smallest keeps both inside
    assert report["argv"] == ["0.244140"]
    assert report["env"]["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.244140"
    assert report["env"]["RBROKER_GPU_TOTAL_MIB"] in ("24576,81920", "81920,24576")
    assert "{fraction} is 0.244140, the smallest of the lease's GPUs" in done.stderr
    assert "0.813802 of 24 576 MiB" in done.stderr and "0.244140 of 81 920 MiB" in done.stderr


# -- limit_torch / limit_tensorflow in a real holder, framework faked at its boundary -------
def _limit(
    broker: BrokerProcess,
    tmp_path: Path,
    which: str,
    env_form: str,
    *,
    mib: int = 8192,
    gpus: int = 1,
    extra_env: dict[str, str] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    log = tmp_path / "calls.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(FAKES), env.get("PYTHONPATH", "")]),
        FAKE_FRAMEWORK_LOG=str(log),
        **(extra_env or {}),
    )
    done = subprocess.run(
        [sys.executable, LIMIT, broker.socket, str(mib), str(gpus), which, env_form],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    calls = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    return json.loads(done.stdout), calls


def test_limit_torch_sets_the_fraction_of_the_torch_total_on_the_leased_device(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    # PyTorch's total for the device (bytes) differs a little from NVML's 24 576 MiB
    torch_total = 24_125 * 2**20
    out, calls = _limit(
        broker, tmp_path, "torch", "lease", extra_env={"FAKE_TORCH_TOTAL_BYTES": str(torch_total)}
    )
    expected = floor_fraction(8192 * 2**20, torch_total)
    assert expected == 0.339564
    assert calls == [{"call": "set_per_process_memory_fraction", "fraction": expected, "device": 0}]
    assert out["result"] == [expected]
    assert expected * torch_total <= 8192 * 2**20
    assert out["memory_fraction"] == 0.333333 and out["gpu_total_mib"] == [24576]
    assert out["listed"] and out["listed"][0]["granted_mib"] == 8192  # the lease is intact


def test_limit_torch_caps_each_gpu_of_a_multi_gpu_lease(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    broker = broker_factory(TWO_SIZES)
    out, calls = _limit(
        broker,
        tmp_path,
        "torch",
        "lease",
        mib=20000,
        gpus=2,
        extra_env={"FAKE_TORCH_TOTAL_BYTES": "lease"},
    )
    by_uuid = {GPU0: 24576, GPU1: 81920}
    assert out["gpu_total_mib"] == [by_uuid[u] for u in out["gpu_uuids"]]
    expected = [memory_fraction(20000, t) for t in out["gpu_total_mib"]]
    assert sorted(expected) == [0.24414, 0.813802]
    assert out["memory_fractions"] == expected and out["memory_fraction"] == 0.24414
    # one call per GPU: torch's device i is the lease's i-th GPU, with its own fraction
    assert calls == [
        {"call": "set_per_process_memory_fraction", "fraction": f, "device": i}
        for i, f in enumerate(expected)
    ]


def test_limit_torch_refuses_when_the_visible_devices_are_not_the_lease(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    out, calls = _limit(
        broker,
        tmp_path,
        "torch",
        "none",
        extra_env={"FAKE_TORCH_TOTAL_BYTES": str(24576 * 2**20), "CUDA_VISIBLE_DEVICES": "3"},
    )
    assert calls == []
    assert out["error"].startswith("RuntimeError: CUDA_VISIBLE_DEVICES is '3'")
    assert "lease.cuda_env()" in out["error"]


def test_limit_tensorflow_sets_a_logical_device_memory_limit(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    out, calls = _limit(broker, tmp_path, "tensorflow", "lease", extra_env={"FAKE_TF_GPUS": "1"})
    assert calls == [
        {
            "call": "set_logical_device_configuration",
            "device": "/physical_device:GPU:0",
            "memory_limits": [8192],
        }
    ]
    assert out["result"] == [8192]


def test_limit_tensorflow_refuses_when_it_sees_other_gpus(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    out, calls = _limit(broker, tmp_path, "tensorflow", "lease", extra_env={"FAKE_TF_GPUS": "2"})
    assert calls == []
    assert out["error"] == "RuntimeError: TensorFlow sees 2 GPUs, the lease has 1"


def test_limit_torch_without_torch_says_so(broker: BrokerProcess, tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}
    env["FAKE_FRAMEWORK_LOG"] = str(log)
    done = subprocess.run(
        [sys.executable, LIMIT, broker.socket, "1024", "1", "torch", "lease"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["error"] == "ModuleNotFoundError: No module named 'torch'"


UNIFIED = scenario(
    gpu(
        GPU0,
        name="Simulated GB10 (unified memory)",
        total_mib=124610,
        memory_api="not_supported",
    )
)


def test_a_capacity_override_gets_no_fraction_and_rbroker_run_says_what_is_safe(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """On unified memory the broker admits against `--capacity-mib` (96 000 MiB here) while
    CUDA reports the system's memory (121.69 GiB): 20 000 / 96 000 = 0.208333 of 124 610
    MiB would be 25 960 MiB, past the grant. So no fraction is handed out, and the line
    names the variables that are safe."""
    broker = broker_factory(UNIFIED, extra_args=["--capacity-mib", f"{GPU0}=96000"])
    out = tmp_path / "report.json"
    done = _rbroker_run(broker, 20000, sys.executable, REPORT, str(out), "--mib={mib}")
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    env = report["env"]
    assert env["RBROKER_GRANTED_MIB"] == "20000" and env["RBROKER_GPU_TOTAL_MIB"] == "96000"
    assert env["RBROKER_MEMORY_FRACTION"] is None and env["XLA_PYTHON_CLIENT_MEM_FRACTION"] is None
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert report["argv"] == ["--mib=20000"]
    assert f"the total of {GPU0} is a capacity override (--capacity-mib)" in done.stderr
    assert "RBROKER_GRANTED_MIB=20000" in done.stderr
    refused = _rbroker_run(broker, 20000, sys.executable, REPORT, str(out), "{fraction}")
    assert refused.returncode == 2
    assert "{fraction}: no memory fraction on" in refused.stderr
    assert "Traceback" not in refused.stderr
