"""The oracle's LPs solved through HiGHS directly (headroom.sim.oracle._Lp) give linprog's
answers bit for bit: the same solution and duals for every menu, with and without the
stored-result option, at random right-hand sides and bounds, and each menu's kept LP is that
menu's (a kept matrix of another menu or layout would answer a different LP)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import linprog

from headroom.kernel.scenario_load import load_scenario
from headroom.sim.context import SimContext
from headroom.sim.oracle import Oracle
from tests.simulation.test_sim_runs import curves_of

ROOT = Path(__file__).resolve().parents[2]


def _oracle(name: str) -> Oracle:
    s = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
    return Oracle(SimContext(s, curves_of(s)))


def _reference(
    o: Oracle, pre: bool, levels: tuple[int, ...], b_ub: np.ndarray, lb: np.ndarray, ub: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    obj, a_ub = o._build_lp(pre, levels)  # built afresh: not the oracle's kept LP
    res = linprog(obj, A_ub=a_ub, b_ub=b_ub, bounds=list(zip(lb, ub, strict=True)), method="highs")
    assert res.status == 0
    return res.x, res.ineqlin.marginals


@pytest.mark.parametrize(("name", "pre"), [("quickstart", False), ("precompute-remote", True)])
def test_direct_highs_solves_match_linprog_bit_for_bit(name: str, pre: bool) -> None:
    o = _oracle(name)
    if pre:
        assert o.pre_gain is not None
    menus = [o.levels, o.levels[: max(1, len(o.levels) // 2)], o.levels[-2:]]
    rng = np.random.default_rng(7)
    n_c = o.share.size
    for i in range(24):
        lv = menus[i % len(menus)]
        layouts = (False, True) if pre else (False,)
        for with_pre in layouts:
            b = rng.uniform(0, 120, 4) * rng.integers(0, 2, 4)
            rho = rng.uniform(0, 1, o.ctx.pop.n_segments) if with_pre else None
            lb, ub = o._bound_arrays(rho, len(lv))
            if i % 3 == 2:  # the live plan's shape: per cell a kept share below 1
                ub = ub * rng.uniform(0.2, 1.0, ub.size)
            b_ub = np.concatenate([rng.uniform(0.3, 1.0, n_c), b])
            x, duals = o._lp(o._menu(lv), with_pre).solve(b_ub, lb, ub)
            x_ref, duals_ref = _reference(o, with_pre, lv, b_ub, lb, ub)
            assert np.array_equal(x, x_ref)
            assert np.array_equal(duals, duals_ref)
            via, via_duals = o._lp(o._menu(lv), with_pre).solve(b_ub, lb, ub, via_linprog=True)
            assert np.array_equal(via, x_ref)
            assert np.array_equal(via_duals, duals_ref)


def test_bound_arrays_are_the_bounds_list() -> None:
    o = _oracle("precompute-remote")
    rho = np.random.default_rng(3).uniform(0, 1.5, o.ctx.pop.n_segments)
    for r in (None, rho):
        lb, ub = o._bound_arrays(r)
        expect: list[tuple[float, float]] = []
        for c in range(o.share.size):
            expect += [(0.0, 1.0)] * len(o.levels) + [(0.0, o.elig)]
            if r is not None:
                expect.append((0.0, min(float(r[int(o.ctx.pop.seg[c])]), 1.0)))
        assert list(zip(lb.tolist(), ub.tolist(), strict=True)) == expect
        assert o._bounds(r) == expect


def test_the_direct_path_is_taken_where_scipy_has_the_binding() -> None:
    try:
        import scipy.optimize._highspy._core  # noqa: F401
    except ImportError:  # pragma: no cover - an older scipy
        pytest.skip("this scipy has no HiGHS binding of its own")
    from headroom.sim import oracle

    assert oracle._highs is not None
    o = _oracle("quickstart")
    assert o._lp(o._menu(o.levels), False)._model is not None
