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

Google SRE client-side adaptive throttling — :class:`SreThrottle`
=================================================================
Credit: *Site Reliability Engineering* (Beyer et al., O'Reilly 2016), chapter "Handling
Overload", *Client-side throttling*. Each client keeps, over a trailing window (two minutes in
the book), the requests it attempted and the ones the backend accepted, and rejects a new
request locally with probability::

    p = max(0, (requests − K × accepts) / (requests + 1)),   K = 2

so nothing is throttled while at least half the attempts are accepted, and a backend that
rejects everything sees the client's traffic fall to about ``1/K`` of what it would send. Here it
governs optional work only (a request's optional part is what is rejected locally); a request
whose response missed the timeout counts as not accepted.

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
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from headroom.kernel.checks import FieldChecker
from headroom.kernel.errors import ConfigError
from headroom.kernel.jsonstate import decode_big_ints, encode_big_ints, json_float

__all__ = [
    "PEER_POLICIES",
    "AimdConfig",
    "AimdLimit",
    "Budget",
    "ConcurrencyLimit",
    "EnvoyGradientConfig",
    "EnvoyGradientLimit",
    "Gradient2Config",
    "Gradient2Limit",
    "OptionalBudget",
    "SreThrottle",
    "make_limit",
]


@runtime_checkable
class ConcurrencyLimit(Protocol):
    """A limit algorithm: it computes a concurrency limit from samples, enforces nothing.

    ``on_sample`` is called once per completed (or dropped) request: ``now`` the completion
    time in seconds, ``rtt_ms`` its round-trip time, ``inflight`` the requests in flight when it
    was sent, ``dropped`` True when it was rejected, timed out or failed for overload.
    """

    @property
    def limit(self) -> int: ...

    def on_sample(self, now: float, rtt_ms: float, inflight: int, dropped: bool) -> int: ...

    def snapshot(self) -> dict[str, Any]: ...

    def restore(self, state: Mapping[str, Any]) -> None: ...


def _check_limits(c: FieldChecker, initial: int, low: int, high: int) -> None:
    c.integer("min_limit", low, 1)
    c.require(high >= low, "max_limit", f"must be >= min_limit ({low})", high)
    c.require(low <= initial <= high, "initial_limit", "must be in [min_limit, max_limit]", initial)


@dataclass(frozen=True, slots=True)
class AimdConfig:
    initial_limit: int = 20
    min_limit: int = 20
    max_limit: int = 200
    backoff_ratio: float = 0.9  # Netflix requires [0.5, 1)
    timeout_ms: float = 5000.0  # an RTT above this counts as a drop

    def __post_init__(self) -> None:
        c = FieldChecker("peers.aimd")
        _check_limits(c, self.initial_limit, self.min_limit, self.max_limit)
        c.between("backoff_ratio", self.backoff_ratio, 0.5, 1.0, hi_open=True)
        c.positive("timeout_ms", self.timeout_ms)
        c.raise_if_any()


class AimdLimit:
    """Netflix concurrency-limits AIMD (see the module docstring)."""

    def __init__(self, config: AimdConfig | None = None) -> None:
        self.config = config or AimdConfig()
        self._limit = self.config.initial_limit

    @property
    def limit(self) -> int:
        return self._limit

    def on_sample(self, now: float, rtt_ms: float, inflight: int, dropped: bool) -> int:
        cfg = self.config
        limit = self._limit
        # A non-finite RTT is no evidence of health: treat it as the timeout it most likely was.
        if dropped or not math.isfinite(rtt_ms) or rtt_ms > cfg.timeout_ms:
            limit = int(limit * cfg.backoff_ratio)
        elif inflight * 2 >= limit:
            limit += 1
        self._limit = min(cfg.max_limit, max(cfg.min_limit, limit))
        return self._limit

    def snapshot(self) -> dict[str, Any]:
        return {"limit": self._limit}

    def restore(self, state: Mapping[str, Any]) -> None:
        self._limit = int(state["limit"])


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

    def __post_init__(self) -> None:
        c = FieldChecker("peers.gradient2")
        _check_limits(c, self.initial_limit, self.min_limit, self.max_limit)
        c.between("smoothing", self.smoothing, 0.0, 1.0, lo_open=True)
        c.nonnegative("queue_size", self.queue_size)
        c.integer("long_window", self.long_window, 1)
        c.integer("warmup", self.warmup, 0)
        c.at_least("rtt_tolerance", self.rtt_tolerance, 1.0)
        c.raise_if_any()


class Gradient2Limit:
    """Netflix concurrency-limits Gradient2 (see the module docstring).

    Like the original, it ignores ``dropped``: it reacts to delay, not to loss.
    """

    def __init__(self, config: Gradient2Config | None = None) -> None:
        self.config = config or Gradient2Config()
        self._estimate = float(self.config.initial_limit)
        self._long_rtt = 0.0
        self._sum = 0.0
        self._count = 0
        self._factor = 2.0 / (self.config.long_window + 1)  # EMA factor for an N-sample window

    @property
    def limit(self) -> int:
        return int(self._estimate)

    @property
    def long_rtt_ms(self) -> float:
        return self._long_rtt

    def on_sample(self, now: float, rtt_ms: float, inflight: int, dropped: bool) -> int:
        cfg = self.config
        if not (math.isfinite(rtt_ms) and rtt_ms > 0.0):
            return int(self._estimate)  # no usable measurement
        if self._count < cfg.warmup:
            self._count += 1
            self._sum += rtt_ms
            self._long_rtt = self._sum / self._count
        else:
            self._long_rtt += (rtt_ms - self._long_rtt) * self._factor
        long_rtt = self._long_rtt
        if long_rtt / rtt_ms > 2.0:
            self._long_rtt *= 0.95
        estimate = self._estimate
        if inflight < estimate / 2.0:
            return int(estimate)
        gradient = max(0.5, min(1.0, cfg.rtt_tolerance * long_rtt / rtt_ms))
        new = estimate * gradient + cfg.queue_size
        new = estimate * (1.0 - cfg.smoothing) + new * cfg.smoothing
        self._estimate = max(float(cfg.min_limit), min(float(cfg.max_limit), new))
        return int(self._estimate)

    def snapshot(self) -> dict[str, Any]:
        return {
            "estimate": self._estimate,
            "long_rtt": self._long_rtt,
            "sum": self._sum,
            "count": self._count,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self._estimate = float(state["estimate"])
        self._long_rtt = float(state["long_rtt"])
        self._sum = float(state["sum"])
        self._count = int(state["count"])


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

    def __post_init__(self) -> None:
        c = FieldChecker("peers.envoy_gradient")
        c.positive("min_rtt_calc_interval_s", self.min_rtt_calc_interval_s)
        c.positive("sample_interval_s", self.sample_interval_s)
        c.share("jitter", self.jitter)
        c.share("sample_percentile", self.sample_percentile)
        c.nonnegative("min_rtt_buffer", self.min_rtt_buffer)
        c.integer("min_concurrency", self.min_concurrency, 1)
        c.require(
            self.max_limit >= self.min_concurrency,
            "max_limit",
            f"must be >= min_concurrency ({self.min_concurrency})",
            self.max_limit,
        )
        c.integer("min_rtt_request_count", self.min_rtt_request_count, 1)
        c.integer("min_concurrency_retrigger", self.min_concurrency_retrigger, 1)
        if self.fixed_min_rtt_ms is not None:
            c.positive("fixed_min_rtt_ms", self.fixed_min_rtt_ms)
        c.raise_if_any()


class EnvoyGradientLimit:
    """Envoy's adaptive-concurrency gradient controller (see the module docstring).

    ``rng`` draws the jitter of each minRTT window; its state is part of :meth:`snapshot`.
    """

    def __init__(
        self, config: EnvoyGradientConfig | None, rng: np.random.Generator, now: float = 0.0
    ) -> None:
        self.config = config or EnvoyGradientConfig()
        self._rng = rng
        cfg = self.config
        self._limit = cfg.min_concurrency
        # Limit to restore when the minRTT window ends; 0 = not in a minRTT window (as Envoy).
        self._deferred = 0
        self._min_rtt: float | None = cfg.fixed_min_rtt_ms
        self._samples: list[float] = []
        self._epoch = -math.inf  # samples sent before this were admitted under another regime
        self._window_end = now + cfg.sample_interval_s
        self._next_min_rtt = math.inf
        self._consecutive_min = 0
        self._last_sample_rtt: float | None = None
        if cfg.fixed_min_rtt_ms is None:
            self._enter_min_rtt_window(now)  # Envoy starts by measuring minRTT

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def min_rtt_ms(self) -> float | None:
        return self._min_rtt

    @property
    def sample_rtt_ms(self) -> float | None:
        return self._last_sample_rtt

    @property
    def in_min_rtt_window(self) -> bool:
        return self._deferred > 0

    def _enter_min_rtt_window(self, now: float) -> None:
        self._deferred = self._limit
        self._set_limit(self.config.min_concurrency, now)
        self._samples.clear()
        self._epoch = now
        self._next_min_rtt = math.inf

    def _jittered_interval(self) -> float:
        cfg = self.config
        if cfg.jitter <= 0.0:
            return cfg.min_rtt_calc_interval_s
        return cfg.min_rtt_calc_interval_s + float(
            self._rng.uniform(0.0, cfg.jitter * cfg.min_rtt_calc_interval_s)
        )

    def _set_limit(self, new: int, now: float) -> None:
        cfg = self.config
        old = self._limit
        self._limit = new
        if self._deferred == 0 and old == cfg.min_concurrency and new == cfg.min_concurrency:
            self._consecutive_min += 1
        else:
            self._consecutive_min = 0
        if self._consecutive_min >= cfg.min_concurrency_retrigger and cfg.fixed_min_rtt_ms is None:
            self._next_min_rtt = now  # pinned at the floor too long: minRTT is probably wrong

    def _aggregate(self) -> float:
        return float(np.quantile(self._samples, self.config.sample_percentile))

    def _close_sample_window(self, now: float) -> None:
        cfg = self.config
        if self._samples and self._min_rtt is not None:
            sample_rtt = self._aggregate()
            self._samples.clear()
            self._last_sample_rtt = sample_rtt
            buffered = self._min_rtt * (1.0 + cfg.min_rtt_buffer)
            gradient = max(0.5, min(2.0, buffered / sample_rtt)) if sample_rtt > 0 else 2.0
            limit = self._limit * gradient
            new = int(limit + math.sqrt(limit))
            self._set_limit(max(cfg.min_concurrency, min(cfg.max_limit, new)), now)
        # The timer re-arms from its deadline; empty windows change nothing (as in Envoy).
        interval = cfg.sample_interval_s
        skipped = max(1, math.floor((now - self._window_end) / interval) + 1)
        self._window_end += skipped * interval

    def on_sample(
        self,
        now: float,
        rtt_ms: float,
        inflight: int,
        dropped: bool,
        sent_at: float | None = None,
    ) -> int:
        """Record one completed request. ``sent_at`` (seconds) defaults to ``now − rtt``;
        dropped requests carry no latency sample (Envoy cancels them)."""
        cfg = self.config
        # Deadlines that would have fired before this sample arrived.
        if self._deferred == 0:
            if now >= self._next_min_rtt:
                self._enter_min_rtt_window(now)
            elif now >= self._window_end:
                self._close_sample_window(now)
        if dropped or not (math.isfinite(rtt_ms) and rtt_ms > 0.0):
            return self._limit
        start = now - rtt_ms / 1000.0 if sent_at is None else sent_at
        if start < self._epoch:
            return self._limit  # admitted before the minRTT window opened
        self._samples.append(rtt_ms)
        if self._deferred > 0 and len(self._samples) >= cfg.min_rtt_request_count:
            self._min_rtt = self._aggregate()
            self._samples.clear()
            # Envoy applies the deferred limit before it clears it, so the window after a
            # remeasure counts its time at the floor from 0.
            self._set_limit(self._deferred, now)
            self._deferred = 0
            self._next_min_rtt = now + self._jittered_interval()
            self._window_end = now + cfg.sample_interval_s
        return self._limit

    def snapshot(self) -> dict[str, Any]:
        return {
            "limit": self._limit,
            "deferred": self._deferred,
            "min_rtt": self._min_rtt,
            "samples": list(self._samples),
            "epoch": json_float(self._epoch),
            "window_end": self._window_end,
            "next_min_rtt": json_float(self._next_min_rtt),
            "consecutive_min": self._consecutive_min,
            "last_sample_rtt": self._last_sample_rtt,
            "rng": encode_big_ints(self._rng.bit_generator.state),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self._limit = int(state["limit"])
        self._deferred = int(state["deferred"])
        mr = state["min_rtt"]
        self._min_rtt = None if mr is None else float(mr)
        self._samples = [float(x) for x in state["samples"]]
        self._epoch = float(state["epoch"])
        self._window_end = float(state["window_end"])
        self._next_min_rtt = float(state["next_min_rtt"])
        self._consecutive_min = int(state["consecutive_min"])
        ls = state["last_sample_rtt"]
        self._last_sample_rtt = None if ls is None else float(ls)
        self._rng.bit_generator.state = decode_big_ints(state["rng"])


class Budget(NamedTuple):
    """Optional-work budget derived from a concurrency limit."""

    slots: float  # request equivalents optional work may occupy now
    multiplier: float  # share of optional demand allowed, in [0, 1]


class OptionalBudget:
    """Turns a :class:`ConcurrencyLimit` into a budget for optional work (module docstring).

    Feed the samples through :meth:`on_sample` (or to the algorithm directly) and ask
    :meth:`budget` before admitting optional work. Baseline work is never limited: it is given
    what it has in flight, whatever the limit says.
    """

    def __init__(self, limit: ConcurrencyLimit) -> None:
        self.algorithm = limit

    @property
    def limit(self) -> int:
        return self.algorithm.limit

    def on_sample(self, now: float, rtt_ms: float, inflight: int, dropped: bool) -> int:
        return self.algorithm.on_sample(now, rtt_ms, inflight, dropped)

    def budget(self, baseline_inflight: float, optional_demand: float) -> Budget:
        """``baseline_inflight``: request equivalents of baseline work in flight;
        ``optional_demand``: request equivalents optional work would add at full targets."""
        if not (math.isfinite(baseline_inflight) and baseline_inflight >= 0):
            raise ValueError(f"baseline_inflight: must be ≥ 0 (got {baseline_inflight!r})")
        if not (math.isfinite(optional_demand) and optional_demand >= 0):
            raise ValueError(f"optional_demand: must be ≥ 0 (got {optional_demand!r})")
        slots = max(0.0, float(self.algorithm.limit) - baseline_inflight)
        if optional_demand <= 0.0:
            return Budget(slots, 1.0)
        return Budget(slots, min(1.0, slots / optional_demand))


class SreThrottle:
    """Client-side adaptive throttling (module docstring): counts of attempts and accepts over
    a trailing ``window_s``, in buckets of ``bucket_s``; :meth:`reject_probability` is the
    book's formula with multiplier ``k``."""

    def __init__(self, k: float = 2.0, window_s: float = 120.0, bucket_s: float = 1.0) -> None:
        c = FieldChecker("sre-throttle")
        c.at_least("k", k, 1.0)
        c.positive("window_s", window_s)
        c.positive("bucket_s", bucket_s)
        c.raise_if_any()
        self.k = float(k)
        self.window_s = float(window_s)
        self.bucket_s = float(bucket_s)
        self._buckets: deque[tuple[int, float, float]] = deque()  # (bucket, requests, accepts)
        self._requests = 0.0
        self._accepts = 0.0

    def _expire(self, now: float) -> None:
        oldest = math.floor((now - self.window_s) / self.bucket_s)
        while self._buckets and self._buckets[0][0] <= oldest:
            _, req, acc = self._buckets.popleft()
            self._requests -= req
            self._accepts -= acc
        if not self._buckets:
            self._requests = self._accepts = 0.0

    def record(self, now: float, requests: float, accepts: float) -> None:
        """``requests`` attempted at ``now`` (rejected locally or not), ``accepts`` of them
        the backend accepted (may be fractional: expected counts)."""
        if not (requests >= 0.0 and 0.0 <= accepts <= requests + 1e-9):
            raise ValueError(f"need 0 <= accepts <= requests (got {accepts!r}, {requests!r})")
        b = math.floor(now / self.bucket_s)
        if self._buckets and self._buckets[-1][0] == b:
            _, req, acc = self._buckets[-1]
            self._buckets[-1] = (b, req + requests, acc + accepts)
        else:
            self._buckets.append((b, requests, accepts))
        self._requests += requests
        self._accepts += accepts
        self._expire(now)

    def reject_probability(self, now: float) -> float:
        """``max(0, (requests − K·accepts) / (requests + 1))`` over the trailing window."""
        self._expire(now)
        return max(0.0, (self._requests - self.k * self._accepts) / (self._requests + 1.0))


PEER_POLICIES = ("aimd", "gradient", "envoy-gradient")


def make_limit(
    name: str, rng: np.random.Generator | None = None, now: float = 0.0
) -> ConcurrencyLimit:
    """Build a peer limit by policy name: ``aimd``, ``gradient`` (Netflix Gradient2) or
    ``envoy-gradient`` (needs ``rng``), with the published defaults."""
    if name == "aimd":
        return AimdLimit()
    if name == "gradient":
        return Gradient2Limit()
    if name == "envoy-gradient":
        if rng is None:
            raise ConfigError("policy envoy-gradient: needs a random generator for its jitter")
        return EnvoyGradientLimit(None, rng, now)
    raise ConfigError(f"policy: unknown peer policy {name!r} (known: {', '.join(PEER_POLICIES)})")
