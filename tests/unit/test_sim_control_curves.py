"""The simulator's control plane plans RMA with its context's ``control_curves``: the ground
truth's curves unless a run passes others (the engines' agreement test passes the streaming
controller's, measured on fewer users than its ground truth)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from headroom.controllers.levers import RmaCurve
from headroom.kernel.scenario_load import load_scenario
from headroom.sim.policies import PolicyFactory
from headroom.sim.run import build_context
from headroom.world.curves import ValueCurves

ROOT = Path(__file__).resolve().parents[2]


def curves(segments: tuple[str, ...], grid: list[int], base: list[float]) -> ValueCurves:
    """Base-model quality ``base`` at the ``grid``'s candidate counts; the strong model 0.1
    above."""
    s = len(segments)
    mean = np.empty((2, s, 3))
    mean[0] = base
    mean[1] = [b + 0.1 for b in base]
    return ValueCurves(
        segments=segments,
        n_grid=np.array(grid),
        mean=mean,
        std=np.full((2, s, 3), 0.1),
        age_grid_s=np.array([0.0, 3600.0]),
        precompute_mean=np.tile(np.array([0.7, 0.6]), (s, 1)),
        precompute_std=np.full((s, 2), 0.1),
        precompute_n=300,
        samples_per_segment=10,
    )


def test_the_plane_plans_rma_with_the_control_curves_and_defaults_to_the_ground_truth() -> None:
    scenario = load_scenario(ROOT / "scenarios" / "quickstart.yaml")
    names = tuple(s.name for s in scenario.segments)
    lo, hi = scenario.world.base_candidates, scenario.world.max_candidates
    grid = [lo, (lo + hi) // 2, hi]
    truth = curves(names, grid, [0.60, 0.64, 0.66])  # a knee half-way
    control = curves(names, grid, [0.60, 0.62, 0.64])  # linear
    ctx = build_context(scenario, curves=truth)
    assert ctx.control_curves is truth
    planned = PolicyFactory("headroom", ctx).plane
    assert planned is not None
    assert planned.rma_curve is not None
    own = RmaCurve.from_curves(truth, ctx.segment_names, ctx.n0, ctx.nmax)
    assert planned.rma_curve == own

    ctx = build_context(scenario, curves=truth, control_curves=control)
    assert ctx.curves is truth
    assert ctx.control_curves is control
    planned = PolicyFactory("headroom", ctx).plane
    assert planned is not None
    assert planned.rma_curve is not None
    other = RmaCurve.from_curves(control, ctx.segment_names, ctx.n0, ctx.nmax)
    assert planned.rma_curve == other != own
    seg = names[0]
    assert planned.rma_curve.hull(seg) != own.hull(seg)
