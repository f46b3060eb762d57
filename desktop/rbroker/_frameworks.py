"""Keeping a framework inside its grant: memory fractions, the environment `rbroker run`
gives a command, `{mib}`/`{fraction}`/`{gpu}` in its arguments, and the SDK's
`limit_torch()` / `limit_tensorflow()` (docs/architecture.md §6a).

Fractions are of a GPU's total memory, as frameworks take them (PyTorch's
`set_per_process_memory_fraction`, JAX's `XLA_PYTHON_CLIENT_MEM_FRACTION`, vLLM's
`--gpu-memory-utilization`). Rounding: down to `FRACTION_DIGITS` (6) decimals, then lowered
further while the float times the total would exceed the grant, so `fraction × total ≤
granted` always holds: a fraction never rounds up past the grant (it may leave up to
total × 10⁻⁶ MiB of the grant unused: 0.08 MiB of an 80 GiB GPU). For a lease on several
GPUs of different sizes, one fraction for all of them is the smallest of theirs.

A GPU whose total is a capacity override (`rbroker broker --capacity-mib`, where NVML has no
memory query: unified memory such as DGX Spark's GB10) gets no fraction at all: the broker
admits against the override, but a framework multiplies a fraction by CUDA's own total,
which there is the system's memory (121.69 GiB on a GB10: a 20 000 MiB grant handed as a
fraction of a 96 000 MiB override became 25 351 MiB). Its total as the framework sees it
cannot be known without starting CUDA, so `rbroker run` says so and sets only what is safe
(`override_env`): the grant in MiB, TensorFlow's allocate-as-you-go and JAX without
preallocation; `limit_torch()` still works, as it divides by PyTorch's own total.

Nothing here imports a framework until `limit_torch()` / `limit_tensorflow()` is called.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re

TYPE_CHECKING = False  # typing.TYPE_CHECKING's idiom (PEP 484): no `typing` at run time
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

FRACTION_DIGITS = 6
"""Decimals of a memory fraction: 1 MiB of a 976 GiB GPU is still more than 0."""

MIB = 1 << 20

PLACEHOLDER = re.compile(r"\{(mib|fraction|gpu)\}")
"""The placeholders `rbroker run` replaces in the command's arguments; any other `{` stays."""


def floor_fraction(part: int, whole: int, digits: int = FRACTION_DIGITS) -> float:
    """`part / whole` rounded down to `digits` decimals, such that `fraction * whole <=
    part` also holds in floating point; at most 1.0. Units: any, the same for both.

    `floor_fraction(8192, 24576)` → 0.333333; `floor_fraction(20000, 81920)` → 0.24414.

    Raises:
        ValueError: `whole` ≤ 0 or `part` < 0.
    """
    if whole <= 0:
        raise ValueError(f"a GPU's total must be positive, got {whole}")
    if part < 0:
        raise ValueError(f"a grant cannot be negative, got {part}")
    scale = 10**digits
    n = min(part * scale // whole, scale)
    while n > 0 and (n / scale) * whole > part:
        n -= 1
    return n / scale


def memory_fraction(granted_mib: int, total_mib: int) -> float:
    """The fraction of a `total_mib` GPU that a `granted_mib` grant is (see module doc).

    Raises:
        ValueError: as `floor_fraction`.
    """
    return floor_fraction(granted_mib, total_mib)


def fraction_text(fraction: float) -> str:
    """A fraction as a command-line value: `0.333333` (always `FRACTION_DIGITS` decimals)."""
    return f"{fraction:.{FRACTION_DIGITS}f}"


def smallest_fraction(granted_mib: int, totals_mib: Sequence[int]) -> float:
    """The one fraction that keeps every GPU of a lease inside its grant: the smallest.

    Raises:
        ValueError: no totals, or as `floor_fraction`.
    """
    if not totals_mib:
        raise ValueError("the totals of the lease's GPUs are unknown")
    return min(memory_fraction(granted_mib, t) for t in totals_mib)


def framework_env(granted_mib: int, totals_mib: Sequence[int]) -> dict[str, str]:
    """The variables `rbroker run` adds for the command (besides `CUDA_VISIBLE_DEVICES`):

    `RBROKER_GRANTED_MIB` (per GPU), `RBROKER_GPU_TOTAL_MIB` (each GPU's total, comma
    separated in CUDA order), `RBROKER_MEMORY_FRACTION` and JAX's
    `XLA_PYTHON_CLIENT_MEM_FRACTION` (the smallest fraction), and
    `TF_FORCE_GPU_ALLOW_GROWTH=true` (TensorFlow allocates as it goes instead of taking
    the whole GPU at start).

    Raises:
        ValueError: as `smallest_fraction`.
    """
    fraction = fraction_text(smallest_fraction(granted_mib, totals_mib))
    return {
        "RBROKER_GRANTED_MIB": str(granted_mib),
        "RBROKER_GPU_TOTAL_MIB": ",".join(str(t) for t in totals_mib),
        "RBROKER_MEMORY_FRACTION": fraction,
        "XLA_PYTHON_CLIENT_MEM_FRACTION": fraction,
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    }


def override_env(granted_mib: int, totals_mib: Sequence[int]) -> dict[str, str]:
    """The variables `rbroker run` sets instead of `framework_env` when a GPU's total is a
    capacity override (see the module doc): `RBROKER_GRANTED_MIB`, `RBROKER_GPU_TOTAL_MIB`
    (the totals the broker admits against), `TF_FORCE_GPU_ALLOW_GROWTH=true` and
    `XLA_PYTHON_CLIENT_PREALLOCATE=false` (JAX allocates as it goes instead of taking 75 %
    of CUDA's total); no fraction."""
    return {
        "RBROKER_GRANTED_MIB": str(granted_mib),
        "RBROKER_GPU_TOTAL_MIB": ",".join(str(t) for t in totals_mib),
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    }


def override_note(granted_mib: int, overridden: Sequence[str]) -> str:
    """Why there is no memory fraction for a lease on `overridden` GPUs (one line)."""
    return (
        f"the total of {', '.join(overridden)} is a capacity override (--capacity-mib), not "
        "what CUDA reports there (unified memory: the system's memory), and frameworks "
        "multiply a fraction by CUDA's own total, so no memory fraction is given; safe: "
        f"RBROKER_GRANTED_MIB={granted_mib} (cap the framework by MiB), "
        "TF_FORCE_GPU_ALLOW_GROWTH=true, XLA_PYTHON_CLIENT_PREALLOCATE=false; in Python, "
        "lease.limit_torch() divides by PyTorch's own total"
    )


def substitute(args: Sequence[str], values: dict[str, str]) -> list[str]:
    """Replace `{mib}`, `{fraction}` and `{gpu}` in each argument with `values[name]`;
    everything else (`{`, `{other}`, JSON) is left as it is.

    `substitute(["--util", "{fraction}", "{'a': 1}"], {"fraction": "0.24414", ...})` →
    `["--util", "0.24414", "{'a': 1}"]`.
    """
    return [PLACEHOLDER.sub(lambda m: values[m.group(1)], a) for a in args]


class FrameworkLimits:
    """What a lease offers frameworks (a mixin of `rbroker.Lease`; needs its `granted_mib`,
    `gpu_uuids`, `gpu_total_mib`, `cuda_visible_devices` and `cuda_env`)."""

    granted_mib: int
    gpu_uuids: list[str]
    gpu_total_mib: list[int] | None
    gpu_total_override: list[str]
    cuda_visible_devices: str

    def cuda_env(self, form: str = "auto") -> dict[str, str]:  # pragma: no cover - Lease's
        raise NotImplementedError

    @property
    def memory_fractions(self) -> list[float]:
        """Per granted GPU (in order), the grant as a fraction of its total (NVML's figure;
        rounded down, see the module doc).

        Raises:
            ValueError: the GPUs' totals are unknown (the broker's GPU list failed), or a
                total is a capacity override, which is not what frameworks see (module doc).
        """
        if not self.gpu_total_mib:
            raise ValueError("the totals of the lease's GPUs are unknown")
        if self.gpu_total_override:
            raise ValueError(override_note(self.granted_mib, self.gpu_total_override))
        return [memory_fraction(self.granted_mib, t) for t in self.gpu_total_mib]

    @property
    def memory_fraction(self) -> float:
        """The fraction for vLLM's `--gpu-memory-utilization` (or any framework that takes
        one): the smallest of `memory_fractions`, so every GPU stays inside the grant.

        Raises:
            ValueError: as `memory_fractions`.
        """
        return min(self.memory_fractions)

    def _visible_devices(self, devices: Sequence[int] | None) -> list[int]:
        """The framework's device numbers of the lease's GPUs: `devices` when given, else
        0..n-1 when `CUDA_VISIBLE_DEVICES` names exactly the lease's GPUs.

        Raises:
            RuntimeError: it does not (the framework would cap some other GPU).
        """
        n = len(self.gpu_uuids)
        if devices is not None:
            if len(devices) != n:
                raise ValueError(f"devices names {len(devices)} devices, the lease has {n} GPUs")
            return list(devices)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        forms = {self.cuda_visible_devices}
        with contextlib.suppress(ValueError):  # no index form (MIG): the UUIDs only
            forms.add(self.cuda_env("index")["CUDA_VISIBLE_DEVICES"])
        if visible is None or visible.replace(" ", "") not in forms:
            raise RuntimeError(
                f"CUDA_VISIBLE_DEVICES is {visible!r}, not this lease's GPUs: call "
                "os.environ.update(lease.cuda_env()) before the framework starts CUDA "
                "(or use rbroker run), or pass devices=[...]"
            )
        return list(range(n))

    def limit_torch(self, devices: Sequence[int] | None = None) -> list[float]:
        """Cap PyTorch's CUDA caching allocator on each of the lease's GPUs at the grant:
        `torch.cuda.set_per_process_memory_fraction(fraction, device)`, the fraction taken
        of the total PyTorch reports for that device (`get_device_properties().total_memory`),
        rounded down. An allocation past it raises `torch.cuda.OutOfMemoryError`; the CUDA
        context itself (a few hundred MiB) is outside PyTorch's cap, so ask for that much more.

        `devices`: PyTorch's device numbers of the lease's GPUs, in lease order (default:
        0..n-1, which needs `CUDA_VISIBLE_DEVICES` set from this lease, as `rbroker run`
        and `os.environ.update(lease.cuda_env())` do). Returns the fractions set.

        Raises:
            ImportError: PyTorch is not installed. RuntimeError: see `_visible_devices`.
        """
        torch: Any = importlib.import_module("torch")
        fractions = []
        for device in self._visible_devices(devices):
            total = int(torch.cuda.get_device_properties(device).total_memory)
            fraction = floor_fraction(self.granted_mib * MIB, total)
            torch.cuda.set_per_process_memory_fraction(fraction, device)
            fractions.append(fraction)
        return fractions

    def limit_tensorflow(self) -> list[int]:
        """Give TensorFlow one logical device per leased GPU limited to the grant:
        `tf.config.set_logical_device_configuration(gpu, [LogicalDeviceConfiguration(
        memory_limit=granted_mib)])` (TensorFlow's limit is in MiB). Call it before
        TensorFlow initialises its GPUs. Returns the limits set, in MiB.

        Raises:
            ImportError: TensorFlow is not installed. RuntimeError: TensorFlow sees other
                GPUs than the lease's (set `CUDA_VISIBLE_DEVICES` from the lease first).
        """
        tf: Any = importlib.import_module("tensorflow")
        self._visible_devices(None)
        gpus = list(tf.config.list_physical_devices("GPU"))
        if len(gpus) != len(self.gpu_uuids):
            raise RuntimeError(
                f"TensorFlow sees {len(gpus)} GPUs, the lease has {len(self.gpu_uuids)}"
            )
        limits = []
        for gpu in gpus:
            config = tf.config.LogicalDeviceConfiguration(memory_limit=self.granted_mib)
            tf.config.set_logical_device_configuration(gpu, [config])
            limits.append(self.granted_mib)
        return limits
