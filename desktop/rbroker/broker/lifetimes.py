"""How long leases lived: per OS user, per project and per (project, session), the last
lifetimes seen, for the queue's estimate of when a waiting request fits
(`rbroker.broker.eta`).

Bounded in memory, and per user: of each user (the lease's owner), the last `per_project`
lifetimes of each of the `projects` projects that user's leases ended in last, and the last
`per_session` of each of the `sessions` (project, session) pairs (least recently ended
dropped first); at most `users` users (the one whose last lease ended longest ago dropped
first). One user's churn (a thousand tiny leases, each of a new project and session) evicts
only that user's own history, never another user's. A lifetime is measured on the
monotonic clock, grant to end (for a lease restored after a restart, from its grant's wall
time: `rbroker.broker.leases.Lease.age_from`). Kept across a broker restart in the
store's meta table (`to_json`, `from_json`), written by the broker's tick at most every
`LIFETIMES_SAVE_S` seconds when a lifetime was recorded since (`recorded` counts them), and
when the broker stops: a crash loses at most that much history, and no lease cycle writes
it.
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from typing import TypeVar

PER_PROJECT = 64
PER_SESSION = 16
PROJECTS = 256
"""Projects kept per user."""
SESSIONS = 1024
"""(project, session) pairs kept per user."""
USERS = 256
"""Users kept (the OS users of one computer)."""
SESSION_MIN = 3
"""A session's own lifetimes are used once it has this many; its project's before."""

K = TypeVar("K", bound=Hashable)

LIFETIMES_SAVE_S = 30.0
"""The broker writes the history to its store at most this often (monotonic seconds)."""

STORE_KEY = "lease_lifetimes"
"""The store's meta key that keeps the history (`rbroker.broker.store.LeaseStore.meta`)."""


class _OfUser:
    """One user's lifetimes (seconds) per project and per (project, session)."""

    __slots__ = ("of_project", "of_session")

    def __init__(self) -> None:
        self.of_project: OrderedDict[str, deque[float]] = OrderedDict()
        self.of_session: OrderedDict[tuple[str, str], deque[float]] = OrderedDict()


class Lifetimes:
    """The recent lease lifetimes (seconds) per user, per project and per (project,
    session)."""

    def __init__(
        self,
        per_project: int = PER_PROJECT,
        per_session: int = PER_SESSION,
        projects: int = PROJECTS,
        sessions: int = SESSIONS,
        users: int = USERS,
    ) -> None:
        self.per_project, self.per_session = per_project, per_session
        self.projects, self.sessions, self.users = projects, sessions, users
        self._of_user: OrderedDict[str, _OfUser] = OrderedDict()
        self.recorded = 0
        """How many lifetimes `record` took so far (the broker writes the history when it
        moved)."""

    def _user(self, owner: str) -> _OfUser:
        """`owner`'s history, made and moved last (the least recent user past `users`
        goes)."""
        found = self._of_user.get(owner)
        if found is None:
            found = self._of_user[owner] = _OfUser()
            if len(self._of_user) > self.users:
                self._of_user.popitem(last=False)
        else:
            self._of_user.move_to_end(owner)
        return found

    def record(self, owner: str, project: str, session: str, lifetime_s: float) -> None:
        """A lease of OS user `owner`, `project`/`session` ended after `lifetime_s`
        seconds (≥ 0)."""
        if not lifetime_s >= 0 or lifetime_s == float("inf"):
            return
        user = self._user(owner)
        _push(user.of_project, project, lifetime_s, self.per_project, self.projects)
        _push(user.of_session, (project, session), lifetime_s, self.per_session, self.sessions)
        self.recorded += 1

    def of(self, owner: str, project: str, session: str) -> tuple[Sequence[float], str]:
        """The lifetimes to judge a lease of `owner`'s `project`/`session` by, and whose
        they are (`session`, `project`, or `` when none was seen)."""
        user = self._of_user.get(owner)
        if user is None:
            return (), ""
        own = user.of_session.get((project, session))
        if own is not None and len(own) >= SESSION_MIN:
            return own, "session"
        of_project = user.of_project.get(project)
        if of_project:
            return of_project, "project"
        return (), ""

    def to_json(self) -> str:
        """The history as JSON: `{"users": {owner: {"projects": {name: [s, ...]},
        "sessions": [[project, session, [s, ...]], ...]}}}`, least recently ended first."""
        return json.dumps(
            {
                "users": {
                    owner: {
                        "projects": {p: list(v) for p, v in user.of_project.items()},
                        "sessions": [[p, s, list(v)] for (p, s), v in user.of_session.items()],
                    }
                    for owner, user in self._of_user.items()
                }
            }
        )

    @classmethod
    def from_json(cls, text: str | None) -> Lifetimes:
        """A history read back from `to_json`'s text; an empty one from None or from text
        that is not such JSON, or of the earlier form without users (a history is a hint:
        never worth refusing to start)."""
        out = cls()
        if not text:
            return out
        try:
            for owner, doc in json.loads(text)["users"].items():
                user = out._user(str(owner))
                for project, values in doc["projects"].items():
                    for v in values:
                        _push(
                            user.of_project, str(project), float(v), out.per_project, out.projects
                        )
                for project, session, values in doc["sessions"]:
                    key = (str(project), str(session))
                    for v in values:
                        _push(user.of_session, key, float(v), out.per_session, out.sessions)
        except (ValueError, KeyError, TypeError, AttributeError):
            return cls()
        return out


def _push(
    table: OrderedDict[K, deque[float]], key: K, value: float, per_key: int, keys: int
) -> None:
    """Append `value` to `table[key]` (its last `per_key` kept), `key` last in the table,
    whose least recent key goes past `keys`."""
    found = table.get(key)
    if found is None:
        found = table[key] = deque(maxlen=per_key)
        if len(table) > keys:
            table.popitem(last=False)
    else:
        table.move_to_end(key)
    found.append(value)
