"""The fake NVIDIA driver library (`tests/fakes/nvml_driver/fake_nvml.c`): built here, its
state written here, loaded by the real pynvml.

`gpu/fake_nvml.py` replaces the library *above* pynvml; this one sits *below* it, where a
real driver does: pynvml's ctypes calls, the versioned structs and functions, the `nvml.dll`
search on Windows. It answers from a state file (the path in `RBROKER_FAKE_NVML_STATE`,
re-read on every call) that `write_state` makes from the same scenario TOML the Python fake
reads, plus the driver behaviours only a library can have (`DriverSwitches`).

- `linux_library(old=False)`: builds `libnvidia-ml.so.1` with `cc` (once per source hash,
  shared by the test workers) and returns its folder, for `LD_LIBRARY_PATH` or `load`.
  `old=True` builds a driver before R510: no `_v3` process lists, no memory `_v2`, and no
  `nvmlDeviceGetProcessUtilization` (per-process utilization unknown).
- `windows_library(old=False)`: builds `nvml.dll` with `x86_64-w64-mingw32-gcc` (on Linux, for
  the Windows half under Wine); on Windows the path comes from `RBROKER_FAKE_NVML_DLL`.
- `load(path)`: a private copy of the pynvml module bound to that library, for a gateway in
  this process (the global `pynvml` is left alone, so no other test sees a "driver").
  `unbound()`: a new copy bound to none, for the Windows `nvml.dll` search to bind.
- `python -m tests.fakes.nvml_driver STATE [--old] [--scenario TOML]`: builds the Linux
  library, writes STATE (by default `GPU_CHECK_SCENARIO`: two whole GPUs and an A100 in MIG
  mode) and prints the library's folder, for a process started with `LD_LIBRARY_PATH` and
  `RBROKER_FAKE_NVML_STATE` (`bench/gpu_check.sh --fake-driver`).

What it cannot show (only a real GPU can): real memory figures, real MIG layouts, real WDDM
counters, driver timing (docs/development.md, "The fake driver").
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import importlib.util
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest
from tests.conftest import PROP_PROCESSES

from rbroker.gpu.scenario import SimGpu, init_error, parse_scenario

SOURCE = Path(__file__).with_name("nvml_driver") / "fake_nvml.c"
STATE_ENV = "RBROKER_FAKE_NVML_STATE"
DLL_ENV = "RBROKER_FAKE_NVML_DLL"

# NVML return codes (nvml.h) for the scenario's error names
CODES = {
    "": 0,
    "not_supported": 3,
    "no_permission": 4,
    "driver_not_loaded": 9,
    "library_not_found": 12,
    "function_not_found": 13,
    "gpu_lost": 15,
    "version_mismatch": 18,
    "argument_version_mismatch": 25,
    "unknown": 999,
}


@dataclass(frozen=True)
class MigGpu:
    """A GPU in MIG mode: `positions` slice positions, the `slices` (scenario GPUs with
    `MIG-` UUIDs) in the first ones."""

    uuid: str
    name: str
    positions: int
    slices: tuple[SimGpu, ...]


@dataclass(frozen=True)
class DriverSwitches:
    """What only a driver library can do wrong, on top of a scenario.

    `process_struct`: the record size the library writes for the `_v2`/`_v3` process lists:
    `v2` (what pynvml reads), `v1` (16 bytes, an older library) or `wide` (32, a newer one).
    `memory_v2_error`: `{uuid: name}` what `nvmlDeviceGetMemoryInfo_v2` alone answers there.
    `count_error`: what `nvmlDeviceGetCount` answers. `delay_ms`: `{uuid: ms}` each memory
    and process query sleeps. `mig`: GPUs in MIG mode, listed after the scenario's GPUs.
    """

    process_struct: str = "v2"
    memory_v2_error: dict[str, str] = field(default_factory=dict)
    count_error: str = ""
    delay_ms: dict[str, int] = field(default_factory=dict)
    mig: tuple[MigGpu, ...] = ()
    driver_version: str = "550.54.14"


def _gpu_lines(gpu: SimGpu, switches: DriverSwitches) -> list[str]:
    """The state lines of one GPU (after its `gpu`/`slice` line), with the Python fake's rule
    for device used memory (`FakeNvml._used_mib`: reserved included)."""
    listed = sum(p.used_mib or 0 for p in gpu.processes)
    used = gpu.device_used_mib
    if used is None:
        used = min(gpu.total_mib, gpu.reserved_mib + gpu.used_mib + listed)
    memory = CODES["not_supported"] if gpu.memory_api == "not_supported" else 0
    v2_error = CODES["function_not_found"] if gpu.memory_api == "v1" else 0
    v2_error = CODES[switches.memory_v2_error.get(gpu.uuid, "")] or v2_error
    delay_ms = switches.delay_ms.get(gpu.uuid, round(gpu.delay_s * 1000))
    lines = [
        f"name {gpu.name}",
        f"total_mib {gpu.total_mib}",
        f"used_mib {used}",
        f"reserved_mib {gpu.reserved_mib}",
        f"memory {memory}",
        f"memory_v2_error {v2_error}",
        f"error {CODES[gpu.error]}",
        f"process_list_error {CODES[gpu.process_list_error]}",
        f"delay_ms {delay_ms}",
        f"per_process_memory {int(gpu.per_process_memory)}",
        f"utilization_error {CODES[gpu.utilization_error]}",
    ]
    for p in gpu.processes:
        mib = -1 if p.used_mib is None else p.used_mib
        lines.append(f"process {p.pid} {mib} {p.kind} {p.sm_util or 0}")
    return lines


def state_text(scenario_text: str, switches: DriverSwitches | None = None) -> str:
    """The driver's state for a scenario (TOML, as `FakeNvml` reads it) and switches.

    Raises:
        ScenarioError: the scenario is not valid.
    """
    switches = switches or DriverSwitches()
    gpus = parse_scenario(scenario_text)
    lines = [
        "# rbroker fake NVML driver state (tests/fakes/nvml_driver/fake_nvml.c)",
        f"init_error {CODES[init_error(scenario_text)]}",
        f"count_error {CODES[switches.count_error]}",
        f"driver_version {switches.driver_version}",
        f"process_struct {switches.process_struct}",
    ]
    for gpu in gpus:
        lines += [f"gpu {gpu.uuid}", *_gpu_lines(gpu, switches)]
    for mig in switches.mig:
        lines += [f"gpu {mig.uuid}", f"name {mig.name}", f"mig {mig.positions}"]
        for part in mig.slices:
            lines += [f"slice {part.uuid}", *_gpu_lines(part, switches)]
    return "\n".join(lines) + "\n"


def write_state(path: Path, scenario_text: str, switches: DriverSwitches | None = None) -> Path:
    """Write the state atomically (the library may read it at any moment); returns `path`."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(state_text(scenario_text, switches), encoding="utf-8")
    os.replace(tmp, path)
    return path


def _source_key(old: bool) -> str:
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    return f"{digest}-{'old' if old else 'current'}"


def _compiler(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        reason = f"the fake NVML driver needs a C compiler ({name}) on PATH"
        if os.environ.get("CI"):
            pytest.fail(reason + " (.ci/run installs it)")
        pytest.skip(reason)
    return found


def _build(compiler: str, flags: list[str], out: Path, old: bool) -> Path:
    """Compile into `out` unless it is there; concurrent workers each build to a private
    name and rename (the last rename wins, all are the same)."""
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    cmd = [compiler, "-O2", "-Wall", "-Werror", *flags, "-o", str(tmp), str(SOURCE)]
    if old:
        cmd.insert(1, "-DRBROKER_OLD_DRIVER")
    # the first test to load the driver builds it: the compiler is a prop of that test, as
    # the harness's sleeping holders are, not its subject (a unit test may start it)
    PROP_PROCESSES.add(tuple(cmd))
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"building the fake NVML driver failed:\n{done.stderr}")
    os.replace(tmp, out)
    return out


def _cache() -> Path:
    return Path(tempfile.gettempdir()) / "rbroker-fake-nvml"


def linux_library(old: bool = False) -> Path:
    """The folder holding a built `libnvidia-ml.so.1` (Linux; skips where there is no cc)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the Linux fake driver is built and loaded on Linux")
    cc = _compiler("cc")
    folder = _cache() / _source_key(old)
    _build(cc, ["-shared", "-fPIC", "-fvisibility=hidden"], folder / "libnvidia-ml.so.1", old)
    return folder


def windows_library(old: bool = False) -> Path:
    """A built `nvml.dll`: on Windows the one named by `RBROKER_FAKE_NVML_DLL` (or
    `RBROKER_FAKE_NVML_OLD_DLL`), which `.ci/wine` builds; elsewhere built here with mingw."""
    if sys.platform == "win32":
        env = "RBROKER_FAKE_NVML_OLD_DLL" if old else DLL_ENV
        named = os.environ.get(env, "")
        if not named or not Path(named).is_file():
            reason = f"{env} names no built fake nvml.dll (.ci/wine builds it)"
            if os.environ.get("CI"):
                pytest.fail(reason)
            pytest.skip(reason)
        return Path(named)
    gcc = _compiler("x86_64-w64-mingw32-gcc")
    return _build(gcc, ["-shared"], _cache() / _source_key(old) / "nvml.dll", old)


def library_file(old: bool = False) -> Path:
    """This platform's built library file."""
    if sys.platform == "win32":
        return windows_library(old)
    return linux_library(old) / "libnvidia-ml.so.1"


def _private_pynvml(name: str) -> ModuleType:
    """A new copy of the pynvml module under `name` (its own entry in `sys.modules`: pynvml
    makes its error classes on `sys.modules[__name__]`), bound to no library yet."""
    found = importlib.util.find_spec("pynvml")
    assert found is not None and found.origin is not None
    spec = importlib.util.spec_from_file_location(name, found.origin)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load(library: Path) -> ModuleType:
    """A private copy of the pynvml module whose `nvmlLib` is `library` (loaded by path, as
    `rbroker.gpu.nvml_discovery` does on Windows)."""
    name = f"pynvml_on_{library.parent.name}_{library.stem}".replace("-", "_").replace(".", "_")
    module = sys.modules.get(name)
    if module is not None:
        return module
    module = _private_pynvml(name)
    module.nvmlLib = ctypes.CDLL(str(library))  # type: ignore[attr-defined]
    return module


_unbound = itertools.count()


def unbound() -> ModuleType:
    """A new private copy of pynvml bound to no library (`nvmlLib` is None) on every call:
    what `rbroker.gpu.nvml_discovery.preload_windows_nvml` finds a library for, as it does
    for the global pynvml of a broker (which no test may bind)."""
    module = _private_pynvml(f"pynvml_unbound_{next(_unbound)}")
    assert module.nvmlLib is None
    return module


GPU_CHECK_SCENARIO = """
[[gpu]]
uuid = "GPU-5a1e0000-0000-0000-0000-000000000001"
name = "Fake RTX 4090"
total_mib = 24576
used_mib = 1000

[[gpu.process]]
pid = 4000
used_mib = 2048

[[gpu.process]]
pid = 4001
kind = "graphics"

[[gpu]]
uuid = "GPU-5a1e0000-0000-0000-0000-000000000002"
name = "Fake H100 80GB"
total_mib = 81920
reserved_mib = 726
used_mib = 8
"""
"""The driver `bench/gpu_check.sh --fake-driver` runs the real-GPU check on (with
`GPU_CHECK_MIG`): a GPU with a compute and a graphics process, one whose memory v2 reports
reserved memory."""

GPU_CHECK_MIG = MigGpu(
    uuid="GPU-a1000000-0000-0000-0000-000000000001",
    name="Fake A100-SXM4-80GB",
    positions=7,
    slices=tuple(
        parse_scenario(
            '[[gpu]]\nuuid = "MIG-a1000000-0000-0000-0000-00000000000a"\nname = "slice"\n'
            "total_mib = 40192\nused_mib = 12\n"
            '[[gpu]]\nuuid = "MIG-a1000000-0000-0000-0000-00000000000b"\nname = "slice"\n'
            'total_mib = 19968\nused_mib = 6000\nprocess_list_error = "not_supported"\n'
        )
    ),
)
"""An A100 in MIG mode, two of its seven positions used (a slice without process lists)."""


def main(argv: list[str] | None = None) -> int:
    """`python -m tests.fakes.nvml_driver STATE [--old] [--scenario TOML]`: build the Linux
    library, write STATE and print the library's folder. Exit 0; 2 with one line on stderr
    when the library cannot be built or the scenario is not valid."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.fakes.nvml_driver",
        description="build the fake NVIDIA driver (libnvidia-ml.so.1), write its state, print "
        "its folder (for LD_LIBRARY_PATH; the state file for RBROKER_FAKE_NVML_STATE)",
    )
    parser.add_argument("state", type=Path, help="the state file to write")
    parser.add_argument("--old", action="store_true", help="a driver before R510")
    parser.add_argument(
        "--scenario",
        type=Path,
        help="a scenario TOML (as `rbroker broker --simulate` reads; default: two GPUs and an "
        "A100 in MIG mode)",
    )
    args = parser.parse_args(argv)
    try:
        folder = linux_library(old=args.old)
        if args.scenario is None:
            write_state(args.state, GPU_CHECK_SCENARIO, DriverSwitches(mig=(GPU_CHECK_MIG,)))
        else:
            write_state(args.state, args.scenario.read_text(encoding="utf-8"))
    except (pytest.skip.Exception, pytest.fail.Exception) as exc:
        print(f"fake NVML driver: {exc.msg}", file=sys.stderr)
        return 2
    except (OSError, RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"fake NVML driver: {first}", file=sys.stderr)
        return 2
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
