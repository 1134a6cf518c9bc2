"""Value signals for tests: one ``headroom.value`` message with a given mean and spread."""

from __future__ import annotations

from headroom.streams import messages


def value_signal(
    segment: str,
    arm: str,
    n: int,
    mean: float,
    sd: float = 0.01,
    *,
    region: str,
    ts: float = 0.0,
    lever: str = "precompute",
    stratum: int | None = None,
    window_s: float = 10.0,
    signal: float | None = None,
) -> messages.ValueSignal:
    """``n`` requests of ``segment`` in ``arm`` of ``lever`` whose values have mean ``mean`` and
    standard deviation ``sd`` (the sums a client would publish), no cost; ``signal``: every
    request's value signal, whose sums are then carried too (none by default)."""
    return messages.ValueSignal(
        ts=ts,
        region=region,
        segment=segment,
        lever=lever,  # type: ignore[arg-type]
        arm=arm,  # type: ignore[arg-type]
        n=n,
        value_sum=n * mean,
        value_sq_sum=n * (sd * sd + mean * mean),
        window_s=window_s,
        cost=messages.Cost(cpu_ms=0.0, accelerator_ms=0.0),
        stratum=stratum,
        signal_sum=None if signal is None else n * signal,
        signal_sq_sum=None if signal is None else n * signal * signal,
        signal_value_sum=None if signal is None else n * signal * mean,
    )
