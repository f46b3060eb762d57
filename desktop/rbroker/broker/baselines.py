"""Baselines: what each holder holds on a GPU outside its leases (MiB), kept in the store.

A holder's baseline changes between grants: a sample shows memory it held before a grant
(docs/architecture.md §2, "attribution before a grant"), or an ended lease's processes (its
own or a descendant holder's) keep what they allocated. Lease records are written only at
grant, re-attach and resize, so without this table a broker restarted after such a change
restored the baseline of the grant's time, and the first sample after the restart counted
the memory as lease use: an over-admission. Every change is written at once (one small row
per holder and GPU), and `restore` reads them back after the leases.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rbroker.broker.holders import Holder

if TYPE_CHECKING:
    from rbroker.broker.store import LeaseStore

Key = tuple[Holder, str]
"""(holder, GPU UUID)."""


class Baselines(dict[Key, int]):
    """`{(holder, gpu_uuid): mib}` that writes every change to `store` (None: memory only).

    Only `[key] = mib` and `pop` change it (the lease table's only uses); a value of 0 or
    less, or a popped key, deletes the stored row.
    """

    def __init__(self, store: LeaseStore | None) -> None:
        super().__init__()
        self._store = store

    def __setitem__(self, key: Key, mib: int) -> None:
        if self._store is not None and self.get(key) != mib:
            self._store.put_baseline(key[0].pid, key[0].start_time, key[1], mib)
        super().__setitem__(key, mib)

    def pop(self, key: Key, default: int = 0) -> int:  # type: ignore[override]
        if self._store is not None and key in self:
            self._store.put_baseline(key[0].pid, key[0].start_time, key[1], 0)
        return super().pop(key, default)
