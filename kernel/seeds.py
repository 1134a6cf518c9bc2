"""Every seeded random stream of headroom, derived from a run's seed in one place.

Both engines draw from these, so for one scenario and seed the simulator and the streaming stack
see the same capacity traces, the same arrivals per second and the same requests:

* :func:`traces_rng` — the scenario traces (rate noise, arrivals per step): the first child of
  ``SeedSequence(seed)``.
* :func:`stream_rng` — a named stream ``(seed, key…)``, independent of every other key, so that any
  part (a region's purpose, a second of traffic) can be drawn on its own and in any order.
* :func:`feed_requests_rng` — the requests of one second of one region (segment, value,
  eligibility, user, arrival times within the second).
* :func:`world_root` — the ranking world's corpus, ads, models, drift and segment centroids (its
  children, spawned in that order), and :func:`user_rng`, the vector of one user of one segment.
* :func:`replica_rng` — a server replica's own service-time draws, keyed by its name.
* :func:`process_rng` — the stream of a controller, client or precompute process's own choices
  (holdout draws, exploration, planning), from the seed its settings carry.
* :func:`named_rng` — a stream of one named part (a region) of such a process, so that the part
  draws the same numbers whatever the other parts draw and in whatever order they step.

A seed is a non-negative integer below 2**64 (the scenario loader enforces it).
"""

from __future__ import annotations

import zlib

import numpy as np

__all__ = [
    "feed_requests_rng",
    "named_rng",
    "process_rng",
    "replica_rng",
    "stream_rng",
    "traces_rng",
    "user_rng",
    "world_root",
]

_FEED = 0xFEED
_WORLD = 0x57_0D
_USER = 0x05E6
_LOW32 = 0xFFFFFFFF


def traces_rng(seed: int) -> np.random.Generator:
    """The generator of the scenario traces for ``seed``."""
    return np.random.default_rng(np.random.SeedSequence(int(seed)).spawn(1)[0])


def stream_rng(seed: int, *key: int) -> np.random.Generator:
    """A generator for the stream ``key`` of ``seed`` (the same numbers whoever asks)."""
    return np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=tuple(key)))


def feed_requests_rng(seed: int, region: int, second: int) -> np.random.Generator:
    """The generator of the requests of region ``region`` in second ``second``."""
    return np.random.default_rng([int(seed) & _LOW32, _FEED, region, second])


def world_root(seed: int) -> np.random.SeedSequence:
    """The root of the ranking world's streams for ``seed`` (all 64 bits of it count)."""
    return np.random.SeedSequence([int(seed) & _LOW32, int(seed) >> 32, _WORLD])


def user_rng(seed: int, segment: int, user: int) -> np.random.Generator:
    """The generator of user ``user``'s vector in segment ``segment`` (any order, any process)."""
    return np.random.default_rng([int(seed) & _LOW32, _USER, segment, user & _LOW32, user >> 32])


def replica_rng(seed: int, replica: str) -> np.random.Generator:
    """The generator of one server replica's own draws, keyed by the replica's name."""
    return np.random.default_rng([int(seed), zlib.crc32(replica.encode())])


def process_rng(seed: int) -> np.random.Generator:
    """The generator of a process's own choices, from the seed its settings carry."""
    return np.random.default_rng(int(seed))


def named_rng(root: int, name: str) -> np.random.Generator:
    """The generator of the part ``name`` of a process whose own stream is rooted at ``root``
    (the whole name counts: no two names share a stream)."""
    key = int.from_bytes(b"\x01" + name.encode(), "big")
    return np.random.default_rng(np.random.SeedSequence([int(root), key]))
