"""The controller's liveness rule (pure: times are passed in, no clock of its own).

A controller that stops hearing its inputs must not go on issuing targets from stale books
without anyone noticing: a consumer that stopped fetching after a rebalance looks, from outside,
like a healthy process. So the control clock reports every step to a :class:`Liveness`:

* a step is **live** when the consumer delivered at least one latency or capacity message since
  the previous step — on a running stack the servers publish latency every second and the feed
  refreshes the capacity levels, so a step without any means the consumer is stalled (value
  signals do not count: their agent can work through a backlog of buffered records long after
  the fetching stopped);
* the check is armed by the first live step (start-up and table recovery are not judged);
* :meth:`Liveness.check` fails once no live step happened within ``intervals`` control
  intervals (default 3), and at least :data:`LIVENESS_MIN_S` (the feed re-announces every level
  every 10 s, so with very short intervals a quiet stack still has input that often): the app
  then logs ``controller.liveness.failed`` and exits non-zero, so
  a supervisor (``headroom up``, systemd, Kubernetes) restarts it;
* a process that was frozen (SIGSTOP, a stopped VM) is not stalled: when two checks are further
  apart than ``frozen_gap_s`` the deadline starts again from the later one.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LIVENESS_INTERVALS", "LIVENESS_MIN_S", "Liveness"]

LIVENESS_INTERVALS = 3.0
LIVENESS_MIN_S = 30.0


@dataclass(slots=True)
class Liveness:
    interval_s: float
    intervals: float = LIVENESS_INTERVALS
    frozen_gap_s: float | None = None  # default: one interval
    min_s: float = LIVENESS_MIN_S
    messages: int = 0  # latency and capacity messages consumed, ever
    _seen_at_step: int = 0
    last_live: float | None = None  # the last live step (None: not armed yet)
    _last_check: float | None = None

    @property
    def limit_s(self) -> float:
        return max(self.intervals * self.interval_s, self.min_s)

    def consumed(self, n: int = 1) -> None:
        self.messages += n

    def step(self, now: float) -> bool:
        """A control step ran at ``now``; True when it was live (new input since the last)."""
        live = self.messages > self._seen_at_step
        self._seen_at_step = self.messages
        if live:
            self.last_live = now
        return live

    def check(self, now: float) -> str | None:
        """None while alive; else why not (for the log line before the exit)."""
        gap = self.frozen_gap_s if self.frozen_gap_s is not None else self.interval_s
        last_check, self._last_check = self._last_check, now
        if self.last_live is None:
            return None
        if last_check is not None and now - last_check > gap:
            # this process was not running in between (paused): judge it from now on
            self.last_live = max(self.last_live, now)
            return None
        silent = now - self.last_live
        if silent > self.limit_s:
            return (
                f"no control step with new input for {silent:.1f} s "
                f"(> {self.limit_s:g} s: {self.intervals:g} intervals of {self.interval_s:g} s, "
                f"at least {self.min_s:g} s): "
                f"the consumer has stalled ({self.messages} messages consumed in all)"
            )
        return None
