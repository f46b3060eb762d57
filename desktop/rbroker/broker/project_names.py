"""One name, one project: the spelling of each project that `[members]` or `[shares]` names,
found by `rbroker_protocol.descriptions.name_key` (NFKC and case folding), so that a request
declaring `Vision` or the full-width `ｖｉｓｉｏｎ` is the listed project `vision`: its
members list applies, its share is counted, and every view shows it as listed.

Letters that only look alike across scripts (a Cyrillic `і` in `vіsion`) are refused by the
description rules (`mixed_scripts`) before a name gets here. A name written wholly in
another script that passes for a listed one (Lisu `ꓦꓲꓢꓲꓳꓠ` for `VISION`), or with digits or
symbols that do (`n1p` for `nlp`), shares a look key with it (UTS #39's skeleton,
`rbroker_protocol.confusables.look_keys`) and is refused (`description_rejected`, rule
`confusable`): it would be another project that every view shows as the listed one. Projects
that no table names, and look like none that does, keep the spelling they were declared with.
"""

from __future__ import annotations

from collections.abc import Iterable

from rbroker.broker.shares import DEFAULT_KEY
from rbroker_protocol.confusables import look_keys
from rbroker_protocol.descriptions import name_key
from rbroker_protocol.errors import ErrorCode, RpcError


class ProjectNames:
    """The listed spelling of each project by its `name_key`."""

    def __init__(self, *tables: Iterable[str]) -> None:
        """`tables`: the project names of `[members]` and `[shares]` (`*` is skipped).

        Raises:
            ValueError: two spellings of one name (`Vision` and `vision`), or two names a
                reader could take for each other (`nlp` and `n1p`), in one table or across
                them, in one line naming both.
        """
        self._by_key: dict[str, str] = {}
        self._by_look: dict[str, str] = {}
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
                for look in look_keys(project):
                    alike = self._by_look.setdefault(look, project)
                    if name_key(alike) != key:
                        raise ValueError(
                            f"{alike!r} and {project!r} look alike (Unicode's confusables): "
                            "a reader could take one for the other; rename one of them"
                        )

    def canonical(self, project: str) -> str:
        """`project` as a table lists it, or as given when no table names it.

        Raises:
            RpcError: `description_rejected` (rule `confusable`): `project` is not a listed
                project but looks like one.
        """
        listed = self._by_key.get(name_key(project))
        if listed is not None:
            return listed
        for look in look_keys(project) if self._by_look else ():
            alike = self._by_look.get(look)
            if alike is not None:
                raise RpcError(
                    ErrorCode.DESCRIPTION_REJECTED,
                    f"the project name could be taken for {alike!r}, a project this broker "
                    "lists in [members] or [shares]: choose a name that does not look like it",
                    field="project",
                    rule="confusable",
                )
        return project
