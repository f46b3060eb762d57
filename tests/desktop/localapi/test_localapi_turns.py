"""Users served in turn (issue 31): one OS user's load bounds only that user's latency.

`Turns` on a real event loop, with connections that each hold request lines: a user with
many lines gets at most its share in one turn of the loop, and another user's line is
served in the turn it arrives, not after the busy user's backlog.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from rbroker.localapi.connection import Connection
from rbroker.localapi.limits import Turns


class _Lines:
    """A connection of `user` holding `count` request lines, served as `Connection` serves
    its buffer: line by line while `Turns.take` allows, held back when it does not."""

    def __init__(self, turns: Turns, user: str, count: int, served: list[str]) -> None:
        self.turns = turns
        self.user_key = user
        self.closed = False
        self.left = count
        self.held = False
        self.served = served

    def hold(self, why: str) -> None:
        assert why == "turn"
        self.held = True

    def release(self, why: str) -> None:
        assert why == "turn" and self.held
        self.held = False
        self.pump()

    def pump(self) -> None:
        while self.left and not self.held and self.turns.take(cast(Connection, self)):
            self.left -= 1
            self.served.append(self.user_key)


def _run(per_turn: int, busy: int, lines_each: int) -> list[list[str]]:
    """What was served in each turn: `busy` connections of user a with `lines_each` lines,
    then one line of user b arriving in the first turn."""

    async def scenario() -> list[list[str]]:
        turns = Turns(per_turn)
        served: list[str] = []
        conns: list[Any] = [_Lines(turns, "a", lines_each, served) for _ in range(busy)]
        for conn in conns:
            conn.pump()
        _Lines(turns, "b", 1, served).pump()
        by_turn = [list(served)]
        while any(c.left for c in conns):
            served.clear()
            await asyncio.sleep(0)
            by_turn.append(list(served))
        return by_turn

    return asyncio.run(scenario())


def test_another_users_line_is_served_in_the_turn_it_arrives() -> None:
    by_turn = _run(per_turn=4, busy=50, lines_each=3)
    assert by_turn[0].count("b") == 1  # not behind user a's 150 lines
    assert by_turn[0].count("a") == 4


def test_a_busy_user_gets_its_share_each_turn_until_all_is_served() -> None:
    by_turn = _run(per_turn=4, busy=50, lines_each=3)
    assert all(turn.count("a") <= 4 for turn in by_turn)
    assert sum(turn.count("a") for turn in by_turn) == 150  # nothing lost, nothing twice
    assert all(turn for turn in by_turn[1:])  # a turn with lines waiting always serves some


class _Clock:
    """A clock that moves only when told (seconds)."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_a_user_whose_lines_take_long_gets_one_per_turn_and_another_is_not_held() -> None:
    """The time share (`per_turn_s`): lines of 30 ms (a large `jobs.list`) are served one a
    turn, not `per_turn` of them; another user's cheap line is served in its first turn."""

    async def scenario() -> list[list[str]]:
        clock = _Clock()
        turns = Turns(per_turn=16, per_turn_s=0.005, clock=clock)
        served: list[str] = []

        class _Costly(_Lines):
            def pump(self) -> None:
                while self.left and not self.held and self.turns.take(cast(Connection, self)):
                    started = clock()
                    clock.now_s += 0.030 if self.user_key == "a" else 0.0001
                    self.left -= 1
                    self.served.append(self.user_key)
                    self.turns.charge(cast(Connection, self), clock() - started)

        busy: list[Any] = [_Costly(turns, "a", 1, served) for _ in range(40)]
        for conn in busy:
            conn.pump()
        _Costly(turns, "b", 3, served).pump()
        by_turn = [list(served)]
        while any(c.left for c in busy):
            served.clear()
            await asyncio.sleep(0)
            by_turn.append(list(served))
        return by_turn

    by_turn = asyncio.run(scenario())
    assert by_turn[0].count("b") == 3
    assert all(turn.count("a") == 1 for turn in by_turn)  # one 30 ms line a turn
    assert sum(turn.count("a") for turn in by_turn) == 40
