"""The value book's model-scaled estimate (``ValueBook.scaled``) and SBM's per-stratum tranches.

A lever that works mostly in a segment's top value bin, and explores a little in the others,
has its value per unit of work read by the inverse-variance mean (``ValueBook.per_unit``) far
below what its work in the top bin earns: the quiet low-value strata weigh most. Scaling a model
of the uplift (proportional to the request's value signal) by the measured ratio recovers every
bin's value, so the allocator compares the strong model's next request with RMA's at its worth.
"""

from __future__ import annotations

import numpy as np
import pytest

from headroom.controllers.levers import (
    CostModel,
    LeverContext,
    SbmLever,
    ValueBook,
)
from headroom.controllers.types import ArmStats, segment_of, stratum_key
from headroom.defences.plan import VALUE_BINS

COSTS = CostModel(0.1, 0.02, 0.005, 0.1, 400, ("gpu-a", "gpu-b"), ("gpu-b",), 120.0)
STRONG_MS = 400 * 0.1  # accelerator ms of one strong request: one unit of SBM work
KAPPA = 0.15  # the world's uplift per unit of value signal of a request the strong model serves


def _stats(y: np.ndarray, x: np.ndarray, acc_ms: float = 0.0) -> ArmStats:
    return ArmStats(
        int(y.size),
        float(y.sum()),
        float((y * y).sum()),
        0.0,
        acc_ms,
        float(x.sum()),
        float((x * x).sum()),
        float((x * y).sum()),
    )


def _world(
    rng: np.random.Generator, treated: dict[str, list[int]], kappa: dict[str, float]
) -> dict[tuple[str, str, str], ArmStats]:
    """Per stratum of each segment: a control arm of 3,000 requests and ``treated[seg][k]``
    requests the strong model served, values log-normal around a mean rising with the bin, the
    treated ones gaining ``kappa[seg]`` × their value."""
    out: dict[tuple[str, str, str], ArmStats] = {}
    for seg, counts in treated.items():
        for k, n_t in enumerate(counts):
            key = stratum_key(seg, k)
            level = 0.2 * 1.4**k
            x_c = level * np.exp(rng.normal(0.0, 0.1, 3000))
            y_c = x_c * rng.normal(1.0, 0.3, x_c.size)
            out[(key, "sbm", "control")] = _stats(y_c, x_c)
            if n_t == 0:
                continue
            x_t = level * np.exp(rng.normal(0.0, 0.1, n_t))
            y_t = x_t * rng.normal(1.0, 0.3, n_t) + kappa[seg] * x_t
            out[(key, "sbm", "treatment")] = _stats(y_t, x_t, n_t * STRONG_MS)
    return out


def test_scaled_recovers_the_uplift_per_unit_of_value_where_per_unit_reads_low() -> None:
    rng = np.random.default_rng(11)
    explored = [40] * (VALUE_BINS - 1) + [20_000]  # the top bin served, the rest explored
    book = ValueBook()
    book.add(_world(rng, {"casual": explored}, {"casual": KAPPA}))
    unit = SbmLever(COSTS).unit_cost()
    k = book.scaled("sbm", unit, lambda seg, e: e)
    assert k is not None
    assert abs(k.mean - KAPPA) < 3.0 * k.se
    assert k.se < 0.2 * KAPPA
    # the top bin's value per unit, as the world makes it, against the two estimates
    top = 0.2 * 1.4 ** (VALUE_BINS - 1) * float(np.exp(0.005))
    pooled = book.per_unit("sbm", unit)
    assert pooled is not None
    assert pooled.mean < 0.5 * KAPPA * top  # pulled down to the explored bins' value
    assert abs(k.mean * top - KAPPA * top) < 3.0 * k.se * top
    # a model that predicts nothing gives no estimate to scale, not a division by zero
    assert book.scaled("sbm", unit, lambda seg, e: 0.0).se == float("inf")
    # signals without value-signal sums: nothing to scale (the callers fall back)
    plain = ValueBook()
    plain.add(
        {
            ("casual#7", "sbm", "treatment"): ArmStats(100, 130.0, 200.0, 0.0, 100 * STRONG_MS),
            ("casual#7", "sbm", "control"): ArmStats(100, 100.0, 150.0),
        }
    )
    assert plain.scaled("sbm", unit, lambda seg, e: e) is None
    assert ValueBook().scaled("sbm", unit, lambda seg, e: e) is None


def test_sbms_tranches_are_per_stratum_and_worth_their_bins_value() -> None:
    rng = np.random.default_rng(5)
    counts = {
        "casual": [40] * (VALUE_BINS - 1) + [20_000],
        "premium": [0] * VALUE_BINS,  # never served: valued at the pooled ratio, not its own
    }
    book = ValueBook()
    book.add(_world(rng, counts, {"casual": KAPPA, "premium": 0.0}))
    lever = SbmLever(COSTS)
    ctx = LeverContext(300.0, 300.0, segment_rps={"casual": 255.0, "premium": 45.0})
    tranches = lever.tranches(book, ctx, 1.645, 30.0)
    assert [t.segment for t in tranches] == [
        stratum_key(s, k) for s in ("casual", "premium") for k in range(VALUE_BINS)
    ]
    for seg, rps in ctx.segment_rps.items():
        mine = [t for t in tranches if segment_of(str(t.segment)) == seg]
        # each bin may take its share of the segment's demand, no more in all
        assert sum(t.demand for t in mine) == pytest.approx(rps)
        means = [t.estimate.mean for t in mine]
        assert means == sorted(means)  # a higher bin is worth more per strong request
        assert all(t.own == (seg == "casual") for t in mine)
    top = tranches[VALUE_BINS - 1]
    truth = KAPPA * 0.2 * 1.4 ** (VALUE_BINS - 1)
    assert abs(top.estimate.mean - truth) < 3.0 * top.estimate.se
    assert top.estimate.lcb < top.estimate.mean < top.estimate.ucb
    # no value signals: the one tranche per segment, valued by the segment's own estimate
    flat = ValueBook()
    flat.add(
        {
            ("casual", "sbm", "treatment"): ArmStats(500, 650.0, 900.0, 0.0, 500 * STRONG_MS),
            ("casual", "sbm", "control"): ArmStats(500, 500.0, 600.0),
        }
    )
    assert [t.segment for t in lever.tranches(flat, ctx, 1.645, 30.0)] == ["casual", "premium"]
