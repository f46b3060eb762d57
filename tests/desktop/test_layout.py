"""The package layout stays easy to hold (issues 11, 30 and 40): the broker is reached only
through the methods of its one façade, imports run one way (no import circle between
modules, no arrow from a lower room to a higher one), every room is a folder and every
module sits in its room's (the package top holds the SDK alone), every module says what it
is for, and the embedded coordinator and the demo world are started in one place each.

Module sizes are not capped: a cohesive owner may be long (issue 30)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.desktop.test_import_boundaries import PACKAGES, imported_modules

ROOT = Path(__file__).resolve().parents[2]
DESKTOP = ROOT / "desktop" / "rbroker"
FACADE = DESKTOP / "broker" / "service.py"

SDK: tuple[str, ...] = (
    "rbroker",
    "rbroker._lease",
    "rbroker._lease_record",
    "rbroker._job",
    "rbroker._booking",
    "rbroker._frameworks",
)
"""The SDK, the only modules at the package top (`rbroker` is its `__init__`) but the command
line's door, `rbroker.__main__` (`python -m rbroker`)."""

ROOMS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("protocol", ("rbroker_protocol",)),
    ("base", ("rbroker.base",)),
    ("transport", ("rbroker.transport",)),
    ("client", ("rbroker.client",)),
    ("gpu", ("rbroker.gpu",)),
    ("broker", ("rbroker.broker",)),
    ("localapi", ("rbroker.localapi",)),
    ("sdk", SDK),
    ("uplink", ("rbroker.uplink",)),
    ("hosting", ("rbroker.hosting",)),
    ("demo", ("rbroker.demo",)),
    ("tray", ("rbroker.tray",)),
    ("cli", ("rbroker.cli", "rbroker.__main__")),
)
"""The rooms of the desktop package, lowest first: a module imports only from its own room
or a lower one (docs/architecture.md §1). Every room but the SDK is a folder (`rbroker.X`:
`desktop/rbroker/X/`, and the protocol `shared/rbroker_protocol/`); the SDK and the command
line's `__main__` are named module by module, the files at the package top."""

BACK_ARROWS_FOR_NOW: set[tuple[str, str]] = set()
"""Imports from a lower room to a higher one not yet undone (issue 30; this set only shrinks)."""

CIRCLES_FOR_NOW: set[frozenset[str]] = set()
"""Import circles not yet undone (issue 30; this set only shrinks)."""


# -- the façade ------------------------------------------------------------------------------
def _facade() -> tuple[set[str], set[str]]:
    """`(fields, methods)` of `Broker`: the names `__init__` assigns on `self`, and the
    names of its methods and properties."""
    tree = ast.parse(FACADE.read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Broker")
    methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    fields = {
        t.attr
        for node in ast.walk(init)
        for t in (node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)])
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }
    return fields, methods


SETTINGS = "config"
"""The one field read from outside: the broker's settings (a frozen value), never chained."""


def _is_broker(node: ast.expr) -> bool:
    """`broker`, `_broker`, `x.broker`, `self.broker`: what names a `Broker` outside it."""
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    return name in ("broker", "_broker")


def reaches_into(source: str, fields: set[str], methods: set[str]) -> Iterator[tuple[int, str]]:
    """`(line, expression)` for every access to a broker's part from `source`: a field other
    than its settings, a private name, or anything chained after `broker.<field>.`."""
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not _is_broker(node.value):
            continue
        attr = node.attr
        if attr in methods and not attr.startswith("_"):
            continue
        if attr == SETTINGS:
            continue
        if attr in fields or attr.startswith("_"):
            yield node.lineno, ast.unparse(node)
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and _is_broker(node.value.value)
            and node.value.attr in fields
        ):
            yield node.lineno, ast.unparse(node)


def test_nothing_outside_the_broker_reaches_into_its_parts() -> None:
    fields, methods = _facade()
    assert {"jobs", "fake", "waiting", "slots", "lessor", "leases", "config"} <= fields
    assert {"begin_acquire", "release", "gpus_view", "set_paused", "declare_job"} <= methods
    found = []
    for path in sorted(DESKTOP.rglob("*.py")):
        if path.is_relative_to(DESKTOP / "broker"):
            continue
        for line, expr in reaches_into(path.read_text(encoding="utf-8"), fields, methods):
            found.append(f"{path.relative_to(ROOT)}:{line}: {expr}")
    assert found == [], "\n".join(found)


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ("self.broker.jobs.get(x)", True),
        ("broker.fake.allocate(u, p, 1)", True),
        ("for w in broker.waiting.ahead(): pass", True),
        ("n = len(broker.slots)", True),
        ("broker._admit()", True),
        ("host.broker.leases", True),
        ("self.broker.config.admin_group", True),
        ("cfg = self.broker.config", False),
        ("self.broker.gpus_view()", False),
        ("broker.set_paused(True)", False),
        ("self.broker.error", False),  # not a Broker's field (the demo's embedded broker)
    ],
)
def test_the_reach_check_catches_what_it_should(source: str, caught: bool) -> None:
    fields, methods = _facade()
    assert bool(list(reaches_into(source, fields, methods))) is caught


# -- the import graph ------------------------------------------------------------------------
def _module_name(package: str, root: Path, path: Path) -> str:
    parts = [package, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """Every module of the three packages → the modules of the three it imports: at the top,
    inside functions and under `TYPE_CHECKING` alike (`from pkg import sub` counts as an
    import of `pkg.sub` only)."""
    paths = {
        _module_name(package, root, path): path
        for package, root in PACKAGES.items()
        for path in sorted(root.rglob("*.py"))
    }
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        source = path.read_text(encoding="utf-8")
        found = imported_modules(source, module, path.name == "__init__.py", known=paths.keys())
        graph[module] = {n for _, n in found if n in paths and n != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The import circles of `graph`: its strongly connected parts of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:  # Tarjan's
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.add(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(frozenset(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def room_of(module: str) -> int | None:
    """The rank of `module`'s room in `ROOMS` (None: not a desktop or protocol module)."""
    best: tuple[int, int] | None = None
    for rank, (_, prefixes) in enumerate(ROOMS):
        for prefix in prefixes:
            inside = module == prefix or (prefix != "rbroker" and module.startswith(prefix + "."))
            if inside and (best is None or len(prefix) > best[1]):
                best = (rank, len(prefix))
    return None if best is None else best[0]


def test_no_import_circle_between_modules() -> None:
    found = set(circles(import_graph()))
    assert found - CIRCLES_FOR_NOW == set(), "new import circles"
    assert CIRCLES_FOR_NOW - found == set(), "undone: take them off CIRCLES_FOR_NOW"


def test_no_arrow_from_a_lower_room_to_a_higher_one() -> None:
    graph = import_graph()
    unplaced = sorted(m for m in graph if m.startswith("rbroker.") and room_of(m) is None)
    assert unplaced == [], "modules in no room of ROOMS"
    back = set()
    for module, imported in graph.items():
        here = room_of(module)
        for name in imported:
            there = room_of(name)
            if here is not None and there is not None and there > here:
                back.add((module, name))
    assert back - BACK_ARROWS_FOR_NOW == set(), "imports from a lower room to a higher one"
    assert BACK_ARROWS_FOR_NOW - back == set(), "undone: take them off BACK_ARROWS_FOR_NOW"


def test_the_graph_checks_are_not_vacuous() -> None:
    graph = import_graph()
    assert "rbroker.broker.service" in graph["rbroker.localapi.server"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    assert room_of("rbroker") == room_of("rbroker._lease") != room_of("rbroker.tray.app")
    assert room_of("rbroker.gpu.nvml") < room_of("rbroker.broker.service")  # type: ignore[operator]


# -- every room a folder ---------------------------------------------------------------------
AT_THE_TOP = (*SDK, "rbroker.__main__")
"""The modules ROOMS may name one by one: the files at the package top."""


def room_by_place(path: str) -> str | None:
    """The room a file of `desktop/rbroker/` sits in by its place (`path` under it,
    `/`-separated): a file at the top is the module ROOMS names exactly (the SDK, or the
    command line's `__main__`); a file in a folder (at any depth) is in the room whose prefix
    is that folder. None: misplaced (a file at the top that is no SDK module, or a folder that
    is no room)."""
    parts = path.removesuffix(".py").split("/")
    if len(parts) == 1:
        module = "rbroker" if parts[0] == "__init__" else f"rbroker.{parts[0]}"
        if module not in AT_THE_TOP:
            return None
    else:
        module = f"rbroker.{parts[0]}"
    for name, prefixes in ROOMS:
        if module in prefixes:
            return name
    return None


def test_every_room_is_a_folder_and_the_top_holds_the_sdk() -> None:
    """Each room's prefix is one folder of `desktop/rbroker/` (a package), the SDK's modules
    and `__main__` aside, and no two rooms name the same place."""
    named = [p for _, prefixes in ROOMS for p in prefixes]
    assert len(named) == len(set(named)), "a place in two rooms"
    for name, prefixes in ROOMS:
        for prefix in prefixes:
            if name == "protocol":
                assert (ROOT / "shared" / prefix / "__init__.py").is_file()
            elif prefix in AT_THE_TOP:
                module = "__init__" if prefix == "rbroker" else prefix.split(".")[1]
                assert (DESKTOP / f"{module}.py").is_file(), prefix
            else:
                folder = prefix.removeprefix("rbroker.")
                assert "." not in folder, f"{prefix}: a room is a whole folder"
                assert (DESKTOP / folder / "__init__.py").is_file(), f"{prefix}: no such folder"


def test_every_module_sits_in_its_rooms_folder() -> None:
    """Issue 40: a module's folder is its room (`room_by_place`), and the room its place says
    is the one the import checks give it (`room_of`)."""
    misplaced = []
    for path in sorted(DESKTOP.rglob("*.py")):
        rel = path.relative_to(DESKTOP).as_posix()
        module = _module_name("rbroker", DESKTOP, path)
        room = room_by_place(rel)
        if room is None:
            misplaced.append(f"desktop/rbroker/{rel}: in no room's folder")
        elif room_of(module) != [n for n, _ in ROOMS].index(room):
            misplaced.append(f"desktop/rbroker/{rel}: its place says {room}, ROOMS another")
    assert misplaced == []


@pytest.mark.parametrize(
    ("path", "room"),
    [
        ("__init__.py", "sdk"),
        ("_lease.py", "sdk"),
        ("_frameworks.py", "sdk"),
        ("__main__.py", "cli"),
        ("base/display.py", "base"),
        ("base/__init__.py", "base"),
        ("hosting/host.py", "hosting"),
        ("hosting/service_windows.py", "hosting"),
        ("broker/deeper/part.py", "broker"),
        ("startup.py", None),  # a base module back at the top
        ("host.py", None),  # hosting's
        ("_exceptions.py", None),
        ("base.py", None),  # a room's name, but a file at the top
        ("helpers/util.py", None),  # a folder that is no room
        ("sdk/lease.py", None),  # the SDK is named module by module, not a folder
    ],
)
def test_the_place_check_catches_what_it_should(path: str, room: str | None) -> None:
    assert room_by_place(path) == room


# -- what every module says, and where things start -----------------------------------------
def test_every_broker_and_demo_module_has_a_docstring() -> None:
    missing = [
        p.relative_to(ROOT).as_posix()
        for folder in (DESKTOP / "broker", DESKTOP / "demo")
        for p in sorted(folder.glob("*.py"))
        if p.name != "__init__.py" or p.parent.name == "demo"
        if not ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")))
    ]
    assert missing == []


def _files_running(needle: str) -> set[str]:
    """Source files (desktop, tests, bench) that contain `needle` as a string literal."""
    found = set()
    for folder in (DESKTOP, ROOT / "tests", ROOT / "bench"):
        for p in folder.rglob("*.py"):
            if p == Path(__file__).resolve():
                continue
            tree = ast.parse(p.read_text(encoding="utf-8"))
            if any(isinstance(n, ast.Constant) and n.value == needle for n in ast.walk(tree)):
                found.add(p.relative_to(ROOT).as_posix())
    return found


def test_the_coordinator_is_served_from_one_place() -> None:
    """`rbroker_server serve` is started by the one helper (plus the server's own tests,
    which run it directly on purpose: tests/server, and the coordinator's tests on Windows,
    tests/windows/test_*server*.py, which serve it under Wine or start a second one)."""
    starters = {
        p
        for p in _files_running("serve")
        if not p.startswith("tests/server/")
        and not (p.startswith("tests/windows/test_") and "server" in p)
    }
    assert starters == {"desktop/rbroker/demo/coordinator.py"}, starters


def test_demo_workers_are_started_from_one_place() -> None:
    assert _files_running("rbroker.demo.worker") == {"desktop/rbroker/demo/processes.py"}


CLIENT = DESKTOP / "client" / "local.py"


def _named_calls(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """`x.call("method", ...)` / `x.call_nowait("method", ...)`: (line, method name)."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("call", "call_nowait")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def test_the_local_api_is_called_through_the_typed_client_only() -> None:
    """Issue 40: the SDK, the command line and the tray reach each local-API method through
    its typed method on `rbroker.client.local.Client` (`acquire`, `release`, `jobs_list`,
    `pause`, ...), never by its name as a string: the method's name, parameters and result
    type are written in one place."""
    found = [
        f"{path.relative_to(ROOT)}:{line}: {method}"
        for path in sorted(DESKTOP.rglob("*.py"))
        if path != CLIENT
        for line, method in _named_calls(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert found == []


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ('client.call("lease.release", lease_id=x)', True),
        ('self._client.call_nowait("lease.renew")', True),
        ("client.release(x)", False),
        ("call(method)", False),
    ],
)
def test_the_named_call_check_catches_what_it_should(source: str, caught: bool) -> None:
    assert bool(list(_named_calls(ast.parse(source)))) is caught


FACES = (DESKTOP / "cli", DESKTOP / "tray")
"""The command line and the tray: what a person reads the broker and the fleet through."""

UNTYPED_FOR_A_REASON: dict[tuple[str, str], str] = {}
"""`dict[str, Any]` annotations in the faces that stay, by file (under `desktop/rbroker`)
and place, with why."""


def _is_any(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "Any") or (
        isinstance(node, ast.Attribute) and node.attr == "Any"
    )


def _untyped_dicts(annotation: ast.expr) -> Iterator[ast.expr]:
    """The `dict[str, Any]` (or `typing.Dict[str, Any]`) inside one annotation, a quoted
    one included."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return
    for node in ast.walk(annotation):
        if (
            isinstance(node, ast.Subscript)
            and (
                (isinstance(node.value, ast.Name) and node.value.id in ("dict", "Dict"))
                or (isinstance(node.value, ast.Attribute) and node.value.attr == "Dict")
            )
            and isinstance(node.slice, ast.Tuple)
            and len(node.slice.elts) == 2
            and isinstance(node.slice.elts[0], ast.Name)
            and node.slice.elts[0].id == "str"
            and _is_any(node.slice.elts[1])
        ):
            yield node


def untyped_dict_annotations(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every `dict[str, Any]` in an annotation (a parameter's, a return's, a variable's or an
    attribute's): (line, place), the place as `Class.function(parameter)`,
    `Class.function() ->` or `Class.attribute`."""

    def visit(node: ast.AST, scope: str) -> Iterator[tuple[int, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                yield from visit(child, f"{scope}{child.name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{scope}{child.name}"
                a = child.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
                for arg in params:
                    if arg is not None and arg.annotation is not None:
                        for hit in _untyped_dicts(arg.annotation):
                            yield hit.lineno, f"{name}({arg.arg})"
                if child.returns is not None:
                    for hit in _untyped_dicts(child.returns):
                        yield hit.lineno, f"{name}() ->"
                yield from visit(child, f"{name}.")
            elif isinstance(child, ast.AnnAssign):
                target = ast.unparse(child.target)
                for hit in _untyped_dicts(child.annotation):
                    yield hit.lineno, f"{scope}{target}"
            else:
                yield from visit(child, scope)

    yield from visit(tree, "")


def test_the_faces_name_the_shapes_they_read() -> None:
    """Issue 40: the command line and the tray hold what the local API and the coordinator
    answer as its type (`rbroker_protocol.results`' TypedDicts, the fleet's models or the
    tray's mirrors of them), never as `dict[str, Any]`; the few that stay are named in
    `UNTYPED_FOR_A_REASON` with why."""
    found: dict[tuple[str, str], int] = {}
    for face in FACES:
        for path in sorted(face.rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for line, place in untyped_dict_annotations(tree):
                found.setdefault((path.relative_to(DESKTOP).as_posix(), place), line)
    unexplained = [
        f"{f}:{line}: {place}"
        for (f, place), line in found.items()
        if (f, place) not in UNTYPED_FOR_A_REASON
    ]
    assert unexplained == []
    assert set(UNTYPED_FOR_A_REASON) <= set(found), "an allowed exception is gone: drop it"


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ("def f(x: dict[str, Any]) -> None: ...", "f(x)"),
        ("def f() -> dict[str, Any]: ...", "f() ->"),
        ("def f(*rows: dict[str, Any], **kw: int) -> None: ...", "f(rows)"),
        ("class C:\n    def m(self, *, x: list[dict[str, Any]] | None) -> None: ...", "C.m(x)"),
        ("class C:\n    rows: dict[str, Any] = {}", "C.rows"),
        ("def f() -> None:\n    self.gpu: dict[str, Any] = {}", "f.self.gpu"),
        ('def f(x: "dict[str, Any]") -> None: ...', "f(x)"),
        ("x: typing.Dict[str, typing.Any] = {}", "x"),
        ("def f(x: Callable[[dict[str, Any]], str]) -> None: ...", "f(x)"),
        ("def f(x: dict[str, object]) -> None: ...", None),
        ("def f(x: Mapping[str, Any]) -> None: ...", None),
        ("def f(x: dict[str, int]) -> None: ...", None),
        ("def f(x: GpuView) -> Sequence[ListedLease]: ...", None),
        ("y = cast(dict[str, Any], x)", None),
    ],
)
def test_the_untyped_dict_check_catches_what_it_should(source: str, caught: str | None) -> None:
    found = [place for _, place in untyped_dict_annotations(ast.parse(source))]
    assert found == ([caught] if caught else [])


# -- the broker's tests mirror its modules (issue 40) ----------------------------------------
BROKER = DESKTOP / "broker"
BROKER_TESTS = ROOT / "tests" / "desktop" / "broker"

MODULES_WITH_RULES = (
    "admission",
    "audit",
    "bookings",
    "capacity",
    "config",
    "eta",
    "fairness",
    "holders",
    "idle",
    "jobs",
    "launchers",
    "lessor",
    "listing",
    "members",
    "overgrant",
    "own_leases",
    "project_names",
    "reclaim",
    "resize",
    "restore",
    "sampling",
    "service",
    "shares",
    "store",
)
"""The broker's modules whose rules have tests of their own: `test_<module>.py` beside the
others in tests/desktop/broker/, or the folder `<module>/` where there are several files."""

TESTED_THROUGH: dict[str, str] = {
    "clock": "service/test_clocks_and_stalls.py (expiry on the monotonic clock, sleep gaps)",
    "events": "the bus; its events are asserted where they are sent (test_overgrant.py, jobs/)",
    "leases": "the lessor's records: lessor/",
    "lifetimes": "test_eta.py (the lifetimes the estimate reads)",
    "read_model": "test_eta.py and test_listing.py (queue entries, places, what a list holds)",
    "simulation": "the `sim.*` methods the broker-process tests use as props",
    "ticks": "lessor/test_crash_release.py, service/test_clocks_and_stalls.py",
    "waiting": "admission/ (the FIFO queue: test_placement_and_queue.py, test_queue_behind.py)",
    "waiting_news": "admission/test_queue_behind.py (`notify_waiting`)",
}
"""The broker's other modules, each with where its behaviour is tested: a module with rules
of its own moves to `MODULES_WITH_RULES` with its tests."""


def broker_test_place(rel: str, modules: tuple[str, ...]) -> str | None:
    """The module whose tests the file at `rel` (a path under tests/desktop/broker/) holds:
    `test_<module>.py` at the top, or any file in the folder `<module>/`; None for a file in
    no such place. The packages' `__init__.py` belong to their folder ("" at the top)."""
    parts = rel.split("/")
    if parts == ["__init__.py"]:
        return ""
    if len(parts) == 1:
        stem = parts[0].removesuffix(".py")
        module = stem.removeprefix("test_")
        return module if stem != module and module in modules else None
    if len(parts) == 2 and parts[0] in modules:
        return parts[0]
    return None


def test_every_broker_module_is_either_tested_beside_its_name_or_says_where() -> None:
    modules = {p.stem for p in BROKER.glob("*.py") if p.name != "__init__.py"}
    assert not set(MODULES_WITH_RULES) & set(TESTED_THROUGH)
    assert modules == set(MODULES_WITH_RULES) | set(TESTED_THROUGH)


def test_the_broker_tests_mirror_the_broker_modules() -> None:
    """Issue 40: a newcomer finds a broker module's tests from its name, `lessor.py`'s in
    tests/desktop/broker/lessor/ (or `test_lessor.py`): every module with rules has its tests
    in exactly one such place, and no test file sits anywhere else."""
    files = sorted(
        p.relative_to(BROKER_TESTS).as_posix()
        for p in BROKER_TESTS.rglob("*.py")
        if "__pycache__" not in p.parts
    )
    placed = {rel: broker_test_place(rel, MODULES_WITH_RULES) for rel in files}
    assert [rel for rel, module in placed.items() if module is None] == []
    for module in MODULES_WITH_RULES:
        single = (BROKER_TESTS / f"test_{module}.py").is_file()
        folder = any(
            rel.startswith(f"{module}/test_") for rel, found in placed.items() if found == module
        )
        assert single != folder, f"{module}: tests in one place, test_{module}.py or {module}/"
        if folder:
            assert (BROKER_TESTS / module / "__init__.py").is_file(), f"{module}/ is a package"


@pytest.mark.parametrize(
    ("rel", "module"),
    [
        ("__init__.py", ""),
        ("test_lessor.py", "lessor"),
        ("lessor/__init__.py", "lessor"),
        ("lessor/test_release_rule.py", "lessor"),
        ("test_release_rule.py", None),
        ("test_waiting.py", None),
        ("lessor.py", None),
        ("waiting/test_queue.py", None),
        ("lessor/more/test_release_rule.py", None),
        ("test_.py", None),
    ],
)
def test_the_broker_test_place_check_catches_a_misplaced_file(rel: str, module: str | None) -> None:
    assert broker_test_place(rel, ("admission", "lessor")) == module
