"""Client-side shedding of optional work: an AIMD multiplier per server, spent lowest value first.

Pure code (no asyncio, Kafka, wall clock or global random state); the client worker and the
simulator drive the same objects. The shared vocabulary (:class:`ShedEvent`,
:class:`ShedTransition`) and the server side live in :mod:`headroom.defences.shedding`; the
mechanism is described there under *Client side*.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from headroom.defences.shedding import ShedEvent, ShedTransition
from headroom.kernel.checks import FieldChecker

__all__ = ["ClientShedConfig", "ClientShedder"]

BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class ClientShedConfig:
    """Client-side AIMD on the optional-work multiplier (sources in the module docstring)."""

    decrease_factor: float = 0.5  # β: m ← m·β on overload (TCP halving)
    decrease_interval_ms: float = 100.0  # at most one decrease per this interval
    recovery_per_s: float = 0.2  # additive recovery: 0 → 1 in 5 s of healthy responses
    overload_queue_ms: float | None = 50.0  # queue delay above this counts as overload too
    zero_below: float = 0.01  # a multiplier under this snaps to 0 (no optional work)

    def __post_init__(self) -> None:
        c = FieldChecker("shedding.client")
        c.between("decrease_factor", self.decrease_factor, 0.0, 1.0, hi_open=True)
        c.nonnegative("decrease_interval_ms", self.decrease_interval_ms)
        c.positive("recovery_per_s", self.recovery_per_s)
        c.share("zero_below", self.zero_below)
        if self.overload_queue_ms is not None:
            c.nonnegative("overload_queue_ms", self.overload_queue_ms)
        c.raise_if_any()


class ClientShedder:
    """Client-side optional-work multiplier for one server (see the module docstring).

    Keep one per server the client talks to; feed :meth:`on_response` with the health of every
    response from that server and ask :meth:`apply` (or :meth:`keep_mask`) what each request
    may keep.
    """

    def __init__(self, config: ClientShedConfig | None = None, now: float = 0.0) -> None:
        self.config = config or ClientShedConfig()
        self._m = 1.0
        self._t = now
        self._recovering = True
        self._last_decrease: float | None = None
        self._shedding = False
        self._ep_dropped = 0
        self._ep_extra = 0
        self._ep_strong = 0
        self._decreases = 0

    def on_response(
        self, now: float, overloaded: bool, queue_ms: float | None = None
    ) -> ShedTransition | None:
        """Fold in the health carried by one response; returns a transition when shedding
        starts (multiplier leaves 1) or stops (multiplier back at 1)."""
        cfg = self.config
        if not overloaded and queue_ms is not None and cfg.overload_queue_ms is not None:
            overloaded = queue_ms > cfg.overload_queue_ms
        m = self.multiplier_at(now)
        if now > self._t:
            self._t = now
        if overloaded:
            self._recovering = False
            if (
                self._last_decrease is None
                or (now - self._last_decrease) * 1000.0 >= cfg.decrease_interval_ms
            ):
                m *= cfg.decrease_factor
                if m < cfg.zero_below:
                    m = 0.0
                self._last_decrease = now
                self._decreases += 1
        else:
            self._recovering = True
        self._m = m
        return self.poll(now)

    def poll(self, now: float) -> ShedTransition | None:
        """The shedding transition due at ``now``, if any (recovery happens with time, so a
        client with no traffic can still learn that shedding stopped)."""
        m = self.multiplier_at(now)
        if not self._shedding and m < 1.0:
            self._shedding = True
            return ShedTransition(ShedEvent.STARTED, "client", now, 0, multiplier=m)
        if self._shedding and m >= 1.0:
            t = ShedTransition(
                ShedEvent.STOPPED, "client", now, self._ep_dropped, self._ep_extra,
                self._ep_strong, multiplier=m,
            )  # fmt: skip
            self._shedding = False
            self._ep_dropped = self._ep_extra = self._ep_strong = 0
            return t
        return None

    @property
    def multiplier(self) -> float:
        """The multiplier as of the last call that carried a time."""
        return self.multiplier_at(self._t)

    @property
    def shedding(self) -> bool:
        return self._shedding

    def multiplier_at(self, now: float) -> float:
        """The multiplier including additive recovery up to ``now`` (does not change state)."""
        m = self._m
        if self._recovering and m < 1.0 and now > self._t:
            m = m + self.config.recovery_per_s * (now - self._t)
            if m >= 1.0 - 1e-9:  # (now − t) loses bits to rounding; full recovery is exact
                m = 1.0
        return m

    def keeps(self, value_rank: float, now: float | None = None) -> bool:
        """True when a request of this value rank keeps its optional work: m > 0 and
        rank ≥ 1 − m, so the multiplier is spent on the highest-value requests."""
        m = self.multiplier_at(self._t if now is None else now)
        return m > 0.0 and value_rank >= 1.0 - m

    def apply(self, now: float, value_rank: float, extra: int, strong: bool) -> tuple[int, bool]:
        """Extra candidates and strong routing a request keeps; counts what is dropped."""
        if extra <= 0 and not strong:
            return (0, False)
        if self.keeps(value_rank, now):
            return (extra, strong)
        self._ep_dropped += 1
        self._ep_extra += max(0, extra)
        self._ep_strong += int(strong)
        return (0, False)

    def keep_mask(self, now: float, value_rank: npt.ArrayLike) -> BoolArray:
        """Array form of :meth:`keeps` for the simulator: pass the ranks of requests that ask for
        optional work; every False is counted as one dropped request."""
        ranks = np.asarray(value_rank, dtype=np.float64)
        m = self.multiplier_at(now)
        mask: BoolArray = (ranks >= 1.0 - m) if m > 0.0 else np.zeros(ranks.shape, np.bool_)
        self._ep_dropped += int(ranks.size - int(mask.sum()))
        return mask

    def snapshot(self) -> dict[str, Any]:
        return {
            "m": self._m,
            "t": self._t,
            "recovering": self._recovering,
            "last_decrease": self._last_decrease,
            "shedding": self._shedding,
            "ep_dropped": self._ep_dropped,
            "ep_extra": self._ep_extra,
            "ep_strong": self._ep_strong,
            "decreases": self._decreases,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self._m = float(state["m"])
        self._t = float(state["t"])
        self._recovering = bool(state["recovering"])
        ld = state["last_decrease"]
        self._last_decrease = None if ld is None else float(ld)
        self._shedding = bool(state["shedding"])
        self._ep_dropped = int(state["ep_dropped"])
        self._ep_extra = int(state["ep_extra"])
        self._ep_strong = int(state["ep_strong"])
        self._decreases = int(state["decreases"])
