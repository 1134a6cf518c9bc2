"""How busy a pool of servers may run before its queue eats the latency budget.

Pure: no clock, no I/O, no randomness. Used by the SBM coverage controller (to size coverage
to what the strong replicas can serve in time, not to their raw capacity) and by the servers'
admission: :func:`admitted_level` is *the* admission rule of both engines — the simulator's
server model (``headroom.sim.policies``) and the streaming ranking server
(``headroom.workers.server``) hand :class:`headroom.defences.shedding.ServerShedder`
``admitted_level(units, …)`` as its level, so optional work never runs a level above the
utilisation its stage's queue tolerates (docs/shedding.md, *Admission*).

The model
---------
An ``M/G/c`` queue (Poisson arrivals, ``c`` servers, mean service ``S`` ms, squared coefficient
of variation of service ``C_s²``). Sakasegawa's approximation (H. Sakasegawa, "An approximation
formula Lq ≈ α·ρ^β/(1−ρ)", Ann. Inst. Stat. Math. 29, 1977) with the Allen–Cunneen factor for
general service gives the mean wait in queue at utilisation ρ::

    W(ρ) = S · ρ^(√(2(c+1)) − 1) / (c · (1 − ρ)) · (1 + C_s²) / 2

``W`` grows without bound as ρ → 1 and is increasing in ρ, so the *admissible utilisation* for a
wait budget ``B`` is the unique ρ* in [0, 1) with ``W(ρ*) = B`` (found by bisection; ``B = ∞``
gives 1). A pool of fewer than one unit (a slice of a device) is one server of that speed: its
service stretches by ``1/c``.

Why it matters: a strong replica on one device with 40 ms requests waits ``40·ρ/(1−ρ)`` ms on
average — 360 ms at ρ = 0.9 — so "capacity" in device-seconds overstates what one or two
devices can serve under a 200 ms p99 by a factor of two. Small pools must run well below full;
large ones (dozens of cores) can run above 90 %.
"""

from __future__ import annotations

import functools
import math

__all__ = ["admissible_utilization", "admitted_level", "admitted_share", "mean_wait_ms"]


def mean_wait_ms(rho: float, servers: float, service_ms: float, cs2: float = 1.0) -> float:
    """Mean queueing delay of an ``M/G/c`` stage at utilisation ``rho`` (module docstring)."""
    if rho <= 0.0 or service_ms <= 0.0 or servers <= 0.0:
        return 0.0
    if rho >= 1.0:
        return math.inf
    c = max(servers, 1.0)
    s = service_ms / min(servers, 1.0)
    p_wait = float(rho) ** (math.sqrt(2.0 * (c + 1.0)) - 1.0)
    return float(s * p_wait / (c * (1.0 - rho)) * (1.0 + cs2) / 2.0)


@functools.lru_cache(maxsize=8192)
def admissible_utilization(
    servers: float, service_ms: float, wait_budget_ms: float, cs2: float = 1.0
) -> float:
    """The highest utilisation in [0, 1] whose mean wait stays within ``wait_budget_ms``.

    No servers or no work per request: 1 (nothing queues). A non-finite or non-positive input
    never raises: a budget of 0 or less gives 0, an infinite one 1. Memoised: the simulator
    and the servers ask for the same few quotas over and over.
    """
    if not (servers > 0.0 and service_ms > 0.0) or not math.isfinite(service_ms):
        return 1.0
    if not wait_budget_ms > 0.0:  # also NaN
        return 0.0
    if math.isinf(wait_budget_ms) or not math.isfinite(servers):
        return 1.0
    cs2 = cs2 if math.isfinite(cs2) and cs2 >= 0.0 else 1.0
    lo, hi = 0.0, 1.0
    for _ in range(48):  # 2^-48: far below any utilisation that matters
        mid = 0.5 * (lo + hi)
        if mean_wait_ms(mid, servers, service_ms, cs2) <= wait_budget_ms:
            lo = mid
        else:
            hi = mid
    return lo


def admitted_share(
    servers: float,
    service_ms: float,
    wait_budget_ms: float,
    *,
    cs2: float = 1.0,
    ceiling: float = 1.0,
) -> float:
    """The share of an opportunistic level a server admits optional work up to: the admissible
    utilisation of the stage the work queues in (``servers`` parallel servers, mean service
    ``service_ms`` of one request on one server, a mean-wait budget of ``wait_budget_ms``), never
    above ``ceiling``.

    ``servers`` counts the *whole* stage — baseline capacity included — because optional work
    queues in front of (or beside) baseline work: on a mixed replica it is (dedicated + level)
    ÷ threads per request. The inputs each engine derives are listed in docs/shedding.md
    (*Admission*).
    """
    return min(admissible_utilization(servers, service_ms, wait_budget_ms, cs2), ceiling)


def admitted_level(
    units: float,
    servers: float,
    service_ms: float,
    wait_budget_ms: float,
    *,
    cs2: float = 1.0,
    ceiling: float = 1.0,
) -> float:
    """Units of a level of ``units`` that optional work may occupy: ``units ×``
    :func:`admitted_share` of its stage."""
    return units * admitted_share(servers, service_ms, wait_budget_ms, cs2=cs2, ceiling=ceiling)
