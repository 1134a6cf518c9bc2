"""Measured uplift for the precompute planner: value signals in, a calibrated uplift model out.

:class:`headroom.controllers.precompute.UpliftModel` predicts the uplift of a served visit from the
ranking world's curves, ``Δ_s(a) = k_s · v̄_s · (Q_s^strong(n) · ρ_s(a) − B_s − m)`` with ``k_s =
1``. The design says value is *measured* against a control arm, never assumed; this module is the
pure piece that closes the loop (no clock, no I/O: times are passed in; ``workers/precompute.py``
drives it from Kafka).

**What is measured.** Clients publish value signals of lever ``precompute`` on ``headroom.value``
(docs/messages.md): treatment = visits served from a stored result (hits), control = held-out visits
that found one. Both arms found a result, so the difference of their means is the uplift of
serving a stored result, free of the choice of whom to precompute for. The signals of this
region and lever are folded into a :class:`headroom.controllers.levers.ValueBook`, keyed by
``stratum_key(segment, stratum)`` like the controller's, so each segment's uplift is
post-stratified on the request's value bin (``ValueBook.uplift``: per stratum ``d = mean_t −
mean_c`` weighted by treated counts, ``se² = Σ w² (var_t/n_t + var_c/n_c)``). The book is
discounted once per window of event time, ``S ← γ·S`` with ``γ = 0.5 ** (window_s /
half_life_s)``, so the estimate follows a drifting world with a known memory. Signals of other
regions, other levers and unknown segments are ignored (counted in :attr:`UpliftCalibrator.
ignored`).

**At which age.** The measured uplift is a mean over the served visits, whose results had
different ages ``a`` (staleness), so it estimates ``E[Δ_s(a)]`` over the staleness distribution,
not ``Δ_s`` at one age. The worker sees the staleness itself: every request of a user that finds
an unexpired result of the same segment in the worker's own store is a visit of the measured
population (hit or held out: the holdout draw is independent of the age), and its age is fed to
:meth:`UpliftCalibrator.observe_staleness`, into a discounted histogram per segment (the same
``γ``). The curves' prediction for the same visits is then ``Δ̄_s = Σ_a w_a Δ_s(a) / Σ_a w_a``
and the measured scale ``k_s = d_s / Δ̄_s``. :meth:`UpliftModel.with_measured` takes one
``(uplift, age)`` pair and sets ``Δ_s(age) = uplift``; it is given the *effective age* ``a*``, the
age at which the curves' ``Δ_s(a*) = Δ̄_s`` (it exists: ``Δ̄_s`` is a mean of the piecewise-linear
``Δ_s`` over the observed ages), so the rescaled segment is exactly ``k_s`` times the curves'.
With a ``Δ_s`` linear in age over the served ages ``a*`` is the mean staleness; the median
staleness is reported beside it. A segment with no staleness observed yet (the worker has seen no
visit to a live result of its own) falls back to the age the model predicts for served visits:
uniform over the result's lifetime ``[0, L_s]``, i.e. ``Δ̄_s = F_s(L_s) / L_s`` (``staleness_source:
"model"`` in :class:`SegmentCalibration`).

**When to believe it.** A segment is rescaled only when both arms hold at least
``min_samples`` (discounted) samples and the measurement is precise relative to what the curves
predict: ``se_s ≤ max_rel_se · Δ̄_s`` — the scale ``k_s`` is then known to ``± max_rel_se``
(one standard error). Otherwise the curves stand (``k_s = 1``). So a measured uplift at or below
zero switches the segment off (``k_s = 0``, :meth:`UpliftModel.with_measured`) only when it lies at
least ``1 / max_rel_se`` standard errors below the prediction (4 with the default 0.25): with
confidence; a noisy one changes nothing. The lifetime ``L_s`` stays the curves' (the shape of the
decay is measured on the world's own models; only its level is calibrated).

**Re-trying a switched-off segment.** An off segment gets no new results, so its hits stop and
its discounted sums fade; once they fail the rule above the curves' ``k_s = 1`` returns and the
segment is precomputed again, which measures it afresh. With the defaults that is a few
half-lives after it went off: exploration at the rate the world is allowed to change.

Rebuild from the curves' model each time (:meth:`UpliftCalibrator.calibrate`), never from an
already rescaled one, so scales do not compound.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from headroom.controllers.config import ValueSettings
from headroom.controllers.levers import ValueBook
from headroom.controllers.observe import arm_stats
from headroom.controllers.precompute import UpliftModel
from headroom.controllers.types import stratum_key
from headroom.kernel.checks import FieldChecker
from headroom.kernel.errors import ConfigError
from headroom.kernel.jsonstate import Snapshotting
from headroom.streams.messages import ValueSignal

__all__ = [
    "LEVER",
    "CalibrationSettings",
    "SegmentCalibration",
    "UpliftCalibrator",
    "effective_age",
]

LEVER = "precompute"
_PREFIX = "precompute.calibration"
_STALENESS_BINS = 256  # histogram bins over [0, max_age_s]: 56 s each at the 4 h cap

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class CalibrationSettings:
    """When measured value signals rescale a segment (module docstring)."""

    # Discounted samples each arm (treatment = hits, control = held out) must hold.
    min_samples: float = 100.0
    # Rescale only when the measurement's standard error is at most this share of the curves'
    # predicted uplift: the scale is then known to ±0.25, and an uplift <= 0 is >= 4 se below it.
    max_rel_se: float = 0.25
    # Memory of the sums and the staleness histogram (event-time seconds): the controller's
    # value book's half-life.
    half_life_s: float = ValueSettings().half_life_s
    # A change of the scale by at least this much (or of the status) is reported as an event.
    report_change: float = 0.1

    def __post_init__(self) -> None:
        c = FieldChecker(_PREFIX)
        c.at_least("min_samples", self.min_samples, 2.0)
        c.at_least("max_rel_se", self.max_rel_se, 0.0, strict=True)
        c.at_least("half_life_s", self.half_life_s, 0.0, strict=True)
        c.at_least("report_change", self.report_change, 0.0)
        if c.problems:
            raise ConfigError(c.problems)


@dataclass(frozen=True, slots=True)
class SegmentCalibration:
    """One segment's measurement and what the planner uses."""

    index: int
    segment: str
    scale: float  # k_s in force: 1 = the curves' (status "curves"), 0 = switched off
    status: str  # "curves" (no confident measurement), "measured", "off"
    reason: str  # "confident", "few_samples", "noisy", "no_prediction"
    n_treatment: float  # discounted samples behind the estimate
    n_control: float
    uplift: float | None  # measured uplift per served visit (treatment − control), value units
    se: float | None  # its standard error (None: no estimate)
    predicted: float | None  # the curves' mean uplift over the same visits' staleness
    at_age_s: float | None  # the effective age handed to UpliftModel.with_measured
    staleness_p50_s: float | None  # median staleness of the visits (or of the model's guess)
    staleness_source: str  # "measured" (visits seen by the worker) or "model" (uniform on L_s)

    @property
    def confident(self) -> bool:
        return self.reason == "confident"

    def changed_from(self, previous: SegmentCalibration | None, threshold: float) -> bool:
        """Worth an event: another status, or the scale moved by ``threshold`` or more."""
        old_status = "curves" if previous is None else previous.status
        old_scale = 1.0 if previous is None else previous.scale
        return self.status != old_status or abs(self.scale - old_scale) >= threshold

    def event_fields(self) -> dict[str, Any]:
        def r(x: float | None, nd: int = 6) -> float | None:
            return None if x is None or not math.isfinite(x) else round(x, nd)

        return {
            "segment": self.segment,
            "scale": round(self.scale, 6),
            "status": self.status,
            "reason": self.reason,
            "uplift_per_visit": r(self.uplift),
            "se": r(self.se),
            "predicted_per_visit": r(self.predicted),
            "at_age_s": r(self.at_age_s, 1),
            "staleness_p50_s": r(self.staleness_p50_s, 1),
            "staleness_source": self.staleness_source,
            "n_treatment": round(self.n_treatment, 1),
            "n_control": round(self.n_control, 1),
        }


def effective_age(ages_s: FloatArray, delta: FloatArray, level: float) -> float | None:
    """The first age at which the piecewise-linear ``delta`` (on ``ages_s``) equals ``level``,
    or None when it never does."""
    g = delta - level
    hit = np.flatnonzero(g == 0.0)
    cross = np.flatnonzero(g[:-1] * g[1:] < 0.0)
    first_hit = int(hit[0]) if len(hit) else None
    first_cross = int(cross[0]) if len(cross) else None
    if first_hit is not None and (first_cross is None or first_hit <= first_cross):
        return float(ages_s[first_hit])
    if first_cross is None:
        return None
    j = first_cross
    a0, a1 = float(ages_s[j]), float(ages_s[j + 1])
    g0, g1 = float(g[j]), float(g[j + 1])
    return a0 + (a1 - a0) * g0 / (g0 - g1)


class UpliftCalibrator:
    """Value signals and staleness of one region's precompute lever → per-segment scales."""

    def __init__(
        self,
        region: str,
        segment_names: Sequence[str],
        window_s: float,
        max_age_s: float,
        settings: CalibrationSettings | None = None,
    ) -> None:
        if not (math.isfinite(window_s) and window_s > 0.0):
            raise ValueError("window_s must be > 0")
        if not (math.isfinite(max_age_s) and max_age_s > 0.0):
            raise ValueError("max_age_s must be > 0")
        self.region = region
        self.segment_names = tuple(segment_names)
        self.settings = settings or CalibrationSettings()
        self.window_s = float(window_s)
        self.gamma = 0.5 ** (self.window_s / self.settings.half_life_s)
        self.book = ValueBook()
        self._edges = np.linspace(0.0, float(max_age_s), _STALENESS_BINS + 1)
        self._centers: FloatArray = 0.5 * (self._edges[1:] + self._edges[:-1])
        self._staleness: FloatArray = np.zeros((len(self.segment_names), _STALENESS_BINS))
        self._window: int | None = None  # newest event-time window seen
        self.used = 0  # value signals folded in
        self.ignored: Counter[str] = Counter()  # by reason: region, lever, segment

    # -- inputs -----------------------------------------------------------------------------------

    def advance(self, t: float) -> None:
        """Event time ``t`` has been reached: discount once per window boundary passed."""
        if not math.isfinite(t):
            return
        k = math.floor(t / self.window_s)
        if self._window is None:
            self._window = k
            return
        if k <= self._window:
            return
        factor = self.gamma ** (k - self._window)
        self.book.decay(factor)
        self._staleness *= factor
        self._window = k

    def add_signal(self, msg: ValueSignal, t: float) -> bool:
        """Fold one ``headroom.value`` message in (``t``: its event time, the caller's clock);
        False when it is not this region's precompute lever or names an unknown segment."""
        if msg.region != self.region:
            self.ignored["region"] += 1
            return False
        if msg.lever != LEVER:
            self.ignored["lever"] += 1
            return False
        if msg.segment not in self.segment_names:
            self.ignored["segment"] += 1
            return False
        self.advance(t)
        self.book.add({(stratum_key(msg.segment, msg.stratum), LEVER, msg.arm): arm_stats(msg)})
        self.used += 1
        return True

    def observe_staleness(self, segment: int, age_s: float, t: float) -> None:
        """A visit of ``segment`` found a live result ``age_s`` old (event time ``t``)."""
        if not (0 <= segment < len(self.segment_names)) or not (
            math.isfinite(age_s) and age_s >= 0.0
        ):
            return
        self.advance(t)
        i = min(int(np.searchsorted(self._edges, age_s, side="right")) - 1, _STALENESS_BINS - 1)
        self._staleness[segment, i] += 1.0

    def staleness_weight(self, segment: int) -> float:
        """Discounted count of the visits whose staleness was observed."""
        return float(self._staleness[segment].sum())

    # -- estimates --------------------------------------------------------------------------------

    def measure(self, base: UpliftModel) -> list[SegmentCalibration]:
        """Every segment's measurement against the curves' model ``base``."""
        return [self._measure(i, name, base) for i, name in enumerate(self.segment_names)]

    def _measure(self, i: int, name: str, base: UpliftModel) -> SegmentCalibration:
        cfg = self.settings
        w = self._staleness[i]
        total = float(w.sum())
        life = base.lifetime(i)
        if total > 0.0:
            source = "measured"
            predicted = float(np.dot(w, base.uplift(i, self._centers)) / total)
            cdf = np.cumsum(w) / total
            p50 = float(self._centers[int(np.searchsorted(cdf, 0.5))])
        else:
            source = "model"
            predicted = float(base.integral(i, life)) / life if life > 0.0 else 0.0
            p50 = life / 2.0
        up = self.book.uplift(LEVER, name)
        estimate = up.se < math.inf and math.isfinite(up.mean)

        def result(
            reason: str, scale: float = 1.0, status: str = "curves", age: float | None = None
        ) -> SegmentCalibration:
            return SegmentCalibration(
                index=i,
                segment=name,
                scale=scale,
                status=status,
                reason=reason,
                n_treatment=up.n_treatment,
                n_control=up.n_control,
                uplift=up.mean if estimate else None,
                se=up.se if estimate else None,
                predicted=predicted if math.isfinite(predicted) else None,
                at_age_s=age,
                staleness_p50_s=p50,
                staleness_source=source,
            )

        if not (math.isfinite(predicted) and predicted > 0.0 and life > 0.0):
            return result("no_prediction")  # the curves already switch it off: nothing to scale
        if not estimate or up.n_treatment < cfg.min_samples or up.n_control < cfg.min_samples:
            return result("few_samples")
        if up.se > cfg.max_rel_se * predicted:
            return result("noisy")
        age = effective_age(base.ages_s, base.delta[i], predicted)
        if age is None:  # cannot happen for a mean of Δ over its own grid; keep the curves
            return result("no_prediction")
        scale = max(up.mean, 0.0) / predicted
        return result("confident", scale, "measured" if up.mean > 0.0 else "off", age)

    def calibrate(self, base: UpliftModel) -> tuple[UpliftModel, list[SegmentCalibration]]:
        """The curves' model with every confidently measured segment rescaled
        (:meth:`UpliftModel.with_measured`), and every segment's measurement."""
        cals = self.measure(base)
        model = base
        for c in cals:
            if c.confident and c.uplift is not None and c.at_age_s is not None:
                model = model.with_measured(c.index, c.uplift, c.at_age_s)
        return model, cals

    # -- state ----------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {
            "window": self._window,
            "book": self.book.snapshot(),
            "staleness": self._staleness.tolist(),
            "used": self.used,
            "ignored": dict(self.ignored),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue from a :meth:`snapshot`; its ``book`` may be in any form
        :meth:`ValueBook.restore` reads."""
        hist = np.asarray(state["staleness"], dtype=np.float64)
        if hist.shape != self._staleness.shape:
            raise ValueError(f"staleness histogram must have shape {self._staleness.shape}")
        self._window = None if state["window"] is None else int(state["window"])
        self.book.restore(state["book"])
        self._staleness = hist
        self.used = int(state["used"])
        self.ignored = Counter({str(k): int(v) for k, v in state["ignored"].items()})


_SNAPSHOTTING: tuple[type[Snapshotting], ...] = (UpliftCalibrator,)  # checked by mypy
