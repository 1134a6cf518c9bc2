"""The error taxonomy every command shares (after h11's: say whose fault it is).

* :class:`ConfigError` — the user's input is wrong (usage, scenario, config file, flags).
  Commands exit 2 and print one line per problem, each naming the field path; no traceback.
* :class:`HeadroomError` — anything else that failed (a broker that would not start, a
  topic that could not be created). Commands exit 1 with a message saying what failed.

Malformed *messages* are neither: they are dead-lettered and processing goes on
(``headroom.streams.messages.ValidationError``).
"""

from __future__ import annotations

from collections.abc import Iterable


class HeadroomError(Exception):
    """A failure that is not the user's input: exit 1 with this message."""


class ConfigError(HeadroomError):
    """Bad input: one or more problems, each a line naming the field path and the reason."""

    def __init__(self, problems: str | Iterable[str]) -> None:
        self.problems: list[str] = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))
