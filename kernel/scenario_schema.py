"""The JSON Schema (draft 2020-12) of scenario files, printed by ``headroom scenario schema``.

It describes the same fields, bounds and units as :mod:`headroom.kernel.scenario_load` (a unit test
walks both and checks they agree on every field name and on which fields are required). The schema
covers the shape of one file; the rules that span fields — unique names, shares summing to 1,
``base_candidates <= max_candidates <= ads``, events naming declared regions and pools, sorted
traces, CSV contents — are the loader's (``headroom scenario check``), and are listed in the
top-level ``description``.
"""

from __future__ import annotations

from typing import Any

from headroom.kernel.scenario import DEFAULT_INTERVAL_S, FAULT_PROCESSES, MAX_SEED, TTL_INTERVALS
from headroom.kernel.scenario_load import (
    EVENT_KINDS,
    KEYS,
    MAX_BROKER_INDEX,
    MAX_PROCESS_INDEX,
    NAME_PATTERN,
    RESOURCES,
    SERVER_POOLS,
)

__all__ = ["SCHEMA"]

_ID = "urn:headroom:schema:scenario:1"


def _num(description: str, **bounds: float) -> dict[str, Any]:
    return {"type": "number", "description": description, **bounds}


def _int(description: str, **bounds: int) -> dict[str, Any]:
    return {"type": "integer", "description": description, **bounds}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    out = dict(schema)
    out["type"] = [schema["type"], "null"]
    return out


def _name(description: str) -> dict[str, Any]:
    return {"type": "string", "pattern": NAME_PATTERN, "description": description}


def _obj(
    description: str, properties: dict[str, Any], required: list[str], **extra: Any
) -> dict[str, Any]:
    return {
        "type": "object",
        "description": description,
        "properties": properties,
        "required": required,
        "additionalProperties": False,
        **extra,
    }


def _points(value: str, unit: str) -> dict[str, Any]:
    return {
        "type": "array",
        "minItems": 1,
        "description": f"[t_s, {value}] points, strictly increasing in t_s",
        "items": {
            "type": "array",
            "prefixItems": [
                _num("seconds from the start of the run", minimum=0),
                _num(f"{value} ({unit})", minimum=0),
            ],
            "items": False,
            "minItems": 2,
        },
    }


_MODEL = _obj(
    "a ranking model: its per-candidate cost and the accelerator types it runs on",
    {
        "cpu_ms_per_candidate": _num(
            "CPU milliseconds per ranked candidate (retrieval and features)", minimum=0
        ),
        "accelerator_ms_per_candidate": _num(
            "accelerator milliseconds per ranked candidate (model inference)", minimum=0
        ),
        "hardware": {
            "type": "array",
            "minItems": 1,
            "uniqueItems": True,
            "items": {**_name("accelerator type"), "not": {"const": "any"}},
            "description": "accelerator types the model can run on",
        },
        "load_s": _num(
            "seconds to load the model onto newly granted capacity before it can serve (default 0)",
            minimum=0,
        ),
    },
    ["cpu_ms_per_candidate", "accelerator_ms_per_candidate", "hardware"],
)

_SEGMENT = _obj(
    "a request segment",
    {
        "name": _name("segment name, unique"),
        "share": _num(
            "share of requests in this segment; shares sum to 1", exclusiveMinimum=0, maximum=1
        ),
        "value": _obj(
            "log-normal value signal of a request: exp(N(ln(mean) - sigma²/2, sigma)), "
            "so its mean is `mean`",
            {
                "mean": _num("mean value of a request (value units)", exclusiveMinimum=0),
                "sigma": _num("log-space standard deviation", minimum=0, maximum=5),
                "csv": {
                    "type": "string",
                    "minLength": 1,
                    "description": "optional recorded value histogram: file with columns "
                    "value,requests (increasing values, whole counts); values are drawn from it "
                    "(log-uniform within 0.5 % of each row's value) and mean/sigma are its "
                    "summary (scenario from-recording writes it); relative to the scenario file",
                },
            },
            ["mean", "sigma"],
        ),
        "base_error": _num(
            "base model's scoring error, std relative to the spread of the true score",
            minimum=0,
            maximum=10,
        ),
        "strong_error": _num(
            "strong model's scoring error, std relative to the spread of the true score",
            minimum=0,
            maximum=10,
        ),
        "return_rate_per_h": _nullable(
            _num(
                "precompute: mean visits per user per hour (Poisson); absent = none",
                minimum=0,
                maximum=3600,
            )
        ),
    },
    ["name", "share", "value", "base_error", "strong_error"],
)

_TRAFFIC = _obj(
    "request traffic: a synthetic rate (rps and its daily cycle) or a trace (csv or trace)",
    {
        "rps": _num("mean requests per second of the synthetic rate", exclusiveMinimum=0),
        "daily_amplitude": _num(
            "rate(t) = rps·(1 + a·cos(2π(t - peak_s)/period_s))·noise; only with rps (default 0)",
            minimum=0,
            maximum=1,
        ),
        "peak_s": _num("time of the daily peak, seconds; only with rps (default 0)"),
        "period_s": _num(
            "length of the cycle, seconds; only with rps (default 86400)", exclusiveMinimum=0
        ),
        "noise": _num(
            "multiplicative noise on the rate, relative standard deviation (default 0)",
            minimum=0,
            maximum=1,
        ),
        "csv": {
            "type": "string",
            "minLength": 1,
            "description": "trace file with columns t_s,rps (linear between rows); "
            "relative to the scenario file",
        },
        "trace": _points("rps", "requests per second, linear between points"),
        "arrivals": {
            "type": "string",
            "minLength": 1,
            "description": "optional recorded arrivals: file with columns t_s,requests, the "
            "requests arriving in each whole second [t_s, t_s + 1) (no row: none); the arrivals "
            "are these counts, scaled by noise and surges, instead of Poisson draws around the "
            "rate (scenario from-recording writes it); relative to the scenario file",
        },
    },
    [],
    oneOf=[
        {"required": ["rps"], "not": {"anyOf": [{"required": ["csv"]}, {"required": ["trace"]}]}},
        {
            "required": ["csv"],
            "not": {
                "anyOf": [
                    {"required": [k]}
                    for k in ("rps", "trace", "daily_amplitude", "peak_s", "period_s")
                ]
            },
        },
        {
            "required": ["trace"],
            "not": {
                "anyOf": [
                    {"required": [k]}
                    for k in ("rps", "csv", "daily_amplitude", "peak_s", "period_s")
                ]
            },
        },
    ],
)

_OPPORTUNISTIC = _obj(
    "a pool of opportunistic (reclaimable) capacity: its absolute level over time",
    {
        "resource": {
            "enum": list(RESOURCES),
            "description": "cpu (units = cores) or accelerator (units = device equivalents)",
        },
        "hardware": _name("accelerator type, or 'any' for cpu"),
        "trace": _points("units", "available units, piecewise constant"),
        "csv": {
            "type": "string",
            "minLength": 1,
            "description": "trace file with columns t_s,units (piecewise constant); relative to "
            "the scenario file",
        },
        "expires_in_s": _nullable(
            _num(
                "announced lifetime of a grant, seconds; null or absent = unknown",
                exclusiveMinimum=0,
            )
        ),
        "remote": {
            "type": "boolean",
            "description": "only asynchronous work (precompute) may use it (default false)",
        },
    },
    ["resource", "hardware"],
    oneOf=[
        {"required": ["trace"], "not": {"required": ["csv"]}},
        {"required": ["csv"], "not": {"required": ["trace"]}},
    ],
    allOf=[
        {
            "if": {"properties": {"resource": {"const": "cpu"}}},
            "then": {"properties": {"hardware": {"const": "any"}}},
            "else": {"properties": {"hardware": {"not": {"const": "any"}}}},
        }
    ],
)

_REGION = _obj(
    "a region: its dedicated replicas, its traffic and its opportunistic pools",
    {
        "name": _name("region name, unique (the Kafka message key)"),
        "dedicated": _obj(
            "dedicated capacity, provisioned for the baseline",
            {
                "cpu": _num("cores", exclusiveMinimum=0),
                "accelerator": _num("device equivalents", exclusiveMinimum=0),
                "hardware": {
                    **_name("accelerator type of the dedicated replicas (in models.base.hardware)"),
                    "not": {"const": "any"},
                },
            },
            ["cpu", "accelerator", "hardware"],
        ),
        "traffic": _TRAFFIC,
        "opportunistic": {
            "type": ["array", "null"],
            "description": "opportunistic pools; at most one per (resource, hardware, remote)",
            "items": _OPPORTUNISTIC,
        },
    },
    ["name", "dedicated", "traffic"],
)


def _event_kind(kind: str, required: list[str], allowed: list[str]) -> dict[str, Any]:
    optional = set(KEYS["event"][1])
    forbidden = sorted(optional - set(required) - set(allowed))
    return {
        "if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]},
        "then": {
            "required": required,
            "not": {"anyOf": [{"required": [k]} for k in forbidden]},
        },
    }


_EVENT = _obj(
    "a discrete change on top of the traces",
    {
        "at_s": _num("when, seconds from the start (at most duration_s)", minimum=0),
        "kind": {
            "enum": list(EVENT_KINDS),
            "description": "preempt: the pool's level drops to `units` at once; grant: it rises "
            "to `units` at once; surge: the region's traffic is multiplied by `factor` for "
            "`duration_s`; control_outage: the central controllers publish nothing for "
            "`duration_s` (every region, or only `region`); faults (executed by `up`, modelled "
            "by `simulate`): kill: `process` is SIGKILLed and restarted after "
            "`restart_after_s`; pause: `process` is SIGSTOPped for `duration_s`; "
            "broker_restart: the broker is killed and started again on the same storage after "
            "`down_s`; capacity_silence: the capacity feed publishes nothing for `duration_s` "
            "(every region, or only `region`)",
        },
        "region": _nullable(_name("a declared region (control_outage: absent = every region)")),
        "resource": {"enum": list(RESOURCES), "description": "preempt, grant: the pool's resource"},
        "hardware": _name("preempt, grant: the pool's hardware"),
        "units": _num("preempt, grant: the pool's new absolute level", minimum=0),
        "factor": _num("surge: traffic multiplier", exclusiveMinimum=0),
        "duration_s": _num(
            "surge, control_outage, pause, capacity_silence: seconds", exclusiveMinimum=0
        ),
        "remote": {"type": "boolean", "description": "preempt, grant: the region's remote pool"},
        "process": {
            "enum": list(FAULT_PROCESSES),
            "description": "kill, pause: the process (server, client, precompute: a region's, "
            "with `region`; controller, feed: run-wide, no `region`)",
        },
        "pool": {
            "enum": list(SERVER_POOLS),
            "description": "kill, pause of a server (required there): which replica's pool",
        },
        "restart_after_s": _num("kill: restarted this many seconds later", exclusiveMinimum=0),
        "down_s": _num("broker_restart: seconds the broker is down", exclusiveMinimum=0),
        "broker": {
            "type": "integer",
            "minimum": 0,
            "maximum": MAX_BROKER_INDEX,
            "description": "broker_restart with a local cluster: which broker (0-based)",
        },
        "index": {
            "type": "integer",
            "minimum": 0,
            "maximum": MAX_PROCESS_INDEX,
            "description": "kill, pause of a controller, client or server: which one of several "
            "(`up --controllers N`, `--clients-per-region M`, the pool's replicas), 0-based; "
            "absent: the first",
        },
    },
    ["at_s", "kind"],
    allOf=[
        _event_kind("preempt", ["region", "resource", "hardware", "units"], ["remote"]),
        _event_kind("grant", ["region", "resource", "hardware", "units"], ["remote"]),
        _event_kind("surge", ["region", "factor", "duration_s"], []),
        _event_kind("control_outage", ["duration_s"], ["region"]),
        _event_kind("kill", ["process", "restart_after_s"], ["region", "pool", "index"]),
        _event_kind("pause", ["process", "duration_s"], ["region", "pool", "index"]),
        _event_kind("stall", ["process", "duration_s"], ["index"]),
        _event_kind("broker_restart", ["down_s"], ["broker"]),
        _event_kind("capacity_silence", ["duration_s"], ["region"]),
    ],
)

_CONTROL = _obj(
    "the central controllers' clock, the same in `simulate` and `up` (absent: the defaults; "
    "`--interval` and `--ttl` override it)",
    {
        "interval_s": _num(
            "control interval: the control plane decides every this many seconds of scenario "
            f"time (default {DEFAULT_INTERVAL_S:g})",
            exclusiveMinimum=0,
        ),
        "ttl_s": _num(
            "lifetime of each target, seconds; clients fall back to the baseline when it passes "
            f"(default {TTL_INTERVALS:g} × interval_s; at least interval_s)",
            exclusiveMinimum=0,
        ),
    },
    [],
)

SCHEMA: dict[str, Any] = _obj(
    "A headroom scenario (docs/scenarios.md). Rules beyond this schema, checked by `headroom "
    "scenario check`: region and segment names are unique; segment shares sum to 1 (±1e-6); "
    "world.base_candidates <= world.max_candidates <= world.ads; every event names a declared "
    "region and (preempt, grant) one of its opportunistic pools; trace points and CSV rows are "
    "strictly increasing in time and finite; CSV files exist and have the header t_s,rps or "
    "t_s,units; dedicated.hardware is in models.base.hardware; control.ttl_s >= "
    "control.interval_s.",
    {
        "name": _name("scenario name"),
        "seed": _int("random seed: same seed, same run", minimum=0, maximum=MAX_SEED),
        "duration_s": _num("simulated seconds", exclusiveMinimum=0),
        "slo": _obj(
            "the latency promise of the ranking path",
            {
                "p99_ms": _num("p99 latency of all requests, milliseconds", exclusiveMinimum=0),
                "window_s": _num(
                    "p99 is judged per window of this many seconds", exclusiveMinimum=0
                ),
            },
            ["p99_ms", "window_s"],
        ),
        "world": _obj(
            "the ranking world (docs/world.md)",
            {
                "ads": _int("corpus size", minimum=1, maximum=10_000_000),
                "dim": _int("embedding dimension", minimum=1, maximum=4096),
                "base_candidates": _int("baseline candidate count (the promise)", minimum=1),
                "max_candidates": _int("RMA upper bound on candidates", minimum=1),
                "holdout": _num(
                    "share of requests kept as control arm (no optional work)",
                    exclusiveMinimum=0,
                    exclusiveMaximum=1,
                ),
                "drift_per_h": _nullable(
                    _num(
                        "precompute: share of the ad-level utility that changes per hour",
                        minimum=0,
                        exclusiveMaximum=1,
                    )
                ),
                "users": _nullable(_int("precompute: distinct users", minimum=1, maximum=2**31)),
            },
            ["ads", "dim", "base_candidates", "max_candidates", "holdout"],
        ),
        "models": _obj(
            "the base model (baseline) and the strong model (SBM)",
            {"base": _MODEL, "strong": _MODEL},
            ["base", "strong"],
        ),
        "segments": {
            "type": "array",
            "minItems": 1,
            "description": "request segments; names unique, shares sum to 1",
            "items": _SEGMENT,
        },
        "regions": {
            "type": "array",
            "minItems": 1,
            "description": "regions; names unique",
            "items": _REGION,
        },
        "events": {
            "type": ["array", "null"],
            "description": "discrete changes on top of the traces, applied in time order",
            "items": _EVENT,
        },
        "control": _nullable(_CONTROL),
        "eligible_share": _num(
            "optional: share of requests that may be routed to the strong model (the messages' "
            "eligible flag; default 1; scenario from-recording writes the recorded share)",
            minimum=0,
            maximum=1,
        ),
    },
    ["name", "seed", "duration_s", "slo", "world", "models", "segments", "regions"],
)
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": _ID,
    "title": "headroom scenario",
    **SCHEMA,
}
