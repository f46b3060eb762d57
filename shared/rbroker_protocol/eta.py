"""When a waiting request will likely fit, in words: one wording for every face (`rbroker
status` and `rbroker top`, the tray, the coordinator's web view).

A queued request carries `eta_s` (seconds from now, or None) and `eta_reason` (what it
waits for when there is an estimate, why there is none otherwise); the broker's estimator
(`rbroker.broker.eta`) fills both. Older brokers send neither: the words are then None.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING's idiom (PEP 484): no `typing` on a client's start
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


def about(seconds: float) -> str:
    """`seconds` (≥ 0) for a person: "40 s" (under 2 min), "7 min" (under 2 h), "2.5 h"."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def eta_words(entry: Mapping[str, Any]) -> str | None:
    """The estimate of queue entry `entry` (its `eta_s`, `eta_reason`): "likely in ~7 min
    (because 1 lease of vision likely ends by then)", "any moment now (…)", "no estimate
    yet (<why>)"; None when it carries no `eta_s` (a broker older than the estimate)."""
    if "eta_s" not in entry:
        return None
    eta_s, because = entry["eta_s"], entry.get("eta_reason")
    if eta_s is None:
        return "no estimate yet" + (f" ({because})" if because else "")
    when = "any moment now" if float(eta_s) < 1 else f"likely in ~{about(float(eta_s))}"
    return when + (f" (because {because})" if because else "")
