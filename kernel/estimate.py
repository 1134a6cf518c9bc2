"""The holdout estimator: a post-stratified, regression-adjusted difference of means.

Pure arithmetic on sums (no numpy, no I/O): the controllers' value book and the analyzer both
estimate with it, from the same kind of sums, so the figure the allocator acts on and the figure
the report prints are one estimator's.

Data. Requests are held out at random (the control arm, no optional work) or not (the treatment
group, split into *arms* by what a request received: ``rma``, ``sbm``, ``precompute``, ``none``).
Per *stratum* ``h`` (a segment, or a segment × value bin: the request's value signal is known
before ranking in both arms) and arm, the sums :class:`Moments` carry ``n``, ``Σy``, ``Σy²`` of the
observed value ``y`` and, when the writer knows it, ``Σx``, ``Σx²``, ``Σxy`` of the request's
value signal ``x`` (its value before ranking).

Estimator. Per stratum, the adjusted difference of arm ``L`` against the control arm ``C`` is::

    d_{L,h} = (ȳ_{L,h} − ȳ_{C,h}) − θ_g · (x̄_{L,h} − x̄_{C,h})

with ``θ_g`` the control arm's least-squares slope of ``y`` on ``x`` pooled within the strata of a
group ``g`` (a segment: ``θ_g = Σ_h S_xy,h / Σ_h S_xx,h`` over its strata, centred per stratum).
``θ = 0`` (no signal sums) is the plain post-stratified difference. The incremental value of a set
of arms ``A`` is ``Σ_h Σ_{L∈A} n_{L,h} · d_{L,h}`` and its variance::

    Σ_h [ Σ_{L∈A} n_{L,h} · s²_{e,L,h} + (Σ_{L∈A} n_{L,h})² · s²_{e,C,h} / n_{C,h} ]

where ``s²_e = s²_y − 2θ·s_xy + θ²·s²_x`` is the sample variance of the residual ``y − θx`` (the
first term the noise of the treated sums, the second that of the one control mean every arm of
the stratum subtracts), plus, per group, ``(Σ_h Σ_{L∈A} n_{L,h}(x̄_{L,h} − x̄_{C,h}))² · Var(θ_g)``
for the noise of the slope itself (it matters when the arms sit far from the control in ``x``:
one value-ranked arm alone). An arm with fewer than 2 requests borrows the control's residual
variance. A stratum with treated requests but fewer than 2 control requests is merged with the
other such strata of its group (sums add); if the merged stratum still has fewer than 2 control
requests its treated requests are left out and the group is reported unusable.

Thin control arms. ``s²_{e,C,h}`` rests on the control arm's own requests, and a stratum of a
small holdout holds a handful in a control interval (quickstart's 2 %: 3–20 per premium bin in
the first minutes). Its variance then is itself a noisy guess, and the weight of a stratum
moves with it: a control arm whose few requests happen to sit close together reads as precise.
The treated arms of the same stratum measure the same spread on hundreds of requests (a lever
moves the mean far more than the spread), so the control's residual variance is shrunk towards
theirs (pooled over the treated arms) with the weight of :data:`CONTROL_PRIOR_DOF` degrees of
freedom (:func:`control_variance`): ``((n_C − 1)·s²_C + k·s²_T) / (n_C − 1 + k)``. A control arm
of 11 requests counts half its own spread, one of 200 about 95 % (docs/analysis.md, *Thin
control arms*; BENCHMARKS.md, *Simulator outcome targets*). The treated arms count ``k``
whatever their size once one has two requests: where they are thin as well, the stratum weighs
little either way.

Failures in the control. Where the sums report the requests that failed or timed out (``nf``,
``xf = Σx``, ``xxf = Σx²`` of them), a failed *control* request is taken as harm optional work did
through the queues every arm shares (the baseline is provisioned to serve every request): the
slope is fitted on the control's delivered requests, each failed control request is imputed
``θ·x`` (what a delivered one of its value brings), and the total also counts the control's own
loss, ``−θ·Σ xf``. Without this, harm that falls on treated and control requests alike cancels
out of the difference. A baseline that itself fails requests breaks it (its failures are then
counted as harm).

Why it is unbiased, and when it is not (docs/analysis.md, *The holdout estimator*): holdout is
random within a stratum, so the treatment group as a whole is comparable with the control arm of
its stratum, and the sum over every treatment arm (``none`` included) estimates the treatment
group's incremental value without bias whatever the arms' selection. One arm alone is a
selected subset (value-ranked RMA takes the highest values of a bin); the regression term
corrects for that selection on ``x`` as long as the control's ``E[y | x]`` is linear in ``x``
within a stratum with the group's slope. The estimate compares requests in the same queues: harm
that optional work does to the control arm too is seen only as far as it makes control requests
fail or time out (above); a slowdown that stays inside the timeout is invisible to it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "CONTROL",
    "CONTROL_PRIOR_DOF",
    "Z_95",
    "Estimate",
    "Moments",
    "adjusted_difference",
    "control_variance",
    "estimate",
    "slope",
    "slope_variance",
]

CONTROL = "control"
# the weight, in degrees of freedom, of the treated arms' residual variance in a control arm's
# (module docstring, *Thin control arms*)
CONTROL_PRIOR_DOF = 10.0
# 97.5th percentile of the standard normal: the two-sided 95 % interval.
Z_95 = 1.959963984540054


@dataclass(slots=True)
class Moments:
    """Sums of one (stratum, arm); they add exactly across windows and sources. The signal
    sums are 0 where the writer does not report the value signal (then ``θ = 0``)."""

    n: float = 0.0
    y: float = 0.0
    yy: float = 0.0
    x: float = 0.0
    xx: float = 0.0
    xy: float = 0.0
    # of those requests, the ones that failed or timed out (they delivered y = 0): their count
    # and the sums of their value signal (0 where the writer does not report them)
    nf: float = 0.0
    xf: float = 0.0
    xxf: float = 0.0

    def add(self, other: Moments) -> None:
        self.n += other.n
        self.y += other.y
        self.yy += other.yy
        self.x += other.x
        self.xx += other.xx
        self.xy += other.xy
        self.nf += other.nf
        self.xf += other.xf
        self.xxf += other.xxf

    def delivered(self) -> Moments:
        """The requests that did not fail (a failed request's y is 0: its y sums are 0)."""
        return Moments(
            self.n - self.nf, self.y, self.yy, self.x - self.xf, self.xx - self.xxf, self.xy
        )

    def imputed(self, theta: float) -> Moments:
        """The arm as if no request had failed: each failed one delivers ``θ·x``."""
        t = theta
        return Moments(
            self.n,
            self.y + t * self.xf,
            self.yy + t * t * self.xxf,
            self.x,
            self.xx,
            self.xy + t * self.xxf,
        )

    @property
    def mean_y(self) -> float:
        return self.y / self.n if self.n > 0 else 0.0

    @property
    def mean_x(self) -> float:
        return self.x / self.n if self.n > 0 else 0.0

    def centred(self) -> tuple[float, float, float]:
        """``(S_yy, S_xy, S_xx)``: sums of squares and products about the arm's means."""
        if self.n <= 0:
            return 0.0, 0.0, 0.0
        syy = max(self.yy - self.y * self.y / self.n, 0.0)
        sxx = max(self.xx - self.x * self.x / self.n, 0.0)
        sxy = self.xy - self.x * self.y / self.n
        return syy, sxy, sxx

    def residual_variance(self, theta: float) -> float:
        """Unbiased sample variance of ``y − θx`` (0 for fewer than 2 requests)."""
        if self.n < 2:
            return 0.0
        syy, sxy, sxx = self.centred()
        return max(syy - 2.0 * theta * sxy + theta * theta * sxx, 0.0) / (self.n - 1.0)


@dataclass(frozen=True, slots=True)
class Estimate:
    """An estimate of incremental value (a total, or per treated request) and its variance."""

    value: float
    variance: float
    n_treatment: float = 0.0
    n_control: float = 0.0
    unusable: tuple[str, ...] = ()

    @property
    def se(self) -> float:
        return math.sqrt(self.variance) if self.variance > 0 else 0.0

    @property
    def ci95(self) -> tuple[float, float]:
        half = Z_95 * self.se
        return (self.value - half, self.value + half)


def slope(controls: Iterable[Moments]) -> float:
    """The control arms' least-squares slope of ``y`` on ``x``, pooled within strata (0 when
    the signal does not vary or is not reported)."""
    sxy = sxx = 0.0
    for c in controls:
        if c.n < 2:
            continue
        _, a, b = c.centred()
        sxy += a
        sxx += b
    if not (sxx > 0.0 and math.isfinite(sxy) and math.isfinite(sxx)):
        return 0.0
    # a signal that barely varies (relative to its scale) gives no usable slope
    return sxy / sxx


def slope_variance(controls: Iterable[Moments], theta: float) -> float:
    """Variance of the pooled slope: ``σ²_e / Σ_h S_xx,h`` with ``σ²_e`` the control arms'
    residual variance about their stratum means (0 without signal sums)."""
    sxx = rss = dof = 0.0
    for c in controls:
        if c.n < 2:
            continue
        syy, sxy, sxx_h = c.centred()
        sxx += sxx_h
        rss += max(syy - 2.0 * theta * sxy + theta * theta * sxx_h, 0.0)
        dof += c.n - 1.0
    if not (sxx > 0.0 and dof > 1.0):
        return 0.0
    return rss / (dof - 1.0) / sxx


def control_variance(c: Moments, theta: float, treated_var: float, treated_dof: float) -> float:
    """The control arm's residual variance shrunk towards the treated arms' ``treated_var``
    (on ``treated_dof`` degrees of freedom) with the weight of :data:`CONTROL_PRIOR_DOF`
    (module docstring, *Thin control arms*); its own alone when no treated arm has two
    requests."""
    own = c.residual_variance(theta)
    if not (treated_dof > 0.0 and c.n >= 2 and math.isfinite(treated_var)):
        return own
    return ((c.n - 1.0) * own + CONTROL_PRIOR_DOF * treated_var) / (c.n - 1.0 + CONTROL_PRIOR_DOF)


def adjusted_difference(t: Moments, c: Moments, theta: float) -> tuple[float, float]:
    """Per treated request, ``d = (ȳ_t − ȳ_c) − θ(x̄_t − x̄_c)`` and its variance
    ``s²_e,t/n_t + s²_e,c/n_c`` (the module docstring's stratum term, the control's variance
    shrunk towards the treated arm's: :func:`control_variance`; ``n ≥ 2`` in the control)."""
    d = (t.mean_y - c.mean_y) - theta * (t.mean_x - c.mean_x)
    if t.n >= 2:
        var_t = t.residual_variance(theta)
        var_c = control_variance(c, theta, var_t, t.n - 1.0)
    else:
        var_c = var_t = c.residual_variance(theta)
    return d, var_t / t.n + var_c / c.n


def estimate(
    strata: Mapping[str, Mapping[str, Moments]],
    *,
    arms: Collection[str] | None = None,
    group_of: Callable[[str], str] = lambda key: key,
) -> Estimate:
    """The incremental value of the treatment arms ``arms`` (None: every arm but the control)
    over ``strata`` ``{STRATUM: {ARM: Moments}}`` (module docstring). ``group_of`` maps a
    stratum to the group whose control arms share one slope (a segment)."""

    def chosen(name: str) -> bool:
        return name != CONTROL and (arms is None or name in arms)

    groups: dict[str, list[str]] = {}
    for key in sorted(strata):
        groups.setdefault(group_of(key), []).append(key)
    total = variance = n_t_all = n_c_all = 0.0
    unusable: list[str] = []
    for group, keys in groups.items():
        raw = {k: strata[k][CONTROL] for k in keys if CONTROL in strata[k]}
        failed = any(c.xf > 0.0 for c in raw.values())
        if failed:
            # the baseline serves every request: a control request that failed is harm done
            # by optional work (shared queues); it would have delivered like the control's
            # delivered requests of its value (module docstring, *Failures in the control*)
            theta = slope(c.delivered() for c in raw.values())
            ctl = {k: c.imputed(theta) for k, c in raw.items()}
        else:
            theta = slope(raw.values())
            ctl = raw
        controls = list(ctl.values())
        shift = 0.0  # Σ n_L (x̄_L − x̄_C): how far the treated sit from the control in x
        if arms is None and failed:
            # the control's own loss belongs to the total
            lost = sum(c.xf for c in raw.values())
            total -= theta * lost
            shift -= lost
        # strata without a usable control arm are merged (their sums add)
        usable: list[Mapping[str, Moments]] = []
        merged: dict[str, Moments] = {}
        for k in keys:
            by_arm = {**strata[k], CONTROL: ctl[k]} if k in ctl else strata[k]
            c = by_arm.get(CONTROL)
            if c is not None and c.n >= 2:
                usable.append(by_arm)
                continue
            for name, m in by_arm.items():
                merged.setdefault(name, Moments()).add(m)
        if merged:
            usable.append(merged)
        for by_arm in usable:
            treated = [m for name, m in by_arm.items() if chosen(name) and m.n > 0]
            if not treated:
                continue
            c = by_arm.get(CONTROL)
            if c is None or c.n < 2:
                unusable.append(group)
                continue
            n_t = 0.0
            # each treated arm's residual variance (one of fewer than 2 requests borrows the
            # control's own), and theirs pooled: the control's shrinks towards it
            own_c = c.residual_variance(theta)
            var_ts = [m.residual_variance(theta) if m.n >= 2 else own_c for m in treated]
            dof = sum(m.n - 1.0 for m in treated if m.n >= 2)
            pooled = (
                sum((m.n - 1.0) * v for m, v in zip(treated, var_ts, strict=True) if m.n >= 2) / dof
                if dof > 0.0
                else 0.0
            )
            var_c = control_variance(c, theta, pooled, dof)
            for m, var_t in zip(treated, var_ts, strict=True):
                d, _ = adjusted_difference(m, c, theta)
                total += m.n * d
                shift += m.n * (m.mean_x - c.mean_x)
                variance += m.n * var_t
                n_t += m.n
            variance += n_t * n_t * var_c / c.n
            n_t_all += n_t
            n_c_all += c.n
        variance += shift * shift * slope_variance(controls, theta)
    if not (math.isfinite(total) and math.isfinite(variance)):
        return Estimate(0.0, math.inf, n_t_all, n_c_all, tuple(unusable))
    return Estimate(total, variance, n_t_all, n_c_all, tuple(unusable))
