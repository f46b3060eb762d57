"""The coordinator package's layout (issue 40): every room a folder, the package's root only
its door, and each table's SQLAlchemy Core table named once, in `db/tables.py`.

The door is what one reads first: `__init__` (the version), `__main__` (`python -m
rbroker_server`), `app.py` (the factory that assembles the app from the rooms) and
`settings.py` (the configuration the app and the command line are handed). Everything else
lives in a room (docs/architecture.md §1)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "server" / "rbroker_server"
TABLES = SERVER / "db" / "tables.py"

DOOR = frozenset({"__init__.py", "__main__.py", "app.py", "settings.py"})
"""The only modules at the package's root."""

ROOMS = frozenset(
    {"admin", "api", "auth", "cli", "db", "edge", "enroll", "fleet", "metrics", "reports"}
    | {"usage", "web", "webhooks"}
)
"""The package's folders: a new one is a new room, named here and in architecture.md §1."""


def strays(root: Path) -> list[str]:
    """What `root` holds beside the door and the rooms (a folder ends in `/`)."""
    found = []
    for path in sorted(root.iterdir()):
        if path.name == "__pycache__":
            continue
        if path.is_dir():
            # a folder of nothing but byte code is what a move leaves in a checkout
            if path.name not in ROOMS and any(path.rglob("*.py")):
                found.append(f"{path.name}/")
        elif path.name not in DOOR:
            found.append(path.name)
    return found


def table_reads(source: str) -> list[int]:
    """The lines of `source` that read a model's `__table__` (`X = Model.__table__`, with a
    type or an attribute as the target, inside a function, or through `getattr`)."""
    lines = set()
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and node.attr == "__table__") or (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and any(isinstance(a, ast.Constant) and a.value == "__table__" for a in node.args)
        ):
            lines.add(node.lineno)
    return sorted(lines)


def test_the_root_holds_only_the_door_and_the_rooms() -> None:
    assert strays(SERVER) == []
    assert {p.name for p in SERVER.iterdir() if p.is_dir()} >= ROOMS


def test_every_room_is_a_package_that_says_what_it_holds() -> None:
    for room in sorted(ROOMS):
        init = SERVER / room / "__init__.py"
        assert init.is_file(), f"{room}/ is not a package"
        assert ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), room


def test_only_db_tables_reads_a_models_table() -> None:
    found = {
        f"{path.relative_to(SERVER).as_posix()}:{line}"
        for path in sorted(SERVER.rglob("*.py"))
        if path != TABLES
        for line in table_reads(path.read_text(encoding="utf-8"))
    }
    assert found == set(), "import the table from rbroker_server.db.tables"
    assert len(table_reads(TABLES.read_text(encoding="utf-8"))) >= 11


def test_strays_finds_loose_modules_and_unknown_folders(tmp_path: Path) -> None:
    for name in (*DOOR, "cli.py", "notes.txt"):
        (tmp_path / name).write_text("")
    for name in ("db", "misc", "__pycache__", "moved"):
        (tmp_path / name).mkdir()
    (tmp_path / "misc" / "helpers.py").write_text("")
    (tmp_path / "moved" / "__pycache__").mkdir()  # what a move leaves: byte code only
    (tmp_path / "moved" / "__pycache__" / "env.cpython-311.pyc").write_bytes(b"")
    assert strays(tmp_path) == ["cli.py", "misc/", "notes.txt"]


@pytest.mark.parametrize(
    ("source", "lines"),
    [
        ("COMPUTERS = Computer.__table__  # type: ignore[attr-defined]\n", [1]),
        ("self.table: sa.Table = RateLimitHit.__table__\n", [1]),
        ("def prune():\n    t = models.RateLimitHit.__table__\n", [2]),
        ("rows = sa.select(Computer.__table__.c.id)\n", [1]),
        ("t = getattr(Computer, '__table__')\n", [1]),
        ("from rbroker_server.db.tables import COMPUTERS\nx = COMPUTERS.c.id\n", []),
        ('"""Not `Computer.__table__`."""\n# t = Computer.__table__\n', []),
        ("name = Computer.__tablename__\n", []),
    ],
)
def test_table_reads_catches_each_form(source: str, lines: list[int]) -> None:
    assert table_reads(source) == lines
