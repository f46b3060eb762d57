"""Wire types shared by the rbroker desktop side and the coordinator.

This package imports neither `rbroker` nor `rbroker_server`. It holds the JSON-RPC framing
rules of the local API, the stable error codes, the request/response models and the
description rules. Fields are only ever added; `PROTOCOL_VERSION` is bumped when they are.

Its names load on first use (PEP 562): importing one of its modules (a client reads
`versions` on every start) loads no other, and no `typing` (docs/architecture.md §10,
start-up).
"""

from __future__ import annotations

import importlib

# the idiom type checkers read as typing.TYPE_CHECKING (PEP 484's constant, never true at
# run time): `typing` costs a client's start-up more than this package does
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from rbroker_protocol.errors import ERROR_CODES, ErrorCode, RpcError
    from rbroker_protocol.versions import PROTOCOL_VERSION, PROTOCOL_VERSION_MIN

_EXPORTS: dict[str, str] = {  # name → the module that defines it
    "ERROR_CODES": "rbroker_protocol.errors",
    "ErrorCode": "rbroker_protocol.errors",
    "RpcError": "rbroker_protocol.errors",
    "PROTOCOL_VERSION": "rbroker_protocol.versions",
    "PROTOCOL_VERSION_MIN": "rbroker_protocol.versions",
}


def __getattr__(name: str) -> Any:
    """`rbroker_protocol.NAME` for the names of `__all__`, each module loaded on its first use.

    Raises:
        AttributeError: not one of them.
    """
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rbroker_protocol' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next use is a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__all__ = ["ERROR_CODES", "PROTOCOL_VERSION", "PROTOCOL_VERSION_MIN", "ErrorCode", "RpcError"]
