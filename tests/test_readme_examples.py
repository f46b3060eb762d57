"""Every Python and shell example in the README and the guides in docs/ (user guide, operator
guide, development) runs as written, against a real broker on a simulated GPU, or is marked in
the Markdown source as one that cannot run here:

    <!-- example: skip (needs PyTorch and an NVIDIA GPU) -->
    ```python
    ...

The marker is the line right before the opening fence and must give a reason. Skipped
Python blocks are still compiled and skipped shell blocks parsed (`bash -n`), so they stay
valid code; TOML blocks are loaded as simulation scenarios, the format they show. The same
holds for the code blocks of docs/architecture.md, which are compiled and parsed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from rbroker.gpu.scenario import parse_scenario
from tests.conftest import GPU0, BrokerProcess

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# where the README's text went: its examples are run wherever they now live
GUIDES = [
    README,
    *(ROOT / "docs" / f"{n}.md" for n in ("user-guide", "operator-guide", "development")),
]

PYTHON = ("python", "py")
SHELL = ("sh", "bash", "shell", "console")
OTHER_SHELLS = ("powershell", "pwsh", "bat", "cmd")
EXAMPLE_LANGS = PYTHON + SHELL + OTHER_SHELLS

_FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)\s*$")
_SKIP = re.compile(r"^<!-- example: skip \((?P<reason>[^)]+(?:\([^)]*\)[^)]*)*)\) -->$")


@dataclass(frozen=True)
class Block:
    """One fenced code block: its language, code, line number and skip reason (if any)."""

    path: Path
    lang: str
    code: str
    line: int
    skip: str | None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line} ({self.lang})"


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        assert i < len(lines), f"{path.name}:{start + 1}: unclosed code fence"
        previous = lines[start - 1].strip() if start > 0 else ""
        skip = _SKIP.match(previous)
        if previous.startswith("<!-- example") and skip is None:
            raise AssertionError(f"{path.name}:{start}: malformed example marker {previous!r}")
        out.append(
            Block(
                path, m.group(1).lower(), "\n".join(body) + "\n", start + 1, skip and skip["reason"]
            )
        )
        i += 1
    return out


GUIDE_BLOCKS = [b for path in GUIDES for b in blocks(path)]
RUNNABLE = [b for b in GUIDE_BLOCKS if b.lang in PYTHON + SHELL and b.skip is None]


def test_every_example_is_run_or_marked_with_a_reason() -> None:
    examples = [b for b in GUIDE_BLOCKS if b.lang in EXAMPLE_LANGS]
    assert len(examples) >= 10, "the guides' examples were not found"
    untagged = [b.where for b in GUIDE_BLOCKS if not b.lang]
    assert not untagged, f"code blocks without a language: {untagged}"
    for b in examples:
        if b.lang in OTHER_SHELLS:
            assert b.skip, f"{b.where}: cannot run here; mark it `<!-- example: skip (...) -->`"
    # what this test runs: the SDK, parallel jobs and `rbroker run` examples at least
    assert len(RUNNABLE) >= 3, [b.where for b in RUNNABLE]
    assert any("rbroker.job(" in b.code for b in RUNNABLE)
    assert any("rbroker.lease(" in b.code for b in RUNNABLE)
    assert any(b.code.startswith("rbroker run ") for b in RUNNABLE)


def _env(broker: BrokerProcess) -> dict[str, str]:
    env = dict(os.environ, RBROKER_SOCKET=broker.socket)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


@pytest.mark.slow
@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: f"{b.path.stem}-line{b.line}-{b.lang}")
def test_readme_example_runs(block: Block, broker: BrokerProcess, tmp_path: Path) -> None:
    if block.lang in PYTHON:
        script = tmp_path / "example.py"
        script.write_text(block.code)
        cmd = [sys.executable, str(script)]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", block.code]
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=_env(broker), capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, (
        f"{block.where} failed ({proc.returncode})\n--- code\n{block.code}"
        f"--- stdout\n{proc.stdout}--- stderr\n{proc.stderr}--- broker\n{broker.log()[-3000:]}"
    )
    if "rbroker.lease(" in block.code:
        assert GPU0 in proc.stdout, f"{block.where}: no granted GPU in its output:\n{proc.stdout}"
    if block.code.startswith("rbroker run "):
        # the granted GPU (the simulated GPU0, NVML index 0) by index, in PCI bus order
        assert proc.stdout.split() == ["0", "PCI_BUS_ID"], f"{block.where}: {proc.stdout}"


@pytest.mark.parametrize("path", [*GUIDES, ARCHITECTURE], ids=lambda p: p.name)
def test_every_code_block_is_valid(path: Path) -> None:
    for b in blocks(path):
        if b.lang in PYTHON:
            compile(b.code, b.where, "exec")
        elif b.lang in SHELL:
            proc = subprocess.run(["bash", "-n", "-c", b.code], capture_output=True, text=True)
            assert proc.returncode == 0, f"{b.where}: {proc.stderr}"
        elif b.lang == "toml":
            gpus = parse_scenario(textwrap.dedent(b.code))
            assert gpus, b.where


def test_test_paths_and_markers_the_readme_names_exist() -> None:
    text = "\n".join(path.read_text(encoding="utf-8") for path in GUIDES)
    paths = set(re.findall(r"\btests/[\w/]+\.py\b", text))
    assert paths, "the README and the guides name no test files"
    missing = sorted(p for p in paths if not (ROOT / p).is_file())
    assert not missing, f"the README or a guide names test files that do not exist: {missing}"
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    for marker in set(re.findall(r'-m "not (\w+)"', text)) | {"slow", "gpu"}:
        assert f'"{marker}:' in pyproject, f"marker {marker} is not declared in pyproject.toml"


_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings (outside code fences)."""
    anchors: set[str] = set()
    count: dict[str, int] = {}
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"^#{1,6} (.+)$", line)
        if m:
            anchor = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = count.get(anchor, 0)
            count[anchor] = n + 1
            anchors.add(f"{anchor}-{n}" if n else anchor)  # a repeated heading: -1, -2, …
    return anchors


@pytest.mark.parametrize(
    "path", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name
)
def test_every_link_between_the_documents_resolves(path: Path) -> None:
    """The README is a front door to docs/: each relative link names a file of this
    repository, and each `#anchor` a heading of the file it points at."""
    text = path.read_text(encoding="utf-8")
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue  # https://, mailto:
        file, _, anchor = target.partition("#")
        where = (path.parent / file).resolve() if file else path
        if not where.is_relative_to(ROOT) or not where.exists():
            broken.append(target)  # a file outside the repository, or none
        elif anchor and where.suffix == ".md" and anchor not in _anchors(where):
            broken.append(target)  # no such heading there
    assert not broken, f"{path.name}: links that lead nowhere: {broken}"
