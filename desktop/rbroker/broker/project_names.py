"""One name, one project: the spelling of each project that `[members]` or `[shares]` names,
found by `rbroker_protocol.descriptions.name_key` (NFKC and case folding), so that a request
declaring `Vision` or the full-width `ｖｉｓｉｏｎ` is the listed project `vision`: its
members list applies, its share is counted, and every view shows it as listed.

Letters that only look alike across scripts (a Cyrillic `і` in `vіsion`) are refused by the
description rules (`mixed_scripts`) before a name gets here. Projects that no table names
keep the spelling they were declared with.
"""

from __future__ import annotations

from collections.abc import Iterable

from rbroker.broker.shares import DEFAULT_KEY
from rbroker_protocol.descriptions import name_key


class ProjectNames:
    """The listed spelling of each project by its `name_key`."""

    def __init__(self, *tables: Iterable[str]) -> None:
        """`tables`: the project names of `[members]` and `[shares]` (`*` is skipped).

        Raises:
            ValueError: two spellings of one name (`Vision` and `vision`), in one table or
                across them, in one line naming both.
        """
        self._by_key: dict[str, str] = {}
        for table in tables:
            for project in table:
                if project == DEFAULT_KEY:
                    continue
                key = name_key(project)
                seen = self._by_key.setdefault(key, project)
                if seen != project:
                    raise ValueError(
                        f"{seen!r} and {project!r} are one project to the broker (names are "
                        "compared without regard to case or width): list it once, one way"
                    )

    def canonical(self, project: str) -> str:
        """`project` as a table lists it, or as given when no table names it."""
        return self._by_key.get(name_key(project), project)
