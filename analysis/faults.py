"""Faults, restarts and exactly-once counts of one policy's run, from its event log.

The one builder of the ``faults`` section and of the exactly-once fields of metrics.json for both
engines (docs/analysis.md): :class:`FaultBook` is fed the lines of one policy and
:meth:`FaultBook.apply` adds to the policy's metrics

* ``faults`` (when the log has any fault or restart line): ``injected``, ``recovered``,
  ``unrecovered``, ``recovery_s_max``, ``list`` (one entry per fault: ``fault_id``, ``fault``,
  ``process``, ``region``, ``pool``, ``at_s``, ``span_s``, ``end_t``, ``recovered``,
  ``recovery_s``, ``healthy``, ``problem``) and ``restarts`` (processes that died on their own and
  were restarted: ``process``, ``t``, ``exit_status``, ``restarted``);
* ``requests.fed`` and ``requests.duplicates_dropped`` (an ``up`` run: the topic audit's distinct
  request ids, and the duplicates the clients dropped, summed from their window lines);
* ``value.signals`` (an ``up`` run): ``published`` (distinct value signals on the topic),
  ``counted`` (what the controller counted, its newest ``value.counted`` per producer),
  ``duplicates_dropped`` (re-deliveries it recognised) and ``messages`` (copies on the topic).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FAULT_KINDS", "FaultBook"]

FAULT_KINDS = frozenset(
    {"fault.injected", "fault.recovered", "process.restarted", "stack.audit", "value.counted"}
)

_FAULT_FIELDS = ("fault", "process", "region", "pool", "at_s", "span_s")


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def _count(v: Any) -> int:
    n = _number(v)
    return int(n) if n is not None and n >= 0 else 0


@dataclass(slots=True)
class FaultBook:
    faults: dict[str, dict[str, Any]] = field(default_factory=dict)
    restarts: list[dict[str, Any]] = field(default_factory=list)
    audit: dict[str, Any] | None = None
    # newest value.counted record per producer: (seq, counted, duplicates dropped)
    producers: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    unattributed: int = 0
    value_counted_seen: bool = False
    duplicates_dropped: int = 0  # requests, from the clients' window lines
    duplicates_seen: bool = False

    def window(self, e: Mapping[str, Any]) -> None:
        if "duplicates_dropped" in e:
            self.duplicates_seen = True
            self.duplicates_dropped += _count(e.get("duplicates_dropped"))

    def add(self, kind: str, e: Mapping[str, Any]) -> None:
        if kind in ("fault.injected", "fault.recovered"):
            self._fault(kind, e)
        elif kind == "process.restarted":
            self.restarts.append(
                {
                    "process": e.get("process"),
                    "t": _number(e.get("t")),
                    "exit_status": e.get("exit_status"),
                    "restarted": bool(e.get("restarted")),
                }
            )
        elif kind == "stack.audit":
            self.audit = dict(e)
        elif kind == "value.counted":
            self._value_counted(e)

    def _fault(self, kind: str, e: Mapping[str, Any]) -> None:
        fid = str(e.get("fault_id"))
        f = self.faults.setdefault(fid, {"fault_id": fid, "recovered": False})
        for key in _FAULT_FIELDS:
            if key in e and key not in f:
                f[key] = e[key]
        if kind == "fault.injected":
            f["injected_t"] = _number(e.get("t"))
            return
        f["recovered"] = bool(e.get("recovered"))
        f["end_t"] = _number(e.get("end_t"))
        f["recovery_s"] = _number(e.get("recovery_s")) if f["recovered"] else None
        if e.get("healthy") is not None:
            f["healthy"] = e.get("healthy")
        if e.get("problem") is not None:
            f["problem"] = e.get("problem")

    def _value_counted(self, e: Mapping[str, Any]) -> None:
        self.value_counted_seen = True
        producers = e.get("producers")
        if isinstance(producers, Mapping):
            for p, rec in producers.items():
                if not isinstance(rec, Mapping):
                    continue
                new = (
                    int(_number(rec.get("seq")) or -1),
                    _count(rec.get("counted")),
                    _count(rec.get("duplicates_dropped")),
                )
                old = self.producers.get(str(p))
                if old is None or new[1] + new[2] >= old[1] + old[2]:
                    self.producers[str(p)] = new
        self.unattributed = max(self.unattributed, _count(e.get("unattributed")))

    # -- output --------------------------------------------------------------------------------

    def apply(self, out: dict[str, Any]) -> None:
        """Add the fields of the module docstring to one policy's metrics ``out``."""
        audit = self.audit or {}
        requests = out.setdefault("requests", {})
        fed = (
            audit.get("requests", {}).get("fed")
            if isinstance(audit.get("requests"), Mapping)
            else None
        )
        if fed is not None:
            requests["fed"] = _count(fed)
            requests["fed_messages"] = _count(audit["requests"].get("messages"))
        if fed is not None or self.duplicates_seen:
            requests["duplicates_dropped"] = self.duplicates_dropped
        value_audit = audit.get("value") if isinstance(audit.get("value"), Mapping) else None
        if value_audit is not None or self.value_counted_seen:
            counted = sum(c for _s, c, _d in self.producers.values()) + self.unattributed
            signals: dict[str, Any] = {
                "published": None if value_audit is None else _count(value_audit.get("published")),
                "counted": counted if self.value_counted_seen else None,
                "duplicates_dropped": sum(d for _s, _c, d in self.producers.values()),
                "messages": None if value_audit is None else _count(value_audit.get("messages")),
                "producers": len(self.producers),
            }
            out.setdefault("value", {})["signals"] = signals
        if self.faults or self.restarts:
            listed = [self.faults[k] for k in sorted(self.faults, key=_fault_order)]
            for f in listed:
                f.setdefault("recovery_s", None)
            recoveries = [f["recovery_s"] for f in listed if f.get("recovery_s") is not None]
            out["faults"] = {
                "injected": len(listed),
                "recovered": sum(1 for f in listed if f.get("recovered")),
                "unrecovered": sum(1 for f in listed if not f.get("recovered")),
                "recovery_s_max": max(recoveries, default=0.0),
                "list": listed,
                "restarts": sorted(self.restarts, key=lambda r: r.get("t") or 0.0),
            }


def _fault_order(fid: str) -> tuple[int, str]:
    digits = fid[1:] if fid.startswith("f") else ""
    return (int(digits), fid) if digits.isdigit() else (1 << 30, fid)
