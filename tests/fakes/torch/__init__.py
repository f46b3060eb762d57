"""A stand-in for `torch` that records calls (see tests/fakes/README.md)."""

from __future__ import annotations

import json
import os
from typing import Any

__version__ = "0.0-fake"


def record(call: str, **args: Any) -> None:
    """Append `{"call": call, **args}` to $FAKE_FRAMEWORK_LOG."""
    with open(os.environ["FAKE_FRAMEWORK_LOG"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"call": call, **args}) + "\n")


from torch import cuda  # noqa: E402

__all__ = ["cuda", "record"]
