"""Shares per project (`[shares]`, `rbroker.broker.shares`): the order of the queue by each
project's use against its weight, FIFO within a project, never admitting what does not fit,
and no project with a share waiting for ever once the leases ahead end. On the in-process
broker with a manual clock; the property test drives random arrivals and releases. One
contract test runs a real broker process with `--config` and reads `rbroker status`."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from rbroker.broker.config import BrokerConfig, read_config
from rbroker.broker.holders import Holder
from rbroker.broker.leases import Lease
from rbroker.broker.shares import Shares
from rbroker.cli.main import main
from rbroker.cli.views import print_view, shares_table
from rbroker_protocol.startup import EXIT_USAGE
from tests.conftest import SINGLE_24G, BrokerProcess, wait_until
from tests.desktop.inprocess import InProcessBroker, SleeperPool

USABLE_MIB = 24576 - 1229  # SINGLE_24G less its default headroom


@dataclass(eq=False)
class Req:
    project: str


def test_turns_serve_the_project_using_least_against_its_weight_fifo_within() -> None:
    shares = Shares({"a": 1, "b": 3})
    queue = [Req("a"), Req("a"), Req("b"), Req("c")]
    use = {"a": 1000, "b": 2000, "c": 0}
    taken = []
    for item in shares.turns(queue, use):  # each grant raises its project's use
        taken.append(next(i for i, q in enumerate(queue) if q is item))
        use[item.project] += 5000
    # c (0) first; then b (2000/3) before a (1000/1); then a's two in arrival order
    assert taken == [3, 2, 0, 1]
    assert list(Shares().turns(queue, use)) == queue  # no [shares]: FIFO
    assert Shares({"*": 2}).weight("x") == 2 and Shares({"a": 1}).weight("x") == 1


def _reference_turns(shares: Shares, queue: list[Req], use: dict[str, int]) -> Iterator[Req]:
    """The rule of `Shares.turns` as written in its docstring, choosing afresh each time."""
    left = list(enumerate(queue))
    while left:
        _, first = min(
            left, key=lambda t: (use.get(t[1].project, 0) / shares.weight(t[1].project), t[0])
        )
        left = [t for t in left if t[1] is not first]
        yield first


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from("abcde"), max_size=30),
    st.dictionaries(st.sampled_from("abcde*"), st.integers(1, 4), max_size=4),
    st.dictionaries(st.sampled_from("abcde"), st.integers(0, 30_000), max_size=5),
    st.lists(st.integers(0, 9_000), min_size=30, max_size=30),
)
def test_turns_take_the_order_their_rule_says_while_grants_raise_the_use(
    projects: list[str], weights: dict[str, int], use: dict[str, int], grants: list[int]
) -> None:
    shares = Shares(weights or {"*": 1})
    queue = [Req(p) for p in projects]
    orders = []
    for turns in (shares.turns, lambda q, u: _reference_turns(shares, q, u)):
        now = dict(use)
        taken = []
        for n, item in enumerate(turns(queue, now)):
            taken.append(next(i for i, q in enumerate(queue) if q is item))
            now[item.project] = now.get(item.project, 0) + grants[n]  # 0: not granted
        orders.append(taken)
    assert orders[0] == orders[1]
    assert sorted(orders[0]) == list(range(len(queue)))


class _CountingUse(dict[str, int]):
    reads = 0

    def get(self, key, default=None):  # type: ignore[no-untyped-def,override]
        self.reads += 1
        return super().get(key, default)


def test_a_pass_over_many_projects_reads_each_use_a_bounded_number_of_times() -> None:
    # one user may keep 1 024 requests waiting, each of its own project: choosing the
    # lowest project afresh for each request read every project's use each time (N × P)
    queue = [Req(f"p{i}") for i in range(400)]
    use = _CountingUse()
    assert len(list(Shares({"*": 1}).turns(queue, use))) == 400
    assert use.reads <= 3 * len(queue)


@pytest.mark.parametrize("weights", [{"a": 0}, {"a": -1}, {"a": float("inf")}, {"a": "x"}, {"": 1}])
def test_a_bad_weight_is_refused_with_its_name(weights: dict[str, object], tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=r"\[shares\]"):
        BrokerConfig(socket_path=tmp_path / "s", data_dir=tmp_path, shares=weights)  # type: ignore[arg-type]


def test_the_project_using_less_goes_first_and_status_shows_shares(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    h = make_inprocess(SINGLE_24G, persist=False, shares={"vision": 1, "nlp": 1})
    held = h.acquire(pool.spawn()[1], mib=12000, project="vision").result()
    filler = h.acquire(pool.spawn()[1], mib=10000, project="other").result()
    first = h.acquire(pool.spawn()[1], mib=8000, wait_s=60, project="vision")
    second = h.acquire(pool.spawn()[1], mib=8000, wait_s=60, project="nlp")
    queue = h.broker.leases_view()["queue"]
    assert [q["project"] for q in queue] == ["nlp", "vision"]  # nlp uses 0, vision 12 000
    assert [q["ahead"] for q in queue] == [0, 1]
    rows = {r["project"]: r for r in h.broker.status()["shares"]}
    assert rows["vision"]["granted_mib"] == 12000 and rows["nlp"]["waiting"] == 1
    assert rows["other"]["weight"] == 1 and rows["vision"]["share"] == pytest.approx(
        1 / 3, abs=0.001
    )
    h.broker.release(filler.lease_id, "tester")
    h.sample()
    assert second.done() and not first.done()  # FIFO would have granted vision's
    h.broker.release(held.lease_id, "tester")
    h.sample()
    assert first.done() and first.exception() is None


def test_a_real_broker_reads_shares_from_its_config_and_status_prints_them(
    broker_factory: Callable[..., BrokerProcess],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = tmp_path / "shares.toml"
    config.write_text('[shares]\nvision = 3\n"*" = 1\n')
    bp = broker_factory(SINGLE_24G, extra_args=["--config", str(config)])
    with bp.client() as vision, bp.client() as nlp:  # each lease bound to its connection
        vision.call("lease.acquire", mib=6000, project="vision", session="s", purpose="p")
        nlp.call("lease.acquire", mib=2000, project="nlp", session="s", purpose="p")
        capsys.readouterr()
        assert main(["status", "--socket", bp.socket]) == 0
        out = capsys.readouterr().out
    lines = [" ".join(line.split()) for line in out.splitlines()]
    at = lines.index("Shares")  # after the leases' table, plain rows (stdout is not a terminal)
    assert lines[at + 1 : at + 5] == [
        "project weight share granted MiB waiting",
        "vision 3 75 % 6000 0",
        "nlp 1 25 % 2000 0",
        "other projects 1 — 0 0",
    ], out
    wait_until(lambda: "listening on" in bp.log())  # its start-up lines are written
    assert "  queue order by [shares]: vision 3, others 1\n" in bp.log(), bp.log()


# -- the property: random arrivals and releases --------------------------------------------


@pytest.fixture(scope="module")
def holders() -> Iterator[list[Holder]]:
    """Twelve holder processes shared by the examples (each request gets its own, so no
    request waits on its own holder's leases)."""
    pool = SleeperPool()
    yield [pool.spawn()[1] for _ in range(12)]
    pool.close()


PROJECTS = ("a", "b", "c")
steps = st.lists(
    st.one_of(
        st.tuples(st.just("ask"), st.sampled_from(PROJECTS), st.integers(1, 12)),
        st.tuples(st.just("end"), st.integers(0, 11), st.just(0)),
    ),
    min_size=1,
    max_size=12,
)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    weights=st.dictionaries(st.sampled_from(PROJECTS), st.integers(1, 4), min_size=1),
    script=steps,
)
def test_by_shares_nothing_over_admits_and_every_waiter_is_served(
    tmp_path_factory: pytest.TempPathFactory,
    holders: list[Holder],
    weights: dict[str, int],
    script: list[tuple[str, str | int, int]],
) -> None:
    data_dir = tmp_path_factory.mktemp("shares")
    scenario = data_dir / "scenario.toml"
    scenario.write_text(SINGLE_24G)
    h = InProcessBroker(scenario, data_dir, persist=False, shares=weights)
    try:
        tasks: list[tuple[str, asyncio.Task[Lease]]] = []  # (project, task), arrival order
        free = list(holders)
        for kind, arg, size in script:
            if kind == "ask" and free:
                mib = size * 2000  # 2 000 .. 24 000: some wait, some never fit (refused)
                task = h.acquire(free.pop(), mib=mib, wait_s=3600, project=arg)  # type: ignore[arg-type]
                tasks.append((str(arg), task))
            elif kind == "end" and h.broker.leases:
                lease = list(h.broker.leases.values())[int(arg) % len(h.broker.leases)]
                h.broker.release(lease.lease_id, "tester")
            h.sample()
            check(h, tasks)
        for _ in range(len(tasks) + 1):  # the leases end: every waiter is served in turn
            for lease in list(h.broker.leases.values()):
                h.broker.release(lease.lease_id, "tester")
            h.sample()
            check(h, tasks)
        assert not h.broker.queue, "a waiting request was never served"
    finally:
        h.close()


def check(h: InProcessBroker, tasks: list[tuple[str, asyncio.Task[Lease]]]) -> None:
    """Never over-admitted; within a project none granted while an earlier one waits."""
    assert sum(x.granted_mib for x in h.broker.leases.values()) <= USABLE_MIB
    waiting: set[str] = set()
    for project, task in tasks:
        if task.done() and task.exception() is None:
            assert project not in waiting, f"granted before an earlier request of {project}"
        elif not task.done():
            waiting.add(project)


def test_the_config_file_gives_shares_and_a_bad_one_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "broker.toml"
    good.write_text('[shares]\nvision = 3\nnlp = 1\n"*" = 0.5\n')
    assert read_config(good).shares == {"vision": 3.0, "nlp": 1.0, "*": 0.5}
    for text, words in (
        ("[shares]\nvision = 0\n", "the weight of 'vision' must be over 0"),
        ("[share]\nvision = 1\n", "unknown setting 'share'"),
        ("[shares\n", "not TOML"),
    ):
        good.write_text(text)
        with pytest.raises(ValueError, match=words):
            read_config(good)
    # `rbroker broker` reads it from its data dir and says what is wrong in one line
    code = main(["broker", "--simulate", "--data-dir", str(tmp_path), "--socket", "x.sock"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and err.count("\n") == 1 and "not TOML" in err, err
    assert main(["broker", "--config", str(tmp_path / "none.toml")]) == EXIT_USAGE
    assert "cannot be read" in capsys.readouterr().err


def test_rbroker_status_shows_each_projects_share_and_use(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    h = make_inprocess(SINGLE_24G, persist=False, shares={"vision": 3, "*": 1})
    h.acquire(pool.spawn()[1], mib=6000, project="vision").result()
    h.acquire(pool.spawn()[1], mib=2000, project="nlp").result()
    console = Console(file=io.StringIO(), width=80, record=True, force_terminal=True)
    print_view(console, shares_table(h.broker.status()["shares"]))
    lines = [" ".join(line.split()) for line in console.export_text().splitlines()]
    assert "vision 3 75 % 6 000 0" in lines and "nlp 1 25 % 2 000 0" in lines, lines
    assert "other projects 1 — 0 0" in lines, lines
    # `rbroker broker` says at start-up that the queue goes by shares, with the weights
    assert h.broker.queue_order() == "by [shares]: vision 3, others 1"


@pytest.mark.parametrize(("bypass_s", "granted_by_s"), [(10.0, 11), (0.0, 1), (1e9, None)])
def test_a_stream_of_small_requests_passes_a_large_one_only_until_the_bypass_bound(
    make_inprocess: Callable[..., InProcessBroker],
    pool: SleeperPool,
    bypass_s: float,
    granted_by_s: int | None,
) -> None:
    """`big` uses more of its share than `small`, so by shares alone each new small request
    goes before big's 10 000 MiB and takes the room a small lease's end frees: big would
    wait for ever (27 s where FIFO took 3 s, before). Past `max_share_bypass_s` it is served
    in arrival order and the next room is its own; with a bound of 0 it is FIFO."""
    h = make_inprocess(
        SINGLE_24G,
        persist=False,
        shares={"big": 1, "small": 1},
        max_share_bypass_s=bypass_s,
    )
    h.acquire(pool.spawn()[1], mib=12000, project="big").result()
    small = h.acquire(pool.spawn()[1], mib=6000, project="small").result()
    big = h.acquire(pool.spawn()[1], mib=10000, wait_s=600, project="big")
    h.sample()
    assert not big.done()
    granted_at = None
    for second in range(1, 31):
        h.clock.advance(1.0)
        h.broker.release(small.lease_id, "tester")  # a small lease ends, and another asks
        nxt = h.acquire(pool.spawn()[1], mib=2000, wait_s=600, project="small")
        h.sample()
        if big.done():
            granted_at = second
            break
        small = nxt.result()
    if granted_by_s is None:
        assert granted_at is None  # by shares alone: passed for ever
    else:
        assert granted_at is not None and granted_at <= granted_by_s, granted_at
        assert big.exception() is None


def test_only_the_head_of_each_projects_line_goes_first_past_the_bound(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    """Requests queued early do not make the whole queue FIFO: past the bound only each
    project's first request goes before the shares' order; `a`'s other requests still come
    after `b`'s, which uses less of its share."""
    h = make_inprocess(SINGLE_24G, persist=False, shares={"a": 1, "b": 1})
    h.acquire(pool.spawn()[1], mib=12000, project="a").result()
    for n in range(3):
        h.acquire(pool.spawn()[1], mib=20000, wait_s=600, project="a", session=f"a{n}")
    h.clock.advance(11.0)
    h.acquire(pool.spawn()[1], mib=20000, wait_s=600, project="b", session="b0")
    h.sample()
    queue = h.broker.leases_view()["queue"]
    assert [q["session"] for q in queue] == ["a0", "b0", "a1", "a2"]
