"""SBM router: which segments get the stronger model, by Thompson sampling on uplift per cost.

The algorithm
-------------
Input: the coverage command ``c`` (controllers/coverage.py), each segment's share ``w_s`` of
eligible traffic (from this window's per-segment request rates; the eligible share is assumed
alike across segments), and the region's :class:`headroom.controllers.levers.ValueBook`.

1. **Uplift per segment.** ``d_s = mean_treatment - mean_control`` of lever ``sbm`` in segment
   ``s`` from the discounted holdout sums, with variance ``v_s = var_t/n_t + var_c/n_c``.
2. **Posterior.** Normal prior ``N(0, τ²)`` with ``τ = prior_scale × pooled sd of request value``
   (1 when nothing was seen): weak, so a few hundred samples dominate it. Posterior variance
   ``1/(1/τ² + 1/v_s)``, mean ``post_var · d_s / v_s``; a segment without data keeps the prior.
3. **Thompson sampling.** Draw ``θ_s`` from each posterior with the injected generator (one
   vector draw, segments in sorted order, so a seed reproduces a run) and score
   ``θ_s / cost_s``, the sampled uplift per device-second of strong-model work.
4. **Fill.** Every segment starts at the exploration floor ``f = min(floor, c)`` (capped by the
   command itself, which a floor may never exceed); the rest of the command,
   ``c - Σ w_s f``, goes to segments in decreasing score, each up to probability 1, until the
   share-weighted mean reaches ``c``. Segments whose sampled uplift is not positive keep only
   the floor: the router would rather under-spend than buy negative value, and says so (the
   achieved mean is returned and reported).

   With the allocator's **shares** ``a_s`` (the share of segment ``s``'s eligible requests its
   SBM tranches were given: the strata where the strong model's value per unit of capacity beat
   every other use of it, RMA's included), the fill goes in two passes: first each segment up
   to ``max(a_s, f)`` in score order, then, only if the command is not met yet, any segment up
   to 1 in score order as above. So the strong model serves the strata the allocator chose —
   the top bins of the segments where it pays most — and not RMA's best requests in a segment
   whose mean uplift happens to be higher.

The probabilities are the *propensities*: clients route an eligible request of segment ``s`` to
the strong model with probability ``p_s`` and log it, so inverse-propensity estimates stay
unbiased; the floor keeps every ``p_s > 0`` whenever SBM runs, so no segment's estimate starves
and the router can never freeze on a stale decision.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from headroom.controllers.config import RouterSettings
from headroom.controllers.levers import ValueBook
from headroom.controllers.types import LEVER_SBM

__all__ = ["RouteResult", "SbmRouter"]


@dataclass(frozen=True, slots=True)
class RouteResult:
    probabilities: dict[str, float]  # segment -> routing probability (the propensity)
    achieved: float  # share-weighted mean of the probabilities (<= command)
    floor: float  # the exploration floor applied
    sampled_uplift: dict[str, float]  # θ_s drawn this step (for the event log)


class SbmRouter:
    __slots__ = ("lever", "settings")

    def __init__(self, settings: RouterSettings, lever: str = LEVER_SBM) -> None:
        self.settings = settings
        self.lever = lever

    def route(
        self,
        command: float,
        weights: Mapping[str, float],
        book: ValueBook,
        rng: np.random.Generator,
        cost_per_request: Mapping[str, float] | float = 1.0,
        allowed: Collection[str] | None = None,
        shares: Mapping[str, float] | None = None,
    ) -> RouteResult:
        """Segment probabilities whose ``weights``-weighted mean is ``command`` (as far as the
        sampled uplifts justify). ``weights`` are normalised here; all-zero means equal.

        ``allowed``: the segments the allocator gave the strong model (its tranches: where its
        uplift per unit of cost beat every other use of the capacity, RMA's included); the
        others get nothing, not even the floor (the caller leaves a segment without an estimate of
        its own in ``allowed``, so it can be measured). None: every segment.

        ``shares``: the allocator's share of each segment's eligible requests (step 4: the
        first pass fills each segment up to it; a segment not in it, up to the floor). None:
        one pass, as without an allocator by stratum."""
        segments: Sequence[str] = sorted(weights)
        k = len(segments)
        if k == 0:
            return RouteResult({}, 0.0, 0.0, {})
        c = min(max(command, 0.0), 1.0) if math.isfinite(command) else 0.0
        total = sum(max(w, 0.0) for w in weights.values() if math.isfinite(w))
        if total > 0.0:
            w = {
                s: (max(weights[s], 0.0) / total if math.isfinite(weights[s]) else 0.0)
                for s in segments
            }
        else:
            w = {s: 1.0 / k for s in segments}

        # posterior draws (always drawn, so the generator advances the same way every step)
        z = rng.standard_normal(k)
        tau = self.settings.prior_scale * (book.pooled_sd() or 1.0)
        tau2 = tau * tau
        theta: dict[str, float] = {}
        for i, s in enumerate(segments):
            up = book.uplift(self.lever, s)
            v = up.se * up.se
            if not math.isfinite(v):
                mean, var = 0.0, tau2
            elif v <= 0.0:
                mean, var = up.mean, 0.0
            else:
                var = 1.0 / (1.0 / tau2 + 1.0 / v)
                mean = var * up.mean / v
            theta[s] = mean + math.sqrt(var) * float(z[i])

        if c <= 0.0:
            return RouteResult({s: 0.0 for s in segments}, 0.0, 0.0, theta)
        floor = min(self.settings.exploration_floor, c)
        shut = set() if allowed is None else {s for s in segments if s not in allowed}
        p = {s: (0.0 if s in shut else floor) for s in segments}
        remaining = c - sum(w[s] * p[s] for s in segments)

        def cost(s: str) -> float:
            if isinstance(cost_per_request, Mapping):
                value = cost_per_request.get(s, 1.0)
            else:
                value = cost_per_request
            return value if value > 0.0 else 1.0

        order = sorted(segments, key=lambda s: (-theta[s] / cost(s), s))
        passes: list[Mapping[str, float] | None] = [None]
        if shares is not None:
            first = {
                s: min(max(shares.get(s, 0.0), p[s]), 1.0) if math.isfinite(shares.get(s, 0.0))
                else p[s]
                for s in segments
            }  # fmt: skip
            passes.insert(0, first)
        for limit in passes:
            for s in order:
                if remaining <= 1e-15:
                    break
                if theta[s] <= 0.0 or w[s] <= 0.0 or s in shut:
                    continue
                top = 1.0 if limit is None else limit[s]
                add = min(max(top - p[s], 0.0), remaining / w[s])
                p[s] += add
                remaining -= add * w[s]
        achieved = sum(w[s] * p[s] for s in segments)
        return RouteResult(p, min(achieved, c), floor, theta)
