"""The vocabulary of headroom: the names every layer shares, declared once.

String enums compare equal to their values (``Lever.RMA == "rma"``), so messages, events and
scenario files keep their plain-string form while the code names each value in one place.

* :class:`Lever` — the optional levers: ``rma`` (rank more candidates), ``sbm`` (serve a better
  model), ``precompute`` (rank ahead of a visit). :data:`LIVE_LEVERS` are the ones on the live
  path (a request's own work).
* :class:`Resource` — ``cpu`` (units = cores) and ``accelerator`` (units = device equivalents).
* :class:`Pool` — ``dedicated`` capacity (serves the baseline) and ``opportunistic`` capacity
  (reclaimable; only optional work may use it).
* :class:`Path` — the serving path a request took: ``base``, ``rma`` or ``sbm``.
* :class:`Arm` — ``treatment`` or ``control`` (the holdout that got no optional work).
* :class:`Model` — the ranking models, ``base`` and ``strong``; an integer enum because it also
  indexes arrays (axis 0 of the value curves).
"""

from __future__ import annotations

from enum import IntEnum, StrEnum

__all__ = [
    "ARMS",
    "LEVERS",
    "LIVE_LEVERS",
    "PATHS",
    "POOLS",
    "RESOURCES",
    "Arm",
    "Lever",
    "Model",
    "Path",
    "Pool",
    "Resource",
]


class Lever(StrEnum):
    RMA = "rma"
    SBM = "sbm"
    PRECOMPUTE = "precompute"


class Resource(StrEnum):
    CPU = "cpu"
    ACCELERATOR = "accelerator"


class Pool(StrEnum):
    OPPORTUNISTIC = "opportunistic"
    DEDICATED = "dedicated"


class Path(StrEnum):
    BASE = "base"
    RMA = "rma"
    SBM = "sbm"


class Arm(StrEnum):
    TREATMENT = "treatment"
    CONTROL = "control"


class Model(IntEnum):
    BASE = 0
    STRONG = 1

    @classmethod
    def of(cls, value: Model | str | int) -> Model:
        """The model named ``value`` (``"base"``/``"strong"``, any case) or numbered ``value``."""
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                raise ValueError(f"model must be 'base' or 'strong', got {value!r}") from None
        return cls(int(value))


# The names as plain strings, in declaration order (for keys of messages, events and arrays).
LEVERS: tuple[str, ...] = tuple(m.value for m in Lever)
LIVE_LEVERS: tuple[str, ...] = (Lever.RMA.value, Lever.SBM.value)
RESOURCES: tuple[str, ...] = tuple(m.value for m in Resource)
POOLS: tuple[str, ...] = tuple(m.value for m in Pool)
PATHS: tuple[str, ...] = tuple(m.value for m in Path)
ARMS: tuple[str, ...] = tuple(m.value for m in Arm)
