"""Wire types shared by the rbroker desktop side and the coordinator.

This package imports neither `rbroker` nor `rbroker_server`. It holds the JSON-RPC framing
rules of the local API, the stable error codes, the request/response models and the
description rules. Fields are only ever added; `PROTOCOL_VERSION` is bumped when they are.
"""

from rbroker_protocol.errors import ERROR_CODES, ErrorCode, RpcError
from rbroker_protocol.versions import PROTOCOL_VERSION, PROTOCOL_VERSION_MIN

__all__ = ["ERROR_CODES", "PROTOCOL_VERSION", "PROTOCOL_VERSION_MIN", "ErrorCode", "RpcError"]
