"""Every seeded random stream of headroom, derived from a run's seed in one place.

Both engines draw from these, so for one scenario and seed the simulator and the streaming stack
see the same capacity traces, the same arrivals per second and the same requests:

* :func:`traces_rng` — the scenario traces (rate noise, arrivals per step): the first child of
  ``SeedSequence(seed)``.
* :func:`stream_rng` — a named stream ``(seed, key…)``, independent of every other key, so that any
  part (a region's purpose, a second of traffic) can be drawn on its own and in any order.
* :func:`feed_requests_rng` — the requests of one second of one region (segment, value,
  eligibility, user, arrival times within the second).

A seed is a non-negative integer below 2**64 (the scenario loader enforces it).
"""

from __future__ import annotations

import numpy as np

__all__ = ["feed_requests_rng", "stream_rng", "traces_rng"]

_FEED = 0xFEED


def traces_rng(seed: int) -> np.random.Generator:
    """The generator of the scenario traces for ``seed``."""
    return np.random.default_rng(np.random.SeedSequence(int(seed)).spawn(1)[0])


def stream_rng(seed: int, *key: int) -> np.random.Generator:
    """A generator for the stream ``key`` of ``seed`` (the same numbers whoever asks)."""
    return np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=tuple(key)))


def feed_requests_rng(seed: int, region: int, second: int) -> np.random.Generator:
    """The generator of the requests of region ``region`` in second ``second``."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, _FEED, region, second])
