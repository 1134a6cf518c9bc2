"""The latency sketch of docs/messages.md: a DDSketch-style mergeable histogram with relative
accuracy.

The algorithm (Masson, Rim & Lee, "DDSketch: a fast and fully-mergeable quantile sketch with
relative-error guarantees", PVLDB 12(12), 2019):

* Relative accuracy ``alpha`` (default 0.01: 1 %). ``gamma = (1 + alpha) / (1 - alpha)``.
* A positive value ``x`` falls in the bin with integer key ``k = ceil(ln x / ln gamma)``, i.e.
  ``gamma**(k-1) < x <= gamma**k``. A value of exactly 0 is counted in ``zeros``. Negative,
  NaN and infinite values are refused (latencies are never negative).
* The bin's representative value is ``2 * gamma**k / (1 + gamma)``, which lies within a relative
  distance ``(gamma - 1) / (gamma + 1) = alpha`` of every value in ``(gamma**(k-1), gamma**k]``.
* Merging two sketches of the same ``alpha`` adds their bin counts: the merge of two sketches is
  *exactly* the sketch of the concatenated samples, so percentiles across replicas come from
  merged sketches and never from averaged percentiles.

Quantile (rank) convention: ``quantile(q)`` estimates the *lower* sample quantile, the element of
rank ``floor(q * (n - 1))`` (0-based) of the sorted samples — ``numpy.quantile(x, q,
method="lower")``. The estimate is that element's bin representative, hence within relative error
``alpha`` of the true element (up to floating-point rounding of ``ln`` at exact bin boundaries,
~1e-15 relative). ``q = 0.99`` over 1,000 samples is the 990th smallest (index 989).

Keys are computed as ``ceil(ln(x) * (1 / ln gamma))`` with the reciprocal precomputed (and
``ln gamma = log1p(2 alpha / (1 - alpha))``, accurate for small alpha), both in
the scalar path (:meth:`LatencySketch.add`, ``math.log``) and the vectorised one
(:meth:`LatencySketch.add_many`, ``numpy.log``); the two agree except, possibly, for a value
within one ulp of a bin boundary, where either bin honours the accuracy bound.

Storage is sparse (``dict`` key → count): latencies in milliseconds at alpha = 1 % span a few
hundred keys (ln(10 s / 0.1 ms) / ln gamma ≈ 576), and a sparse map keeps a hostile value such as
1e300 from allocating a dense array across the whole range. Bounds on decoded sketches:
at most ``MAX_BINS`` bins (docs/messages.md's list bound, 100,000), keys within the range a finite
positive double can reach for the sketch's alpha, counts non-negative 64-bit integers.

Why not the ``ddsketch`` package (DataDog's sketches-py)? Its ``LogarithmicMapping`` is the same
mapping (key = ceil(log_gamma x), representative ``gamma**k * 2 / (1 + gamma)``), but it ingests
one value at a time in pure Python (no vectorised ``add``), keeps min/max/sum and a negative store
the contract does not carry, pulls in protobuf, and has no serialisation to the contract's
``{"alpha", "bins", "zeros"}`` form, nor validation of untrusted snapshots; the part we need
is small. See docs/messages.md.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Annotated, Any, Final, cast

import msgspec
import numpy as np
import numpy.typing as npt

from headroom.kernel.codec import Count, ValidationError, type_name

__all__ = [
    "DEFAULT_ALPHA",
    "MAX_BINS",
    "MIN_ALPHA",
    "CommonSketchWire",
    "LatencySketch",
    "SketchWire",
    "bin_keys",
    "bin_values",
    "quantiles_from_counts",
]

DEFAULT_ALPHA: Final = 0.01  # docs/messages.md's example; 1 % is DDSketch's customary default
MAX_BINS: Final = 100_000  # docs/messages.md: no list or map over 100,000 items
# Below 1e-6 the accuracy promise is meaningless for latencies (a nanosecond in a millisecond)
# and gamma - 1 nears the rounding error of doubles; it also bounds the key range (±3.7e8).
MIN_ALPHA: Final = 1e-6
_MAX_COUNT: Final = (1 << 63) - 1  # counts travel as JSON integers that orjson keeps as int64
_MIN_POSITIVE: Final = math.ulp(0.0)  # 5e-324, the smallest positive double
# Canonical decimal integers only ("372", "-5"; not "+5", "05", " 5"), at most 19 digits: the key
# of a finite double is within ±3.8e8 even at MIN_ALPHA.
_INT_KEY = re.compile(r"-?(?:0|[1-9][0-9]{0,18})\Z")
# add_many counts keys with numpy.bincount over [kmin, kmax] when that span is at most this many
# slots beyond the batch size (a cheap linear pass), and with numpy.unique (a sort) otherwise.
_DENSE_SLACK: Final = 4096


def _check_alpha(alpha: object) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise ValueError(f"alpha must be a number, got {type(alpha).__name__}")
    value = float(alpha)
    if not (MIN_ALPHA <= value < 1.0):
        raise ValueError(f"alpha must lie in [{MIN_ALPHA:g}, 1), got {alpha!r}")
    return value


class _Mapping:
    """The value ↔ key mapping for one alpha (precomputed constants)."""

    __slots__ = ("alpha", "gamma", "inv_ln_gamma", "key_max", "key_min", "ln_gamma", "ln_scale")

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.gamma = (1.0 + alpha) / (1.0 - alpha)
        # log1p keeps ln gamma accurate for small alpha (gamma - 1 = 2 alpha / (1 - alpha)).
        self.ln_gamma = math.log1p(2.0 * alpha / (1.0 - alpha))
        self.inv_ln_gamma = 1.0 / self.ln_gamma
        self.ln_scale = math.log1p(-alpha)  # ln(2 / (1 + gamma)) = ln(1 - alpha)
        # The keys that finite positive doubles can reach: anything outside is not a sketch of
        # real numbers.
        self.key_min = math.ceil(math.log(_MIN_POSITIVE) * self.inv_ln_gamma)
        self.key_max = math.ceil(math.log(sys.float_info.max) * self.inv_ln_gamma)

    def values(self, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        # One formula for every caller (scalar or batch), so quantile() and quantiles() agree to
        # the last bit; clamped at the top key of the double range, whose representative would
        # overflow.
        with np.errstate(over="ignore"):
            out = np.exp(keys.astype(np.float64) * self.ln_gamma + self.ln_scale)
        return np.minimum(out, sys.float_info.max)

    def value(self, key: int) -> float:
        return float(self.values(np.array([key], dtype=np.int64))[0])


_MAPPINGS: dict[float, _Mapping] = {}  # a pure cache of constants; never observable


def _mapping(alpha: float) -> _Mapping:
    m = _MAPPINGS.get(alpha)
    if m is None:
        m = _Mapping(alpha)
        if len(_MAPPINGS) < 64:  # hostile inputs could carry any alpha: keep the cache bounded
            _MAPPINGS[alpha] = m
    return m


def bin_keys(values: npt.ArrayLike, alpha: float = DEFAULT_ALPHA) -> npt.NDArray[np.int64]:
    """Vectorised key of each positive value: ``ceil(ln x / ln gamma)``.

    Values must be positive and finite (zeros have no key; :class:`LatencySketch` counts them
    apart). Raises ``ValueError`` otherwise.
    """
    m = _mapping(_check_alpha(alpha))
    x = np.asarray(values, dtype=np.float64)
    if x.size and not bool(np.all((x > 0.0) & (x <= sys.float_info.max))):
        raise ValueError("bin_keys: values must be positive and finite")
    return np.ceil(np.log(x) * m.inv_ln_gamma).astype(np.int64)


def bin_values(keys: npt.ArrayLike, alpha: float = DEFAULT_ALPHA) -> npt.NDArray[np.float64]:
    """Vectorised representative value of each key: ``2 * gamma**k / (1 + gamma)``."""
    m = _mapping(_check_alpha(alpha))
    return m.values(np.asarray(keys, dtype=np.int64))


def quantiles_from_counts(
    keys: npt.ArrayLike,
    counts: npt.ArrayLike,
    qs: npt.ArrayLike,
    *,
    alpha: float = DEFAULT_ALPHA,
    zeros: int = 0,
) -> npt.NDArray[np.float64]:
    """Quantiles of a sketch given as arrays, for hot loops (the simulator's per-window p99).

    ``keys`` (any order, no duplicates needed: duplicates add up) and ``counts`` (non-negative)
    describe the positive bins, ``zeros`` the count of exact zeros. Same rank convention as
    :meth:`LatencySketch.quantile`; an empty sketch gives NaN for every q.
    """
    m = _mapping(_check_alpha(alpha))
    k = np.asarray(keys, dtype=np.int64).ravel()
    c = np.asarray(counts, dtype=np.int64).ravel()
    q = np.asarray(qs, dtype=np.float64)
    if k.shape != c.shape:
        raise ValueError("quantiles_from_counts: keys and counts differ in length")
    if c.size and int(c.min()) < 0:
        raise ValueError("quantiles_from_counts: counts must be non-negative")
    if zeros < 0:
        raise ValueError("quantiles_from_counts: zeros must be non-negative")
    if q.size and not bool(np.all((q >= 0.0) & (q <= 1.0))):
        raise ValueError("quantiles_from_counts: quantiles must lie in [0, 1]")
    order = np.argsort(k, kind="stable")
    k, c = k[order], c[order]
    cum = np.cumsum(c)
    n = int(cum[-1]) + zeros if cum.size else zeros
    out = np.full(q.shape, np.nan)
    if n == 0:
        return out
    rank = np.floor(q * (n - 1)).astype(np.int64) - zeros  # rank among the positive values
    in_zero = rank < 0
    idx = np.searchsorted(cum, np.maximum(rank, 0), side="right")  # first cum > rank
    idx = np.minimum(idx, max(cum.size - 1, 0))
    positive = bin_values(k[idx], m.alpha) if cum.size else np.zeros(q.shape)
    out = np.where(in_zero, 0.0, positive)
    return np.asarray(out, dtype=np.float64)


class LatencySketch:
    """A mergeable latency histogram with relative accuracy ``alpha`` (module docstring).

    Mutable (``add``, ``add_many``, ``merge``); ``copy()`` for a snapshot, ``to_dict()`` /
    ``from_dict()`` for the contract form ``{"alpha": 0.01, "bins": {"372": 10}, "zeros": 0}``.
    Two sketches are equal when their alpha, zero count and bins are equal.
    """

    __slots__ = ("_bins", "_count", "_m", "_zeros")
    __hash__ = None  # type: ignore[assignment]  # mutable: equal sketches may change apart

    def __init__(self, alpha: float = DEFAULT_ALPHA) -> None:
        self._m = _mapping(_check_alpha(alpha))
        self._bins: dict[int, int] = {}
        self._zeros = 0
        self._count = 0

    # -- construction -----------------------------------------------------------------------

    @classmethod
    def from_values(cls, values: npt.ArrayLike, alpha: float = DEFAULT_ALPHA) -> LatencySketch:
        """A sketch of the given samples (non-negative, finite)."""
        sketch = cls(alpha)
        sketch.add_many(values)
        return sketch

    @classmethod
    def merged(cls, sketches: Iterable[LatencySketch], alpha: float | None = None) -> LatencySketch:
        """A new sketch holding the merge of ``sketches`` (all of one alpha).

        ``alpha`` is needed only to give the empty merge its accuracy; otherwise the first
        sketch's alpha is used and every other must match.
        """
        out: LatencySketch | None = None if alpha is None else cls(alpha)
        for sketch in sketches:
            if out is None:
                out = sketch.copy()
            else:
                out.merge(sketch)
        if out is None:
            return cls(DEFAULT_ALPHA)
        return out

    # -- read-only view -----------------------------------------------------------------------

    @property
    def alpha(self) -> float:
        return self._m.alpha

    @property
    def gamma(self) -> float:
        return self._m.gamma

    @property
    def count(self) -> int:
        """Number of samples (zeros included)."""
        return self._count

    @property
    def zeros(self) -> int:
        return self._zeros

    @property
    def bins(self) -> Mapping[int, int]:
        """Read-only view of the positive bins, key → count (no zero counts)."""
        return MappingProxyType(self._bins)

    def __len__(self) -> int:
        """Number of non-empty positive bins."""
        return len(self._bins)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LatencySketch):
            return NotImplemented
        return (
            self._m.alpha == other._m.alpha
            and self._zeros == other._zeros
            and self._bins == other._bins
        )

    def __repr__(self) -> str:
        return f"LatencySketch(alpha={self.alpha!r}, count={self._count}, bins={len(self._bins)})"

    def copy(self) -> LatencySketch:
        out = LatencySketch.__new__(LatencySketch)
        out._m = self._m
        out._bins = dict(self._bins)
        out._zeros = self._zeros
        out._count = self._count
        return out

    # -- ingest -------------------------------------------------------------------------------

    def add(self, x: float, count: int = 1) -> None:
        """Fold one sample (``count`` times). ``x`` must be finite and >= 0."""
        if type(count) is not int or count < 0:
            raise ValueError(f"count must be a non-negative int, got {count!r}")
        if x > 0.0 and x <= sys.float_info.max:  # False for NaN
            if count:  # never store an empty bin: equality stays structural
                key = math.ceil(math.log(x) * self._m.inv_ln_gamma)
                self._bins[key] = self._bins.get(key, 0) + count
        elif x == 0.0:
            self._zeros += count
        else:
            raise ValueError(f"latency samples must be finite and >= 0, got {x!r}")
        self._count += count

    def add_many(self, values: npt.ArrayLike, counts: npt.ArrayLike | None = None) -> None:
        """Fold a batch of samples, vectorised with numpy.

        ``counts`` (optional, non-negative integers, same shape) weights each value: the
        simulator folds a histogram of many requests in one call. Raises ``ValueError`` (and
        changes nothing) if any value is negative, NaN or infinite.
        """
        x = np.asarray(values, dtype=np.float64).ravel()
        if x.size == 0:
            return
        w: npt.NDArray[np.int64] | None = None
        if counts is not None:
            w = np.asarray(counts).ravel()
            if w.shape != x.shape:
                raise ValueError("add_many: values and counts differ in length")
            if w.dtype.kind not in "iu":
                raise ValueError(f"add_many: counts must be integers, got dtype {w.dtype}")
            w = w.astype(np.int64)
            if int(w.min()) < 0:
                raise ValueError("add_many: counts must be non-negative")
        # One pass decides validity; `x > 0 & x <= max` is False for NaN and inf.
        positive = (x > 0.0) & (x <= sys.float_info.max)
        n_pos = int(np.count_nonzero(positive))
        if n_pos != x.size:
            zero = x == 0.0
            if n_pos + int(np.count_nonzero(zero)) != x.size:
                raise ValueError("latency samples must be finite and >= 0")
            n_zero = int(zero.sum()) if w is None else int(w[zero].sum())
            x = x[positive]
            if w is not None:
                w = w[positive]
        else:
            n_zero = 0
        total = n_zero
        if x.size:
            keys = np.ceil(np.log(x) * self._m.inv_ln_gamma).astype(np.int64)
            kmin, kmax = int(keys.min()), int(keys.max())
            if kmax - kmin <= keys.size + _DENSE_SLACK:
                dense = np.bincount(keys - kmin, weights=w, minlength=kmax - kmin + 1)
                nz = np.flatnonzero(dense)
                uniq = nz + kmin
                cnt = dense[nz]
            else:
                uniq, inverse = np.unique(keys, return_inverse=True)
                cnt = np.bincount(inverse, weights=w)
            # bincount with weights returns float64: exact for counts below 2**53.
            cnt_list = cnt.astype(np.int64).tolist() if w is not None else cnt.tolist()
            bins = self._bins
            for key, c in zip(uniq.tolist(), cnt_list, strict=True):
                if c:
                    bins[key] = bins.get(key, 0) + c
                    total += c
        self._zeros += n_zero
        self._count += total

    def merge(self, other: LatencySketch) -> None:
        """Add ``other``'s counts into this sketch (exact: bins add). Same alpha required."""
        if not isinstance(other, LatencySketch):
            raise TypeError(f"can only merge a LatencySketch, got {type(other).__name__}")
        if other._m.alpha != self._m.alpha:
            raise ValueError(
                f"cannot merge sketches of different accuracy: alpha {self.alpha} != {other.alpha}"
            )
        bins = self._bins
        for key, c in other._bins.items():
            bins[key] = bins.get(key, 0) + c
        self._zeros += other._zeros
        self._count += other._count

    # -- queries --------------------------------------------------------------------------------

    def quantile(self, q: float) -> float | None:
        """Estimate of the lower ``q``-quantile (module docstring); ``None`` when empty."""
        if not (0.0 <= q <= 1.0):
            raise ValueError(f"quantile must lie in [0, 1], got {q!r}")
        n = self._count
        if n == 0:
            return None
        rank = math.floor(q * (n - 1)) - self._zeros
        if rank < 0:
            return 0.0
        seen = 0
        for key in sorted(self._bins):
            seen += self._bins[key]
            if seen > rank:
                return self._m.value(key)
        raise AssertionError("unreachable: count and bins disagree")  # pragma: no cover

    def quantiles(self, qs: Sequence[float]) -> list[float | None]:
        """Several quantiles with one sort of the bins."""
        if self._count == 0:
            for q in qs:
                if not (0.0 <= q <= 1.0):
                    raise ValueError(f"quantile must lie in [0, 1], got {q!r}")
            return [None] * len(qs)
        keys = np.fromiter(self._bins.keys(), dtype=np.int64, count=len(self._bins))
        counts = np.fromiter(self._bins.values(), dtype=np.int64, count=len(self._bins))
        out = quantiles_from_counts(keys, counts, list(qs), alpha=self.alpha, zeros=self._zeros)
        return [float(v) for v in out.tolist()]

    # -- snapshot / wire form -------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The contract form; bin keys as decimal strings, in ascending key order."""
        keys = sorted(self._bins)
        return {
            "alpha": self._m.alpha,
            "bins": dict(zip(_key_texts(keys), map(self._bins.__getitem__, keys), strict=True)),
            "zeros": self._zeros,
        }

    def _wire_dict(self) -> dict[str, Any]:
        """:meth:`to_dict` for the encoder: the same object, except that ``bins`` keeps its
        integer keys (the codec writes them as decimal strings, ``dumps(..., int_keys=True)``,
        giving the same bytes as ``to_dict``) and may be this sketch's own map when that is
        already in ascending key order. For immediate serialisation only: never hand it out."""
        bins = self._bins
        keys = list(bins)
        ordered = sorted(keys)
        if ordered != keys:
            bins = {k: bins[k] for k in ordered}
        return {"alpha": self._m.alpha, "bins": bins, "zeros": self._zeros}

    @classmethod
    def from_dict(cls, data: object, field: str = "sketch") -> LatencySketch:
        """Build from the contract form, validating it; errors are :class:`ValidationError`
        naming ``field`` (default ``sketch``) and the part at fault (``sketch.bins.372``).

        Unknown fields are ignored (docs/messages.md). Bins with a count of 0 are accepted and
        dropped.
        """
        fast = _from_dict_fast(data)
        if fast is not None:
            m, bins, zeros, total = fast
        else:
            m, bins, zeros, total = _from_dict_checked(data, field)
        out = cls.__new__(cls)
        out._m = m
        out._bins = bins
        out._zeros = zeros
        out._count = total
        return out

    @classmethod
    def from_wire(cls, wire: SketchWire | CommonSketchWire, field: str = "sketch") -> LatencySketch:
        """Build from a :class:`SketchWire` (or :class:`CommonSketchWire`) that msgspec has
        decoded and checked (alpha, counts, sizes), adopting its map of bins: what is left is
        the one rule that depends on alpha, the range of the keys, and dropping empty bins as
        :meth:`from_dict` does. A :class:`CommonSketchWire` has no empty bins, and its keys lie
        in the range of every alpha up to ``DEFAULT_ALPHA``: only a coarser alpha checks them."""
        m = _MAPPINGS.get(wire.alpha) or _mapping(wire.alpha)
        bins = wire.bins
        total = wire.zeros
        if bins:
            common = type(wire) is CommonSketchWire
            if (not common or m.alpha > DEFAULT_ALPHA) and (
                min(bins) < m.key_min or max(bins) > m.key_max
            ):
                key = next(k for k in bins if not m.key_min <= k <= m.key_max)
                raise ValidationError(f"{field}.bins.{key}", _range_reason(m))
            counts = bins.values()
            total += sum(counts)
            if not common and not all(counts):
                bins = {k: c for k, c in bins.items() if c}
        out = cls.__new__(cls)
        out._m = m
        out._bins = bins
        out._zeros = wire.zeros
        out._count = total
        return out


# -- decoding the wire form -------------------------------------------------------------------
#
# Two paths, one set of rules. The fast path (_from_dict_fast) handles the common case, a plain
# dict from the JSON decoder whose bin keys were all seen before, with C-level loops over the
# whole map (memo look-ups, a set of types, min and sum); it never raises and returns None as
# soon as anything is unusual. The checked path (_from_dict_checked) then walks the input field
# by field and bin by bin, naming the first fault. The fast path accepts only what the checked
# path accepts, with the same result (tests/unit/test_sketch.py holds the two to that).

_Parsed = tuple["_Mapping", dict[int, int], int, int]  # mapping, bins, zeros, count

# Parsed bin keys, canonical decimal string → int. A pure memo (it only ever holds what
# _INT_KEY accepts, mapped to int()), bounded, and invisible to callers: it saves the int() and
# canonical-form checks that dominate decoding a sketch, since one fleet's latencies reuse the
# same few hundred keys. _KEY_SPAN is the smallest and largest key the memo holds: when a
# sketch's alpha admits that whole span (at 1 %, keys of latencies in milliseconds from 1 µs to
# 1 hour lie in [-345, 755], well inside the alpha's [-37,220, 35,488]), every memo hit is a key
# in range; otherwise (the memo has seen keys of a finer alpha) the keys' min and max are read.
_KEY_MEMO: dict[str, int] = {}
_KEY_TEXT: dict[int, str] = {}  # the same memo, int → str, for to_dict
_KEY_MEMO_MAX: Final = 1 << 16
_KEY_SPAN: list[int] = [0, 0]  # [min, max] of the memo's keys ([0, 0] while it is empty)
_JUST_INT: Final = frozenset({int})


def _remember(text: str, key: int) -> None:
    if len(_KEY_MEMO) >= _KEY_MEMO_MAX:
        # Full: start again rather than keep whatever came first (one odd 100,000-bin sketch
        # would otherwise leave no room for the fleet's own keys, and a wide span).
        _KEY_MEMO.clear()
        _KEY_TEXT.clear()
        _KEY_SPAN[:] = [0, 0]
    _KEY_MEMO[text] = key
    if key not in _KEY_TEXT:
        _KEY_TEXT[key] = str(key)  # canonical: "-0" is read as 0 but written "0"
    if key < _KEY_SPAN[0]:
        _KEY_SPAN[0] = key
    elif key > _KEY_SPAN[1]:
        _KEY_SPAN[1] = key


def _key_texts(keys: list[int]) -> list[str]:
    texts = list(map(_KEY_TEXT.get, keys))
    if None not in texts:
        return cast(list[str], texts)
    out = list(map(str, keys))
    for key, text in zip(keys, out, strict=True):
        _remember(text, key)
    return out


def _from_dict_fast(data: object) -> _Parsed | None:
    """The common case, validated in bulk; ``None`` means "take the checked path"."""
    if type(data) is not dict:
        return None
    alpha = data.get("alpha")
    if type(alpha) is not float:
        return None
    m = _MAPPINGS.get(alpha)  # only ever holds alphas _check_alpha accepted
    zeros = data.get("zeros", 0)
    raw = data.get("bins")
    if (
        m is None
        or type(zeros) is not int
        or not 0 <= zeros <= _MAX_COUNT
        or type(raw) is not dict
        or len(raw) > MAX_BINS
    ):
        return None
    if not raw:
        return m, {}, zeros, zeros
    # Every key a plain str the memo knows (so canonical), each to its own integer ("0" and
    # "-0" would share one: the checked path decides), in the alpha's range.
    if set(map(type, raw)) != _JUST_STR:
        return None
    keyed = dict(zip(map(_KEY_MEMO.get, raw), raw.values(), strict=True))
    if None in keyed or len(keyed) != len(raw):
        return None
    bins = cast(dict[int, int], keyed)
    if (_KEY_SPAN[0] < m.key_min or _KEY_SPAN[1] > m.key_max) and (
        min(bins) < m.key_min or max(bins) > m.key_max
    ):
        return None
    counts = bins.values()
    if set(map(type, counts)) != _JUST_INT:  # ints only: no bool, float, str, null
        return None
    low = min(counts)
    if low < 0:
        return None
    total = sum(counts)  # non-negative counts: each is at most the total
    if total > _MAX_COUNT and max(counts) > _MAX_COUNT:
        return None
    if low == 0:
        bins = {k: c for k, c in bins.items() if c}
    return m, bins, zeros, zeros + total


_JUST_STR: Final = frozenset({str})


def _from_dict_checked(data: object, field: str) -> _Parsed:
    """Every rule, field by field, raising :class:`ValidationError` at the first fault."""
    if not isinstance(data, Mapping):
        raise ValidationError(field, f"must be an object, got {_type_name(data)}")
    if "alpha" not in data:
        raise ValidationError(f"{field}.alpha", "missing")
    try:
        alpha = _check_alpha(data["alpha"])
    except ValueError as exc:
        raise ValidationError(f"{field}.alpha", str(exc).removeprefix("alpha ")) from None
    zeros = data.get("zeros", 0)
    if type(zeros) is not int or not 0 <= zeros <= _MAX_COUNT:
        raise ValidationError(f"{field}.zeros", _count_reason(zeros))
    raw_bins = data.get("bins")
    if raw_bins is None:
        raise ValidationError(f"{field}.bins", "missing")
    if not isinstance(raw_bins, Mapping):
        raise ValidationError(f"{field}.bins", f"must be an object, got {_type_name(raw_bins)}")
    if len(raw_bins) > MAX_BINS:
        raise ValidationError(
            f"{field}.bins", f"has {len(raw_bins):,} bins, over the limit of {MAX_BINS:,}"
        )
    m = _mapping(alpha)
    bins = _parse_bins(raw_bins, m, field)
    return m, bins, zeros, zeros + sum(bins.values())


def _parse_bins(raw: Mapping[Any, Any], m: _Mapping, field: str) -> dict[int, int]:
    """Validate ``{"372": 10, ...}`` into ``{372: 10}`` (empty bins dropped), naming the first
    bad bin."""
    match = _INT_KEY.match
    bins: dict[int, int] = {}
    for skey, c in raw.items():
        if type(c) is not int or c < 0 or c > _MAX_COUNT:
            raise ValidationError(f"{field}.bins.{skey}", _count_reason(c))
        if type(skey) is not str or match(skey) is None:
            raise ValidationError(
                f"{field}.bins.{skey}", 'bin keys must be decimal integers such as "372"'
            )
        key = int(skey)
        if not m.key_min <= key <= m.key_max:
            raise ValidationError(f"{field}.bins.{skey}", _range_reason(m))
        _remember(skey, key)
        if c:
            bins[key] = c
    return bins


def _range_reason(m: _Mapping) -> str:
    return (
        f"key out of the range of finite positive values for alpha {m.alpha} "
        f"([{m.key_min}, {m.key_max}])"
    )


def _type_name(value: object) -> str:
    return type_name(value)


def _count_reason(value: object) -> str:
    if type(value) is int:
        if value < 0:
            return f"must be a non-negative integer, got {value}"
        return f"must be at most 2**63-1, got {value}"
    return f"must be a non-negative integer, got {_type_name(value)}"


# -- the wire form as a msgspec type ----------------------------------------------------------


class SketchWire(msgspec.Struct, frozen=True, gc=False):
    """The contract form ``{"alpha": 0.01, "bins": {"372": 10}, "zeros": 0}`` as msgspec decodes
    it inside a message: alpha in ``[MIN_ALPHA, 1)``, at most ``MAX_BINS`` bins with integer keys
    and counts in [0, 2⁶³−1], ``zeros`` likewise (0 if absent); unknown fields ignored.
    :meth:`LatencySketch.from_wire` adds the range of the keys, which depends on alpha.

    A fault is worded by :meth:`LatencySketch.from_dict`'s checked path (``__explain__``), so
    a sketch decoded inside a message and one decoded on its own give the same error."""

    alpha: Annotated[float, msgspec.Meta(ge=MIN_ALPHA, lt=1.0)]
    # Keys within 64 bits: a longer one is refused by msgspec, and then worded by from_dict's
    # checked path, as a key that is not canonical (20 digits) or out of range (19).
    bins: Annotated[
        dict[Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)], Count],
        msgspec.Meta(max_length=MAX_BINS),
    ]
    zeros: Count = 0

    @classmethod
    def __explain__(cls, raw: object, field: str) -> ValidationError | None:
        try:
            _from_dict_checked(raw, field)
        except ValidationError as exc:
            return exc
        return None


_DEFAULT_MAPPING: Final = _mapping(DEFAULT_ALPHA)


class CommonSketchWire(SketchWire, frozen=True, gc=False):
    """:class:`SketchWire` narrowed to what producers send: no empty bins (counts ≥ 1) and keys
    in the range of ``DEFAULT_ALPHA`` (hence of every finer alpha too). Decoding a message tries
    this first, which spares :meth:`LatencySketch.from_wire` two passes over the bins; a sketch
    that does not fit (an empty bin, a key only a finer alpha allows) is decoded again as a
    :class:`SketchWire`, so both accept exactly the same sketches."""

    bins: Annotated[
        dict[
            Annotated[int, msgspec.Meta(ge=_DEFAULT_MAPPING.key_min, le=_DEFAULT_MAPPING.key_max)],
            Annotated[int, msgspec.Meta(ge=1, le=_MAX_COUNT)],
        ],
        msgspec.Meta(max_length=MAX_BINS),
    ]
