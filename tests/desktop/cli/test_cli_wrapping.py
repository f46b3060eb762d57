"""Tables never cut what explains a wait (docs/architecture.md §5, docs/user-guide.md "Command
line"): at 80 and 120 columns a queue's reason, a lease's purpose and a job's state wrap within
their columns and are whole, while numbers and headers stay on one line. Pure rendering, no broker.
"""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from rich.console import Console

from rbroker.cli.views import broker_view, jobs_table

GPU0 = "GPU-5a1e0000-0000-0000-0000-000000000001"
GPU1 = "GPU-5a1e0000-0000-0000-0000-000000000002"
REASON = (
    f"waiting: {GPU1} has 8 192 MiB available (total 24 576 − headroom 1 229 − in use "
    "2 811 − granted, not yet in use 12 344); 20 000 asked; 11 808 MiB more must be freed"
)
PURPOSE = "fine-tune llama-3-8b on the support tickets, second attempt with a lower learning rate"


def _gpu(uuid: str, index: int) -> dict[str, Any]:
    return {
        "uuid": uuid,
        "index": index,
        "name": "Simulated RTX 4090",
        "total_mib": 24576,
        "available_mib": 8192,
        "used_by_leases_mib": 2811,
        "outstanding_mib": 12344,
        "used_by_others_mib": 0,
        "headroom_mib": 1229,
        "waiting": 1,
        "telemetry": "ok",
    }


def _render(renderable: Any, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, force_terminal=True, color_system=None).print(renderable)
    return out.getvalue()


def _column(text: str, header: str, title: str) -> str:
    """The words of the column under `header` in the table titled `title`: each line's
    characters from the header's position up to the next column (two spaces or more), joined."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    head = next(i for i in range(start, len(lines)) if re.search(rf"\b{header}\b", lines[i]))
    x = re.search(rf"\b{header}\b", lines[head]).start()  # type: ignore[union-attr]
    words: list[str] = []
    for line in lines[head + 2 :]:
        if not line.strip():
            break
        cell = re.split(r"\s{2,}", line[x:].strip())[0] if len(line) > x else ""
        words.append(cell)
    return " ".join(w for w in words if w)


def _leases() -> dict[str, Any]:
    return {
        "leases": [
            {
                "lease_id": "lease-3f2a1b4c5d6e",
                "owner": "alice",
                "project": "support-bot",
                "session": "run-7",
                "purpose": PURPOSE,
                "granted_mib": 12345,
                "observed_mib": {GPU1: 0},
                "gpu_uuids": [GPU1],
                "state": "active",
                "granted_at": 0.0,
                "expires_in_s": 29.0,
            }
        ],
        "queue": [
            {
                "request_id": 3,
                "owner": "bob",
                "project": "eval",
                "purpose": "wait for the second GPU",
                "mib": 20000,
                "waiting_s": 4.2,
                "reason": REASON,
            }
        ],
    }


@pytest.mark.parametrize("width", [80, 120])
def test_the_queue_reason_and_a_long_purpose_are_whole_at_any_width(width: int) -> None:
    text = _render(broker_view([_gpu(GPU0, 0), _gpu(GPU1, 1)], _leases()), width)
    assert all(len(line) <= width for line in text.splitlines()), text
    # the only `…` are the short forms of identifiers (a UUID's head and tail)
    assert "…" not in re.sub(r"GPU-[0-9a-f]+…[0-9a-f]{4}|GPU \d …[0-9a-f]{4}", "", text), text
    flat = " ".join(text.split())
    for number in ("8 192", "24 576", "1 229", "2 811", "12 344", "20 000", "11 808"):
        assert number in flat, (number, text)
    assert " ".join(REASON.split()).replace(" ", "") in _column(text, "reason", "Queue").replace(
        " ", ""
    ), text
    assert " ".join(PURPOSE.split()).replace(" ", "") in _column(text, "purpose", "Leases").replace(
        " ", ""
    ), text


@pytest.mark.parametrize("width", [40, 60])
def test_narrower_than_the_numbers_each_row_is_a_record_and_no_figure_is_cut(width: int) -> None:
    # rbroker top in a 60-column terminal showed "24 5…" for 24 576: rich cut what did not fit
    text = _render(broker_view([_gpu(GPU0, 0), _gpu(GPU1, 1)], _leases()), width)
    assert all(len(line) <= width for line in text.splitlines()), text
    assert "…" not in re.sub(r"GPU-[0-9a-f]+…[0-9a-f]{4}|GPU \d …[0-9a-f]{4}", "", text), text
    flat = " ".join(text.split())
    for number in ("24 576", "8 192", "1 229", "2 811", "12 344", "20 000", "11 808", "12 345"):
        assert number in flat, (number, text)
    assert "GPU 0: total 24 576 · available 8 192" in flat, text
    arithmetic = " ".join(REASON.split(GPU1)[1].split())  # the GPU may be in its short form
    assert arithmetic in flat and " ".join(PURPOSE.split()) in flat, text


def test_a_jobs_state_and_purpose_are_never_cut_at_80_columns() -> None:
    jobs = [
        {
            "job_id": "job-1a2b3c",
            "purpose": PURPOSE,
            "state": "succeeded",
            "completed_items": 100000,
            "failed_items": 0,
            "total_items": 100000,
            "items_per_s": None,
            "eta_s": None,
            "project": "support-bot",
            "workers": 4,
            "leases_held": 0,
            "handler": "embed",
        }
    ]
    text = _render(jobs_table(jobs), 80)
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "succeeded" in text and "succee…" not in text, text
    assert PURPOSE.replace(" ", "") in _column(text, "purpose", "Jobs").replace(" ", ""), text


BRACKETED = [
    "evaluate every checkpoint [data shard 3] of the vision run on the held-out set",
    "sweep [/lr] and [bold]batch size[/bold] on the support tickets at 80 columns",
]


@pytest.mark.parametrize("purpose", BRACKETED, ids=["tag-like", "closing-tag"])
def test_a_purpose_with_brackets_is_shown_as_written_at_80_columns(purpose: str) -> None:
    """Before: a job's or lease's purpose went through rich markup, so `[data shard 3]`
    vanished from `rbroker jobs` at 80 columns and `[/lr]` stopped `rbroker jobs`, `status`
    and `top` with a MarkupError traceback. Right: the purpose is whole, brackets and all."""
    job = {
        "job_id": "job-1a2b3c",
        "purpose": purpose,
        "state": "running",
        "completed_items": 10,
        "failed_items": 0,
        "total_items": 100,
        "items_per_s": 1.5,
        "eta_s": 60.0,
        "project": "vision",
        "workers": 2,
        "handler": "eval",
    }
    text = _render(jobs_table([job]), 80)
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert purpose.replace(" ", "") in _column(text, "purpose", "Jobs").replace(" ", ""), text
    leases = _leases()
    leases["leases"][0]["purpose"] = purpose
    leases["queue"][0]["reason"] = f"{REASON} [{purpose}]"
    text = _render(broker_view([_gpu(GPU0, 0), _gpu(GPU1, 1)], leases), 80)
    assert purpose.replace(" ", "") in _column(text, "purpose", "Leases").replace(" ", ""), text
    queue_reason = _column(text, "reason", "Queue").replace(" ", "")
    assert f"[{purpose}]".replace(" ", "") in queue_reason, text
