"""A read's query parameters, checked: known names each given once, whole numbers in a
range, one of a few words. Each refusal is one line naming the parameter; an API route
answers it with 400 (`checked`), a page with its message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from litestar.exceptions import ClientException

T = TypeVar("T")


class QueryInvalid(ValueError):
    """A query a read does not take: one line naming the parameter (400)."""


@dataclass(frozen=True, slots=True)
class QueryRules:
    """The checks of one read's query, given as name → the values sent (a name sent twice
    has two): its parameter `names`, the error it raises (`invalid`), and how many
    characters of a refused value its message quotes (`shown_chars`)."""

    names: tuple[str, ...]
    invalid: type[QueryInvalid] = QueryInvalid
    shown_chars: int = 40

    def shown(self, value: str) -> str:
        """A value as a message quotes it: repr, cut at `shown_chars` characters."""
        cut = self.shown_chars
        return repr(value if len(value) <= cut else value[:cut] + "…")

    def check_names(self, params: Mapping[str, list[str]]) -> None:
        """Raises `invalid`: an unknown parameter (the first by name), or one sent twice."""
        unknown = sorted(set(params) - set(self.names))
        if unknown:
            raise self.invalid(
                f"unknown query parameter {self.shown(unknown[0])} (known: {', '.join(self.names)})"
            )
        for name, values in params.items():
            if len(values) > 1:
                raise self.invalid(f"{name} is given {len(values)} times; give it once")

    def whole(
        self,
        params: Mapping[str, list[str]],
        name: str,
        most: int,
        what: str,
        digits: int | None = None,
    ) -> int | None:
        """`name` as a whole number from 1 to `most` (`what` they are, for the message), or
        None when not sent. At most `digits` digits are read (default: those of `most`).

        Raises:
            `invalid`: anything else, e.g. `0`, `-5`, `1.5`, a number past `most`.
        """
        if name not in params:
            return None
        raw = params[name][0].strip()
        longest = len(str(most)) if digits is None else digits
        if not (len(raw) <= longest and raw.isascii() and raw.isdigit() and 1 <= int(raw) <= most):
            raise self.invalid(
                f"{name} must be a whole number from 1 to {most} ({what}), "
                f"not {self.shown(params[name][0])}"
            )
        return int(raw)

    def choice(
        self, params: Mapping[str, list[str]], name: str, choices: Sequence[str], default: str
    ) -> str:
        """`name` as one of `choices`, `default` when not sent.

        Raises:
            `invalid`: any other word.
        """
        value = params.get(name, [default])[0]
        if value not in choices:
            raise self.invalid(
                f"{name} must be one of {', '.join(choices)}, not {self.shown(value)}"
            )
        return value


def checked(parse: Callable[[], T]) -> T:
    """What `parse()` gives, for an API route.

    Raises:
        ClientException: 400, the `QueryInvalid`'s line as its detail.
    """
    try:
        return parse()
    except QueryInvalid as exc:
        raise ClientException(str(exc)) from exc
