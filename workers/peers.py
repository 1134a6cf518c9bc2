"""Peer policies: adaptive concurrency limits from other projects, for side-by-side comparison.

Pure code (no asyncio, Kafka, wall clock or global random state): time comes in as ``now``
(seconds) with every sample; Envoy's jitter draws from an injected ``numpy.random.Generator``.
Each class is a reimplementation from the published algorithm, not a copy of its code.

Common interface (:class:`ConcurrencyLimit`, after Netflix's ``Limit``)::

    limit.on_sample(now, rtt_ms, inflight, dropped) -> int   # the new limit
    limit.limit                                             # the current concurrency limit

A limit algorithm only computes; enforcement (forwarding or blocking work) is apart, as in
Netflix's ``Limit`` / ``Limiter`` split: :class:`OptionalBudget` turns any limit into a budget
for optional work, which the simulator uses as an alternative *policy*.

AIMD — :class:`AimdLimit`
=========================
Credit: Netflix concurrency-limits, ``AIMDLimit`` (Apache-2.0,
https://github.com/Netflix/concurrency-limits). Loss-based::

    if dropped or rtt > timeout:   limit ← ⌊limit × backoff_ratio⌋
    elif inflight × 2 ≥ limit:     limit ← limit + 1        (grow only when the limit is used)
    limit ← clamp(limit, min_limit, max_limit)

Defaults are Netflix's: initial 20, min 20, max 200, backoff 0.9, timeout 5 s.

Gradient2 — :class:`Gradient2Limit`
===================================
Credit: Netflix concurrency-limits, ``Gradient2Limit``. Delay-based, comparing the current RTT
with a long-term exponential average of it (not the minimum, which is biased low on bursty
RPCs)::

    long_rtt ← EMA(rtt; window 600 samples, plain mean over the first 10)
    if long_rtt / rtt > 2:           long_rtt ← 0.95 × long_rtt   (recover after load quickly)
    if inflight < limit / 2:         keep the limit                 (app-limited: no evidence)
    gradient  = clamp(tolerance × long_rtt / rtt, 0.5, 1.0)
    new       = limit × gradient + queue_size
    limit     ← clamp(limit × (1 − smoothing) + new × smoothing, min_limit, max_limit)

Defaults are Netflix's: initial 20, min 20, max 200, smoothing 0.2, queue size 4, tolerance 1.5.

Envoy gradient controller — :class:`EnvoyGradientLimit`
=======================================================
Credit: Envoy proxy, adaptive concurrency filter, ``GradientController`` (Apache-2.0,
https://github.com/envoyproxy/envoy, ``source/extensions/filters/http/adaptive_concurrency/
controller/gradient_controller.{h,cc}``), itself after Netflix's gradient algorithm. Two mutually
exclusive sampling windows:

* **minRTT window** — every ``min_rtt_calc_interval`` (plus jitter, uniform in
  ``[0, jitter × interval)``, drawn from the injected generator), the limit is pinned to
  ``min_concurrency`` until ``min_rtt_request_count`` samples arrive; their
  ``sample_percentile`` becomes minRTT. Samples of requests sent before the window opened are
  ignored (the caller passes ``sent_at``; without it every sample counts).
* **sample window** — every ``sample_interval`` the samples gathered are reduced to their
  ``sample_percentile`` (sampleRTT) and the limit is updated::

      gradient  = clamp(minRTT × (1 + buffer) / sampleRTT, 0.5, 2.0)
      limit     ← clamp(⌊limit × gradient + sqrt(limit × gradient)⌋, min_concurrency, max_limit)

  If the limit sits at ``min_concurrency`` for 5 consecutive windows, minRTT is remeasured at
  once (the measurement is probably wrong).

Envoy's timers become deadlines checked when a sample arrives: a window closes on the first
sample at or after its end (the pure-core version of a timer). Defaults are Envoy's: jitter 15%,
max 1000, request count 50, percentile p50, min concurrency 3, buffer 25%; the two intervals have
no Envoy default and are set to 60 s and 100 ms here (the values in Envoy's docs example).

From a concurrency limit to an optional-work budget — :class:`OptionalBudget`
=============================================================================
A peer limit bounds *total* concurrency, but headroom never blocks baseline work for optional
work. So the adapter counts concurrency in *request equivalents* (a request with RMA extras
weighs ``(base + extra) / base``; one routed to the strong model weighs
``strong_cost / base_cost``), gives the baseline what it has in flight, and lets optional work
have the rest::

    optional_slots = max(0, limit − baseline_inflight)
    multiplier     = clamp(optional_slots / optional_demand, 0, 1)

``optional_demand`` is what optional work in flight would weigh at full targets (in request
equivalents beyond the baseline). The multiplier is spent like the client shedder's: lowest
value first (a request keeps its optional work when its value rank ≥ 1 − multiplier), or, for
RMA alone, as a candidate multiplier ``extra × multiplier``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from headroom.errors import ConfigError

__all__ = [
    "AimdConfig",
    "AimdLimit",
    "Budget",
    "ConcurrencyLimit",
    "EnvoyGradientConfig",
    "EnvoyGradientLimit",
    "Gradient2Config",
    "Gradient2Limit",
    "OptionalBudget",
    "make_limit",
]


@runtime_checkable
class ConcurrencyLimit(Protocol):
    """A limit algorithm: it computes a concurrency limit from samples, enforces nothing."""

    @property
    def limit(self) -> int: ...

    def on_sample(self, now: float, rtt_ms: float, inflight: int, dropped: bool) -> int: ...

    def snapshot(self) -> dict[str, Any]: ...

    def restore(self, state: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True, slots=True)
class AimdConfig:
    initial_limit: int = 20
    min_limit: int = 20
    max_limit: int = 200
    backoff_ratio: float = 0.9  # Netflix requires [0.5, 1)
    timeout_ms: float = 5000.0  # an RTT above this counts as a drop


class AimdLimit:
    """Netflix concurrency-limits AIMD (see the module docstring)."""

    def __init__(self, config: AimdConfig | None = None) -> None:
        raise NotImplementedError

    @property
    def limit(self) -> int:
        raise NotImplementedError

    def on_sample(self, now: float, rtt_ms: float, inflight: int, dropped: bool) -> int:
        raise NotImplementedError

    def snapshot(self) -> dict[str, Any]:
        raise NotImplementedError

    def restore(self, state: Mapping[str, Any]) -> None:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Gradient2Config:
    initial_limit: int = 20
    min_limit: int = 20
    max_limit: int = 200
    smoothing: float = 0.2
    queue_size: float = 4.0
    long_window: int = 600  # samples of the long-term RTT EMA
    warmup: int = 10  # samples averaged plainly before the EMA starts
    rtt_tolerance: float = 1.5  # ≥ 1: how much RTT growth is tolerated before shrinking


class Gradient2Limit:
    """Netflix concurrency-limits Gradient2 (see the module docstring)."""

    def __init__(self, config: Gradient2Config | None = None) -> None:
        raise NotImplementedError

    @property
    def limit(self) -> int:
        raise NotImplementedError

    def on_sample(self, now: float, rtt_ms: float, inflight: int, dropped: bool) -> int:
        raise NotImplementedError

    def snapshot(self) -> dict[str, Any]:
        raise NotImplementedError

    def restore(self, state: Mapping[str, Any]) -> None:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class EnvoyGradientConfig:
    min_rtt_calc_interval_s: float = 60.0
    sample_interval_s: float = 0.1
    jitter: float = 0.15  # share of the minRTT interval, uniform
    max_limit: int = 1000
    min_rtt_request_count: int = 50
    sample_percentile: float = 0.5
    min_concurrency: int = 3
    min_rtt_buffer: float = 0.25
    fixed_min_rtt_ms: float | None = None  # set: never measure minRTT, use this
    min_concurrency_retrigger: int = 5  # windows pinned at min_concurrency before remeasuring


class EnvoyGradientLimit:
    """Envoy's adaptive-concurrency gradient controller (see the module docstring)."""

    def __init__(
        self, config: EnvoyGradientConfig | None, rng: np.random.Generator, now: float = 0.0
    ) -> None:
        raise NotImplementedError

    @property
    def limit(self) -> int:
        raise NotImplementedError

    @property
    def min_rtt_ms(self) -> float | None:
        raise NotImplementedError

    @property
    def in_min_rtt_window(self) -> bool:
        raise NotImplementedError

    def on_sample(
        self,
        now: float,
        rtt_ms: float,
        inflight: int,
        dropped: bool,
        sent_at: float | None = None,
    ) -> int:
        raise NotImplementedError

    def snapshot(self) -> dict[str, Any]:
        raise NotImplementedError

    def restore(self, state: Mapping[str, Any]) -> None:
        raise NotImplementedError


class Budget(NamedTuple):
    """Optional-work budget derived from a concurrency limit."""

    slots: float  # request equivalents optional work may occupy now
    multiplier: float  # share of optional demand allowed, in [0, 1]


class OptionalBudget:
    """Turns a :class:`ConcurrencyLimit` into a budget for optional work (module docstring)."""

    def __init__(self, limit: ConcurrencyLimit) -> None:
        self.algorithm = limit

    def budget(self, baseline_inflight: float, optional_demand: float) -> Budget:
        raise NotImplementedError


def make_limit(
    name: str, rng: np.random.Generator | None = None, now: float = 0.0
) -> ConcurrencyLimit:
    """Build a peer limit by policy name: ``aimd``, ``gradient`` (Netflix Gradient2) or
    ``envoy-gradient``, with the published defaults."""
    raise NotImplementedError


_ = (math, ConfigError)
