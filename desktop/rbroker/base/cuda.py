"""How a lease's GPUs are named to the CUDA runtime: `CUDA_VISIBLE_DEVICES` by index or UUID.

CUDA accepts both integer indices and UUIDs in `CUDA_VISIBLE_DEVICES`, but many tools parse
the variable as a list of integers (frameworks' device counters, launchers, schedulers'
helpers) and break on a UUID. CUDA's own order is "fastest first" unless
`CUDA_DEVICE_ORDER=PCI_BUS_ID`, in which case it is PCI bus order, the order NVML (and
`nvidia-smi`) numbers GPUs in. So an NVML index names the same GPU to CUDA once
`CUDA_DEVICE_ORDER=PCI_BUS_ID` is set, as long as no GPU is split into MIG slices: a MIG slice
has no index of its own (it shares its parent's) and CUDA addresses it only by its `MIG-` UUID.

Forms (`rbroker run --cuda-devices`, `Lease.cuda_env(form)`):
- `auto` (default): `index` when every granted GPU's NVML index is known and none of the
  broker's GPUs is a MIG slice; `uuid` otherwise.
- `index`: `CUDA_VISIBLE_DEVICES=0,2` and `CUDA_DEVICE_ORDER=PCI_BUS_ID`; refused (ValueError)
  when an index cannot name the GPU.
- `uuid`: `CUDA_VISIBLE_DEVICES=GPU-…` (or `MIG-…`), the form that never depends on order.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING's idiom (PEP 484): no `typing` at run time
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any, Literal

    CudaDevicesForm = Literal["auto", "index", "uuid"]
CUDA_DEVICES_FORMS: tuple[CudaDevicesForm, ...] = ("auto", "index", "uuid")

MIG_PREFIX = "MIG-"
"""NVML names MIG slices `MIG-<uuid>` (R470 and later) or `MIG-GPU-<uuid>/<gi>/<ci>` (before)."""


def is_mig(uuid: str) -> bool:
    """A MIG slice's UUID (see `MIG_PREFIX`)."""
    return uuid.startswith(MIG_PREFIX)


def cuda_indices(gpu_uuids: Sequence[str], gpus: Iterable[Mapping[str, Any]]) -> list[int] | None:
    """The NVML indices of `gpu_uuids`, in order, when they name the same GPUs to CUDA under
    `CUDA_DEVICE_ORDER=PCI_BUS_ID`; None when they may not.

    `gpus` is the broker's `gpus.list` (each entry's `uuid` and `index`). None when any of the
    broker's GPUs is a MIG slice (CUDA then numbers devices differently and slices share their
    parent's index), when a granted GPU is missing from the list or has no integer index, or
    when two GPUs share an index.
    """
    listed = list(gpus)
    if any(is_mig(str(g.get("uuid", ""))) for g in listed) or any(is_mig(u) for u in gpu_uuids):
        return None
    index_of: dict[str, int] = {}
    for g in listed:
        index = g.get("index")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            continue
        index_of[str(g.get("uuid"))] = index
    if len(set(index_of.values())) != len(index_of):
        return None
    if not all(u in index_of for u in gpu_uuids):
        return None
    return [index_of[u] for u in gpu_uuids]


def cuda_env(
    gpu_uuids: Sequence[str], indices: Sequence[int] | None, form: str = "auto"
) -> dict[str, str]:
    """The environment variables that make `gpu_uuids` the CUDA devices of a process.

    Returns `{"CUDA_VISIBLE_DEVICES": "0,2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}` for the index
    form, `{"CUDA_VISIBLE_DEVICES": "GPU-…,GPU-…"}` for the UUID form (see the module doc).

    Raises:
        ValueError: `form` is not one of `CUDA_DEVICES_FORMS`, or it is `index` and `indices`
            is None (a MIG slice, or an index that is not known).
    """
    if form not in CUDA_DEVICES_FORMS:
        raise ValueError(
            f"unknown CUDA device form {form!r}: choose one of {', '.join(CUDA_DEVICES_FORMS)}"
        )
    if form == "index" and indices is None:
        why = (
            "a MIG slice has no CUDA index"
            if any(is_mig(u) for u in gpu_uuids)
            else "its index cannot be matched to CUDA's (MIG on this computer, or unknown)"
        )
        raise ValueError(
            f"cannot name {','.join(gpu_uuids)} by index: {why}; use the UUID form "
            "(--cuda-devices uuid or auto)"
        )
    if form != "uuid" and indices is not None:
        return {
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in indices),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        }
    return {"CUDA_VISIBLE_DEVICES": ",".join(gpu_uuids)}
