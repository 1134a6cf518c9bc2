"""A simulated window's holdout strata, sampled latencies and sketches.

The pieces :class:`headroom.sim.engine.RegionRun` closes a window with: the strata sums the
estimator reads, the per-window latency samples and sketches, and the precompute arm.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

from headroom.controllers.types import (
    LEVER_PRECOMPUTE,
    stratum_key,
)
from headroom.sim.context import (
    _KEY_SPAN,
    _R,
    PATH_BASE,
    PATH_RMA,
    SKETCH_ALPHA,
    FloatArray,
    IntArray,
    Mix,
)
from headroom.sim.latency import (
    LatencyConfig,
    Strata,
    allocate_samples,
    baseline_wait_params,
    low_priority_factor,
    sample_window,
    serial_waits,
    sketch_from_mass,
    wait_params_array,
)
from headroom.sim.population import Population
from headroom.sim.precompute_sim import PrecomputeWindows

if TYPE_CHECKING:
    from headroom.sim.engine import RegionRun


@dataclass(frozen=True, slots=True)
class MixTable:
    """Several request mixes side by side, their classes in one layout: base, the RMA levels
    (padded with empty classes up to the most levels any of them has), sbm, down, fail. Lets the
    strata of every step of a batch of windows be computed in one pass, whatever mix each step
    ran under (a server admitting part of the offered work gives a new mix at almost every
    step)."""

    mixes: list[Mix]
    k: int  # classes in the layout
    jmax: int  # RMA classes in the layout
    cols: list[IntArray]  # per mix, its classes' columns in the layout
    real: npt.NDArray[np.bool_]  # (M, K) the column is one of the mix's classes
    frac: FloatArray  # (M, K)
    service: FloatArray  # (M, K)
    penalty: FloatArray  # (M, K)
    path: IntArray  # (M, K)
    strong: npt.NDArray[np.bool_]  # (M, K)
    # (M,) stage service statistics
    strong_mean: FloatArray
    strong_cs2: FloatArray
    cpu_mean: FloatArray
    cpu_cs2: FloatArray
    acc_mean: FloatArray
    acc_cs2: FloatArray
    # (M, K, S) truth per class and segment: count, value, base value; (M, S) the hits' value
    count: FloatArray
    value: FloatArray
    base_value: FloatArray
    hit_value: FloatArray
    # (M, K, C) per class and cell the treatment requests' share of all arrivals and the
    # quality they receive (mean, spread); (M, K) the optional work one of them receives (ms)
    arm_weights: FloatArray
    quality: FloatArray
    quality_sd: FloatArray
    opt_cpu_ms: FloatArray
    opt_acc_ms: FloatArray

    def arm_classes(self, name: str) -> npt.NDArray[np.bool_]:
        """The layout's columns of the value-signal group ``name``: what each request received
        (the log's arms: docs/events.md), plus ``none``, treatment requests that got no
        optional work, so a value-aware selection of the treated cannot bias the holdout
        estimate (docs/simulator.md §Holdout estimate); and the intent-to-treat groups the
        control plane learns from (docs/simulator.md §Value signals): requests not routed to
        the strong model (RMA's) and routed ones (SBM's)."""
        j = self.jmax
        cols = {
            "rma": range(1, 1 + j),
            "sbm": range(1 + j, 2 + j),
            "none": (0, 2 + j, 3 + j),
            "itt_rma": range(0, 1 + j),
            "itt_sbm": range(1 + j, 4 + j),
        }[name]
        out = np.zeros(self.k, dtype=np.bool_)
        out[list(cols)] = True
        return out


def mix_table(mixes: list[Mix]) -> MixTable:
    """The :class:`MixTable` of ``mixes`` (in that order)."""
    jmax = max(len(m.plan.levels) for m in mixes)
    k = jmax + 4
    n_m = len(mixes)
    n_s = mixes[0].count.shape[1]
    n_c = mixes[0].arm_weights.shape[1]
    per = np.zeros((n_m, 7, k))
    truth = np.zeros((n_m, 3, k, n_s))
    cells = np.zeros((n_m, 3, k, n_c))
    cols: list[IntArray] = []
    for i, m in enumerate(mixes):
        j = len(m.plan.levels)
        row = (
            m.frac,
            m.service_ms,
            m.penalty_ms,
            m.path,
            m.strong_stage,
            m.opt_cpu_ms,
            m.opt_acc_ms,
        )
        if j == jmax:
            c = np.arange(k)
            per[i] = row
            truth[i] = (m.count, m.value, m.base_value)
            cells[i] = (m.arm_weights, m.quality, m.quality_sd)
        else:
            c = np.concatenate([np.arange(j + 1), np.arange(jmax + 1, k)])
            per[i][:, c] = row
            truth[i][:, c] = (m.count, m.value, m.base_value)
            cells[i][:, c] = (m.arm_weights, m.quality, m.quality_sd)
        cols.append(c)
    real = np.zeros((n_m, k), dtype=np.bool_)
    for i, c in enumerate(cols):
        real[i, c] = True
    stats = np.array(
        [
            (m.strong_mean, m.strong_cs2, m.cpu_mean, m.cpu_cs2, m.acc_mean, m.acc_cs2)
            for m in mixes
        ],
        dtype=np.float64,
    ).reshape(n_m, 6)
    return MixTable(
        mixes=mixes,
        k=k,
        jmax=jmax,
        cols=cols,
        real=real,
        frac=per[:, 0],
        service=per[:, 1],
        penalty=per[:, 2],
        path=per[:, 3].astype(np.int64),
        strong=per[:, 4] > 0.5,
        strong_mean=stats[:, 0],
        strong_cs2=stats[:, 1],
        cpu_mean=stats[:, 2],
        cpu_cs2=stats[:, 3],
        acc_mean=stats[:, 4],
        acc_cs2=stats[:, 5],
        count=truth[:, 0],
        value=truth[:, 1],
        base_value=truth[:, 2],
        hit_value=np.vstack([m.hit_value for m in mixes]),
        arm_weights=cells[:, 0],
        quality=cells[:, 1],
        quality_sd=cells[:, 2],
        opt_cpu_ms=per[:, 5],
        opt_acc_ms=per[:, 6],
    )


def _strata(run: RegionRun, g: FloatArray, mix: Mix) -> tuple[Strata, int]:
    """Strata of (step, class) for steps ``g`` (rows) under one mix, step-major."""
    st, _ = _strata_rows(run, g, mix_table([mix]), np.zeros(g.shape[0], dtype=np.int64))
    return st, mix.frac.size


def _strata_rows(
    run: RegionRun, g: FloatArray, table: MixTable, mi: IntArray
) -> tuple[Strata, npt.NDArray[np.bool_]]:
    """Strata of (step, class) for steps ``g`` (rows), step ``i`` under the mix ``mi[i]`` of
    ``table``, step-major, each step's classes in its mix's order (the layout's padding left
    out); and the (rows, K) mask of the layout's columns that are strata."""
    k = table.k
    n = g.shape[0]
    col = _R
    a = g[:, col["a"]]
    count = a[:, None] * table.frac[mi]
    fail = g[:, col["fail"]]
    count[:, -1] += fail
    strong = table.strong[mi]
    strong_mean = table.strong_mean[mi]
    stretch = strong_mean * (1.0 / g[:, col["speed"]] - 1.0)
    service = table.service[mi] + np.where(strong, stretch[:, None], 0.0)
    penalty = table.penalty[mi]
    with np.errstate(divide="ignore", invalid="ignore"):
        extra_pen = np.where(count[:, -1] > 0, fail * 0.5 * strong_mean / count[:, -1], 0.0)
    penalty[:, -1] += extra_pen
    # baseline first (module doc of sim/latency.py): every request's baseline part waits in the
    # baseline queue — the baseline work alone, ahead of every optional part, on the dedicated
    # capacity plus the quota's units optional work leaves idle (never fewer than static has)
    bm = run.base_mix
    st_ = run.static
    ded_c = st_.ded_cpu / run.cfg.latency.cpu_parallelism
    bc_p, bc_r = baseline_wait_params(
        g[:, col["rc"]], ded_c, g[:, col["nc"]], g[:, col["roc"]], bm.cpu_mean, bm.cpu_cs2
    )
    ba_p, ba_r = baseline_wait_params(
        g[:, col["ra"]], st_.ded_acc, g[:, col["na"]], g[:, col["roa"]], bm.acc_mean, bm.acc_cs2
    )
    # ... and its optional part (RMA's extra candidates, the strong model's CPU work) waits at
    # low priority in the whole stage: its wait stretches by 1 / (1 − ρ_H), ρ_H the share of
    # the stage the baseline keeps busy (non-preemptive priority, Cobham's formula)
    oc_p, oc_r = wait_params_array(
        g[:, col["mc"]], g[:, col["nc"]], table.cpu_mean[mi], table.cpu_cs2[mi]
    )
    oa_p, oa_r = wait_params_array(
        g[:, col["ma"]], g[:, col["na"]], table.acc_mean[mi], table.acc_cs2[mi]
    )
    oc_r = oc_r * low_priority_factor(g[:, col["rc"]], ded_c, g[:, col["nc"]])
    oa_r = oa_r * low_priority_factor(g[:, col["ra"]], st_.ded_acc, g[:, col["na"]])
    ws_p, ws_r = wait_params_array(
        g[:, col["rs"]], g[:, col["ns"]], strong_mean, table.strong_cs2[mi]
    )
    # a request with optional work waits for both of its parts, one after the other (the ideal
    # packing of the oracle adds no queueing of its own: its optional parts never wait)
    if run.policy.ideal:
        tc_p, tc_r, ta_p, ta_r = bc_p, bc_r, ba_p, ba_r
    else:
        tc_p, tc_r = serial_waits(bc_p, bc_r, oc_p, oc_r)
        ta_p, ta_r = serial_waits(ba_p, ba_r, oa_p, oa_r)

    # RMA's extra candidates queue at low priority on both mixed stages; the strong model's own
    # CPU work (SBM) is charged to the optional CPU quota, so it is slowed with the optional
    # backlog, but it runs beside the strong replica's devices, not in the mixed replicas' queue
    path = table.path[mi]
    opt_cpu = path != PATH_BASE  # RMA and SBM: optional CPU work
    opt_acc = path == PATH_RMA  # RMA: optional base-model accelerator work
    real = table.real[mi]
    flat = real.ravel()
    padded = not bool(flat.all())

    def out(x: FloatArray) -> FloatArray:
        """A (rows, K) field as strata: step-major, the padding left out."""
        return x.ravel()[flat] if padded else x.ravel()

    def either(mask: npt.NDArray[np.bool_], yes: FloatArray, no: FloatArray) -> FloatArray:
        return out(np.where(mask, yes[:, None], no[:, None]))

    def acc(strong_x: FloatArray, opt_x: FloatArray, base_x: FloatArray) -> FloatArray:
        return out(
            np.where(strong, strong_x[:, None], np.where(opt_acc, opt_x[:, None], base_x[:, None]))
        )

    c0, c1, a0, a1 = (g[:, col[x]] for x in ("c0", "c1", "a0", "a1"))
    path_out = path.ravel()[flat] if padded else path.ravel()
    if run.policy.ideal:
        st = Strata(
            count=out(count),
            service_ms=out(service),
            penalty_ms=out(penalty),
            fc0=either(opt_cpu, c0 + g[:, col["oc0"]], c0),
            fc1=either(opt_cpu, c1 + g[:, col["oc1"]], c1),
            fa0=acc(g[:, col["s0"]], a0 + g[:, col["oa0"]], a0),
            fa1=acc(g[:, col["s1"]], a1 + g[:, col["oa1"]], a1),
            p1=either(opt_acc, tc_p, bc_p),
            r1=either(opt_acc, tc_r, bc_r),
            p2=acc(ws_p, ta_p, ba_p),
            r2=acc(ws_r, ta_r, ba_r),
            path=path_out,
        )
        return st, real
    # optional budget (module doc of sim/latency.py): RMA's extras wait for capacity at low
    # priority on both mixed stages — one wait standing for the two — and are dropped when they
    # cannot start within the request's optional budget (counted from its arrival, after its
    # baseline CPU part); the SBM path's CPU work is not droppable (it falls back as a whole)
    o_p, o_r = serial_waits(oc_p, oc_r, oa_p, oa_r)
    zero = np.zeros(n)
    rma = path == PATH_RMA
    opt_ms = np.maximum(table.service[mi] - float(bm.service_ms[0]), 0.0)
    budget = max(run.ctx.optional_budget_ms - bm.cpu_mean, 0.0)
    opt_cpu_only = opt_cpu & ~rma
    st = Strata(
        count=out(count),
        service_ms=out(service),
        penalty_ms=out(penalty),
        fc0=either(opt_cpu_only, c0 + g[:, col["oc0"]], c0),
        fc1=either(opt_cpu_only, c1 + g[:, col["oc1"]], c1),
        fa0=acc(g[:, col["s0"]], a0, a0),
        fa1=acc(g[:, col["s1"]], a1, a1),
        p1=out(np.broadcast_to(bc_p[:, None], (n, k))),
        r1=out(np.broadcast_to(bc_r[:, None], (n, k))),
        p2=acc(ws_p, ba_p, ba_p),
        r2=acc(ws_r, ba_r, ba_r),
        path=path_out,
        po=either(rma, o_p, zero),
        ro=either(rma, o_r, np.ones(n)),
        fo0=either(rma, g[:, col["oc0"]] + g[:, col["oa0"]], zero),
        fo1=either(rma, g[:, col["oc1"]] + g[:, col["oa1"]], zero),
        opt_ms=out(np.where(rma, opt_ms, 0.0)),
        budget_ms=out(np.where(rma, budget, np.inf)),
    )
    return st, real


def _shadow_strata(run: RegionRun, g: FloatArray) -> Strata:
    """The static shadow's baseline requests of steps ``g`` (one stratum per step)."""
    col = _R
    n = g.shape[0]
    bm = run.base_mix
    st = run.static
    par = run.cfg.latency.cpu_parallelism
    p1, r1 = wait_params_array(
        g[:, col["src"]], np.full(n, st.ded_cpu / par), bm.cpu_mean, bm.cpu_cs2
    )
    p2, r2 = wait_params_array(g[:, col["sra"]], np.full(n, st.ded_acc), bm.acc_mean, bm.acc_cs2)
    return Strata(
        count=np.ones(n),
        service_ms=np.full(n, float(bm.service_ms[0])),
        penalty_ms=np.zeros(n),
        fc0=g[:, col["sc0"]],
        fc1=g[:, col["sc1"]],
        fa0=g[:, col["sa0"]],
        fa1=g[:, col["sa1"]],
        p1=p1,
        r1=r1,
        p2=p2,
        r2=r2,
        path=np.zeros(n, dtype=np.int64),
    )


def _add_rows(out: FloatArray, idx: IntArray, rows: FloatArray) -> None:
    """``out[idx[i]] += rows[i]`` for every row (per-window sums of per-step rows)."""
    for col in range(out.shape[1]):
        out[:, col] += np.bincount(idx, weights=rows[:, col], minlength=out.shape[0])


def _sample_windows(
    st: Strata,
    win: IntArray,
    n_w: int,
    cfg: LatencyConfig,
    timeout_ms: float,
    uniforms: FloatArray,
    m: int,
) -> tuple[FloatArray, FloatArray, IntArray, IntArray]:
    """:func:`sample_window` for several windows at once: each window's strata get that
    window's ``m`` random numbers, allocated by count within the window."""
    order = np.argsort(win, kind="stable")
    bounds = np.searchsorted(win[order], np.arange(n_w + 1))
    take: list[IntArray] = []
    cols: list[IntArray] = []
    for w in range(n_w):
        idx = order[bounds[w] : bounds[w + 1]]
        if idx.size == 0:
            continue
        counts = st.count[idx]
        if counts.sum() <= 0:
            continue
        alloc = allocate_samples(counts, m)
        rep = np.repeat(idx, alloc)
        take.append(rep)
        cols.append(w * m + np.arange(rep.size))
    if not take:
        z = np.zeros(0)
        zi = np.zeros(0, dtype=np.int64)
        return z, z, zi, zi
    idx = np.concatenate(take)
    col = np.concatenate(cols)
    lat, _, paths = sample_window(st, cfg, timeout_ms, uniforms[:, col], index=idx)
    # each sample stands for count / (samples of its stratum in its window) requests
    n_alloc = np.bincount(idx, minlength=st.size)
    weights = st.count[idx] / n_alloc[idx]
    return lat, weights, paths, win[idx]


def _add_strata(
    acc: dict[str, dict[str, dict[str, Any]]], new: Mapping[str, Mapping[str, Mapping[str, Any]]]
) -> None:
    """Add one interval's strata sums into ``acc`` (every field is a sum)."""
    for key, by_arm in new.items():
        to = acc.setdefault(key, {})
        for arm, sums in by_arm.items():
            got = to.get(arm)
            if got is None:
                to[arm] = dict(sums)
            else:
                for k, v in sums.items():
                    got[k] += v


def _estimator_strata(
    groups: list[str],
    n_all: IntArray,
    sums: tuple[FloatArray, ...],
    pop: Population,
    names: tuple[str, ...],
) -> dict[str, dict[str, dict[str, Any]]]:
    """The window line's ``strata``: the estimator's sums per (segment, value bin) stratum and
    arm (control and what the requests received), with the value signal's sums."""
    # plain numbers, once (the same values ``float(a[i])`` and ``int(a[i])`` give one by one)
    s1, s2, x1, x2, xy, x_late, x2_late = (
        cast("list[float]", np.asarray(a, dtype=np.float64).tolist())
        for a in (sums[0], sums[1], sums[2], sums[3], sums[4], sums[6], sums[7])
    )
    n_late = cast("list[int]", np.asarray(sums[5]).astype(np.int64).tolist())
    n_list = cast("list[int]", np.asarray(n_all).astype(np.int64).tolist())
    n_c = pop.n_cells
    seg = cast("list[int]", pop.seg.tolist())
    strata: dict[str, dict[str, dict[str, Any]]] = {}
    for gi, name in enumerate(groups):
        if name.startswith("itt_"):
            continue
        for c in range(n_c):
            i = gi * n_c + c
            if n_list[i] <= 0:
                continue
            key = stratum_key(names[seg[c]], c % pop.bins)
            strata.setdefault(key, {})[name] = {
                "n": n_list[i],
                "value_sum": s1[i],
                "value_sq_sum": s2[i],
                "signal_sum": x1[i],
                "signal_sq_sum": x2[i],
                "signal_value_sum": xy[i],
                "failed": n_late[i],
                "failed_signal_sum": x_late[i],
                "failed_signal_sq_sum": x2_late[i],
            }
    return strata


def _add_precompute_arm(arms: dict[str, dict[str, dict[str, Any]]], pre: PrecomputeWindows) -> None:
    """Put the interval's hits in the window line's ``arms`` as their own group, ``precompute``
    (what the requests received, as the streaming client reports them), so the holdout estimate
    counts precompute. The live groups already leave the hits out: a hit's request was served
    from the store, and the engine's plan took it out of every live group
    (:meth:`headroom.defences.plan.CellPlan.live`, ``Plan.hit``)."""
    for seg in pre.hit_share:
        hits = pre.value_obs.get((seg, LEVER_PRECOMPUTE, "treatment"))
        if hits is None or hits.n <= 0:
            continue
        arms.setdefault(seg, {})[LEVER_PRECOMPUTE] = {
            "n": hits.n,
            "value_sum": hits.value_sum,
            "value_sq_sum": hits.value_sq_sum,
        }


def _window_sketches(
    keys: IntArray, weights: FloatArray, paths: IntArray, win: IntArray, n_req: IntArray
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Per window, the sketch of every request and of the baseline-only ones (integer counts);
    ``keys``: the samples' sketch keys, clipped to ``[0, _KEY_SPAN)``."""
    n_w = n_req.size
    out: list[tuple[dict[str, Any], dict[str, Any]]] = []
    if keys.size == 0:
        empty: dict[str, Any] = {"alpha": SKETCH_ALPHA, "bins": {}, "zeros": 0}
        return [(dict(empty), dict(empty)) for _ in range(n_w)]
    # (window, key) pairs on a dense grid: masses summed in sample order, as over the unique
    # pairs, and the pairs present in increasing order
    combined = win * _KEY_SPAN + keys
    span = n_w * _KEY_SPAN
    uniq = np.flatnonzero(np.bincount(combined, minlength=span))
    mass = np.asarray(np.bincount(combined, weights=weights, minlength=span), np.float64)[uniq]
    base = paths == PATH_BASE
    dense_base = np.bincount(combined[base], weights=weights[base], minlength=span)
    mass_base = np.asarray(dense_base, dtype=np.float64)[uniq]
    u_win = uniq // _KEY_SPAN
    u_key = uniq % _KEY_SPAN
    bounds = np.searchsorted(u_win, np.arange(n_w + 1))
    for w in range(n_w):
        sl = slice(bounds[w], bounds[w + 1])
        k = u_key[sl]
        m_all = mass[sl]
        m_base = mass_base[sl]
        tot = float(m_all.sum())
        n_base = round(int(n_req[w]) * float(m_base.sum()) / tot) if tot > 0 else 0
        out.append(
            (
                sketch_from_mass(k, m_all, int(n_req[w]), SKETCH_ALPHA),
                sketch_from_mass(k[m_base > 0], m_base[m_base > 0], n_base, SKETCH_ALPHA),
            )
        )
    return out
