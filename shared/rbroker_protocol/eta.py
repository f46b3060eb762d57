"""When a waiting request will likely fit, in words: one wording for every face (`rbroker
status`, the tray, the coordinator's web view).

A queued request carries `eta_s` (seconds from now, or None) and `eta_reason` (what it
waits for when there is an estimate, why there is none otherwise); the broker's estimator
(`rbroker.broker.eta`) fills both. Older brokers send neither: the words are then empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def about(seconds: float) -> str:
    """`seconds` (≥ 0) rounded for a person: "~40 s", "~6 min", "~2.5 h"."""
    if seconds < 60:
        return f"~{max(1, round(seconds / 10) * 10):.0f} s" if seconds >= 5 else "~now"
    if seconds < 7200:
        return f"~{seconds / 60:.0f} min"
    return f"~{seconds / 3600:.1f} h"


def eta_words(entry: Mapping[str, Any]) -> str:
    """The estimate of queue entry `entry` (its `eta_s`, `eta_reason`): "likely in ~6 min
    (because 1 lease of vision likely ends by then)", "likely any moment now (…)", "no
    estimate: <why>"; "" when it carries no estimate (an older broker)."""
    eta_s = entry.get("eta_s")
    reason = str(entry.get("eta_reason") or "")
    if eta_s is None:
        return f"no estimate: {reason}" if reason else ""
    eta = float(eta_s)
    when = "likely any moment now" if eta < 5 else f"likely in {about(eta)}"
    return f"{when} (because {reason})" if reason else when
