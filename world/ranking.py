"""The ranking world: a seeded ad corpus, users in segments, a true utility, retrieval, two models.

There is no production ads system behind headroom, so the work it controls is a synthetic but
real ranking funnel whose value has a ground truth (docs/world.md). Everything here is pure: no
clock, no global RNG; every random quantity comes from ``numpy.random.Generator`` objects seeded
from ``(seed, purpose, …)``, so the same seed gives the same world on every machine, and a user's
vectors depend only on ``(seed, segment, user id)``.

The algorithm
-------------

Corpus (built once): ``ads`` ad embeddings ``E_a ~ N(0, I/dim)``, idiosyncratic factors
``P_a ~ N(0, I)`` of rank :data:`IDIO_RANK`, log-normal bids ``b_a = exp(N(0, BID_SIGMA²))``, and
an ad-level drift process ``q_a(t)`` (below).

Users: ``e_u = √ρ·c_s + √(1-ρ)·g_u`` with the segment's centroid ``c_s ~ N(0, I)``, a personal
``g_u ~ N(0, I)`` and ``ρ =`` :data:`SEGMENT_COHESION`; ``p_u ~ N(0, I)`` (rank IDIO_RANK).

True score and utility (unknown to the models)::

    z(u, a, t) = W_AFF·⟨e_u, E_a⟩ + W_IDIO·⟨p_u, P_a⟩/√IDIO_RANK + W_DRIFT·q_a(t) − Z0
    U(u, a, t) = b_a · σ(z)                       (bid × click probability)
    quality(u, a, t) = U(u, a, t) / max_a' U(u, a', t)      ∈ (0, 1]

Each of the three terms has unit variance, so ``std(z) = √(W_AFF² + W_IDIO² + W_DRIFT²)``
(:data:`SCORE_STD`). ``quality`` is 1 for the best ad of the whole corpus for that user at that
time: delivered value = the request's value signal × quality of the ad ranked first.

Retrieval (cheap, approximate): the index holds only the first ``k = max(1, dim //``
:data:`RETRIEVAL_DIM_DIVISOR` ``)`` coordinates of the embeddings (4 of 32), and it knows the bids
and the ad-level term (they are served from real-time ad state), not the idiosyncratic one::

    r(u, a, t) = log b_a + W_AFF·⟨e_u[:k], E_a[:k]⟩ + W_DRIFT·q_a(t)

The top-N by ``r`` are the candidates, in ``r`` order, so the candidates for N are a prefix of
those for any larger N. Since ``log U ≈ log b + z`` in the low-click regime, ``r`` is a noisy
estimate of ``log U``: each added candidate is less likely to be the best than the last —
diminishing returns for RMA emerge from this, they are not typed in.

Models: both compute the true features (dot products), then a small ReLU MLP of width ``H_m`` on
their own misspecified features ``x = r_u^m ⊙ R_m[a]`` (rank :data:`ERROR_RANK`); its output,
standardised to unit variance, is the model's error ``ε_m(u, a)``, fixed per (user, ad, model)::

    ẑ_m(u, a, t) = z(u, a, t) + err_{m,s} · SCORE_STD · ε_m(u, a)
    score_m(u, a, t) = b_a · σ(ẑ_m)

``err_{m,s}`` is the segment's ``base_error`` or ``strong_error``: the error's standard deviation
relative to the spread of the true score. The strong model's hidden layer is wider by the ratio
of the declared accelerator costs (``strong/base``, clamped to [1, 32]), so it really does
proportionally more work per candidate (:func:`headroom.world.curves.measure_cost` times it).

Drift (the precompute lever): ``q_a(t)`` is an Ornstein–Uhlenbeck-like stationary process with
correlation ``E[q_a(t) q_a(t+Δ)] = exp(−λ|Δ|)``, built from :data:`DRIFT_FEATURES` random Fourier
features ``q_a(t) = √(2/K) Σ_k cos(ω_ak t + φ_ak)`` with Cauchy-distributed frequencies (the
Lorentzian spectrum of that correlation), so it can be evaluated at any ``t`` without stepping.
``λ = −ln(1 − drift_per_h)/3600`` per second: after one hour the ad-level term keeps a correlation
of ``1 − drift_per_h``. It is evaluated on a :data:`DRIFT_STEP_S` grid (bids and budgets are
updated about once a minute), which makes it deterministic in ``(seed, t)`` and cacheable.
Without ``drift_per_h`` the ad-level term is frozen at ``q_a(0)``.

Constants are chosen so the reference scenarios show the behaviour the issue asks for (RMA
gains of a few percent of quality from base to max candidates, strong-model uplift that grows
with ``base_error − strong_error``); docs/world.md lists the measured curves.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from headroom.kernel import seeds
from headroom.kernel.scenario import Scenario
from headroom.kernel.vocab import Model
from headroom.world.values import ValueCurves

__all__ = [
    "WORLD_VERSION",
    "Model",
    "RankResult",
    "RankingWorld",
    "SegmentParams",
    "UserBatch",
    "WorldParams",
]

WORLD_VERSION = 2  # bump whenever a change alters what a seed produces (invalidates cached curves)

# The true score's three unit-variance terms and their weights. The affinity dominates (users
# differ in what they like), the idiosyncratic term is what retrieval cannot see, the ad-level
# term is what drifts. Z0 = 6 puts the typical click probability well under 1% (σ(−6) ≈ 0.25%,
# the regime of display ads) where log σ(z) ≈ z, so retrieval's log-linear score is a fair
# approximation, and even the corpus's best ads are not saturated (σ(z) < 0.5): utility keeps
# separating good ads from the best one. With a smaller Z0 the top few hundred ads all have
# σ ≈ 1 and the choice among them stops mattering.
W_AFF = 1.0
W_IDIO = 0.6
W_DRIFT = 0.5
Z0 = 6.0
SCORE_STD = math.sqrt(W_AFF**2 + W_IDIO**2 + W_DRIFT**2)
BID_SIGMA = 0.4  # log-normal bid spread: top bids ~2.2× the median (a 2-sigma ad)
SEGMENT_COHESION = 0.3  # share of a user's taste variance shared with its segment
IDIO_RANK = 16
ERROR_RANK = 16
BASE_HIDDEN = 64  # base model MLP width; the strong model's is this × the declared cost ratio
MAX_WIDTH_RATIO = 32
RETRIEVAL_DIM_DIVISOR = 8  # the index keeps dim/8 coordinates: an 8× cheaper scan
DRIFT_FEATURES = 8
DRIFT_STEP_S = 60.0
_DRIFT_CACHE = 8  # drift fields kept (a few distinct minutes are in use at once)
_NORMALISER_SAMPLE = (64, 512)  # users × ads used to standardise each model's MLP output

FloatArray = npt.NDArray[np.float64]
F32 = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class SegmentParams:
    name: str
    base_error: float
    strong_error: float


@dataclass(frozen=True, slots=True)
class WorldParams:
    """Everything that determines the world (and so its curves)."""

    seed: int
    ads: int
    dim: int
    base_candidates: int
    max_candidates: int
    segments: tuple[SegmentParams, ...]
    drift_per_h: float = 0.0
    strong_width_ratio: int = 5

    def __post_init__(self) -> None:
        if self.ads < 1 or self.dim < 1:
            raise ValueError("ads and dim must be >= 1")
        if not 1 <= self.base_candidates <= self.max_candidates <= self.ads:
            raise ValueError("need 1 <= base_candidates <= max_candidates <= ads")
        if not self.segments:
            raise ValueError("need at least one segment")
        if not 0.0 <= self.drift_per_h < 1.0:
            raise ValueError("drift_per_h must be in [0, 1)")
        if not 1 <= self.strong_width_ratio <= MAX_WIDTH_RATIO:
            raise ValueError(f"strong_width_ratio must be in [1, {MAX_WIDTH_RATIO}]")

    @classmethod
    def from_scenario(cls, scenario: Scenario, seed: int | None = None) -> WorldParams:
        w, models = scenario.world, scenario.models
        base_acc = models.base.accelerator_ms_per_candidate
        ratio = models.strong.accelerator_ms_per_candidate / base_acc if base_acc > 0 else 1.0
        return cls(
            seed=scenario.seed if seed is None else seed,
            ads=w.ads,
            dim=w.dim,
            base_candidates=w.base_candidates,
            max_candidates=w.max_candidates,
            segments=tuple(
                SegmentParams(s.name, s.base_error, s.strong_error) for s in scenario.segments
            ),
            drift_per_h=w.drift_per_h or 0.0,
            strong_width_ratio=int(min(MAX_WIDTH_RATIO, max(1, round(ratio)))),
        )

    def fingerprint(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "ads": self.ads,
            "dim": self.dim,
            "base_candidates": self.base_candidates,
            "max_candidates": self.max_candidates,
            "segments": [[s.name, s.base_error, s.strong_error] for s in self.segments],
            "drift_per_h": self.drift_per_h,
            "strong_width_ratio": self.strong_width_ratio,
        }


@dataclass(frozen=True, slots=True)
class RankResult:
    """One ranking: ``ranking`` holds the candidates' ad ids, best first by the model's score."""

    ranking: IntArray
    top_ad: int
    quality: float  # normalised true utility of top_ad at t_s, in (0, 1]
    utility: float  # raw true utility b·σ(z) of top_ad
    best_utility: float  # the corpus maximum for this user at t_s (quality = utility / this)


@dataclass(frozen=True, slots=True)
class UserBatch:
    """Per-user vectors for a batch of users of one segment (rows aligned with the ids)."""

    e: F32  # (B, dim) taste
    p: F32  # (B, IDIO_RANK) idiosyncratic factors
    r: tuple[F32, F32]  # per model (B, ERROR_RANK): the model's misspecified user features


@dataclass(frozen=True, slots=True)
class _Mlp:
    w1: F32  # (ERROR_RANK, H)
    b1: F32  # (H,)
    w2: F32  # (H,)
    mean: float  # output standardisation, measured once at construction
    std: float


class RankingWorld:
    """The world for one set of :class:`WorldParams`. Build with :meth:`from_scenario`."""

    def __init__(self, params: WorldParams) -> None:
        self.params = params
        p = params
        root = seeds.world_root(p.seed)
        corpus, ads_rng, models_rng, drift_rng, seg_rng = (
            np.random.default_rng(s) for s in root.spawn(5)
        )
        del corpus
        self._seg_index = {s.name: i for i, s in enumerate(p.segments)}
        self.emb: F32 = (ads_rng.standard_normal((p.ads, p.dim)) / math.sqrt(p.dim)).astype(
            np.float32
        )
        self.idio: F32 = ads_rng.standard_normal((p.ads, IDIO_RANK)).astype(np.float32)
        self.log_bid: F32 = (BID_SIGMA * ads_rng.standard_normal(p.ads)).astype(np.float32)
        self.bid: F32 = np.exp(self.log_bid).astype(np.float32)
        self.k = max(1, p.dim // RETRIEVAL_DIM_DIVISOR)
        self._emb_index: F32 = np.ascontiguousarray(self.emb[:, : self.k])
        self.centroids: F32 = seg_rng.standard_normal((len(p.segments), p.dim)).astype(np.float32)
        # Models: residual feature tables and MLP weights.
        widths = (BASE_HIDDEN, BASE_HIDDEN * p.strong_width_ratio)
        self._resid: list[F32] = []
        self._mlp: list[_Mlp] = []
        for width in widths:
            resid = models_rng.standard_normal((p.ads, ERROR_RANK)).astype(np.float32)
            w1 = (models_rng.standard_normal((ERROR_RANK, width)) / math.sqrt(ERROR_RANK)).astype(
                np.float32
            )
            b1 = (0.1 * models_rng.standard_normal(width)).astype(np.float32)
            w2 = (models_rng.standard_normal(width) / math.sqrt(width)).astype(np.float32)
            self._resid.append(resid)
            self._mlp.append(_Mlp(w1, b1, w2, 0.0, 1.0))
        # Standardise each model's MLP output on a fixed sample of (user, ad) pairs.
        n_users, n_ads = _NORMALISER_SAMPLE
        sample_rng = np.random.default_rng(root.spawn(1)[0])
        ru = sample_rng.standard_normal((n_users, ERROR_RANK)).astype(np.float32)
        ads = sample_rng.integers(0, p.ads, size=n_ads)
        for m in (0, 1):
            raw = self._mlp_raw(m, ru[:, None, :] * self._resid[m][ads][None, :, :])
            mlp = self._mlp[m]
            self._mlp[m] = _Mlp(mlp.w1, mlp.b1, mlp.w2, float(raw.mean()), float(raw.std()))
        # Drift: Cauchy frequencies (rad/s) with scale λ, uniform phases.
        self.drift_rate_per_s = -math.log1p(-p.drift_per_h) / 3600.0 if p.drift_per_h else 0.0
        u = drift_rng.random((p.ads, DRIFT_FEATURES))
        self._omega = self.drift_rate_per_s * np.tan(np.pi * (u - 0.5))
        self._phase = drift_rng.uniform(0.0, 2 * np.pi, (p.ads, DRIFT_FEATURES))
        self._drift_cache: OrderedDict[float, F32] = OrderedDict()
        self.errors = np.array(
            [[s.base_error for s in p.segments], [s.strong_error for s in p.segments]],
            dtype=np.float64,
        )  # (2, S)

    @classmethod
    def from_scenario(cls, scenario: Scenario, seed: int | None = None) -> RankingWorld:
        return cls(WorldParams.from_scenario(scenario, seed=seed))

    # -- the pieces --------------------------------------------------------------------------------

    def segment_index(self, segment: str | int) -> int:
        if isinstance(segment, str):
            try:
                return self._seg_index[segment]
            except KeyError:
                raise KeyError(f"unknown segment {segment!r}") from None
        if not 0 <= int(segment) < len(self.params.segments):
            raise KeyError(f"segment index {segment} out of range")
        return int(segment)

    def users(self, user_ids: npt.ArrayLike, segment: str | int) -> UserBatch:
        """The vectors of these users (deterministic in seed, segment and id)."""
        s = self.segment_index(segment)
        ids = np.atleast_1d(np.asarray(user_ids, dtype=np.int64))
        dim = self.params.dim
        width = dim + IDIO_RANK + 2 * ERROR_RANK
        raw = np.empty((len(ids), width), dtype=np.float64)
        for i, uid in enumerate(ids.tolist()):
            raw[i] = seeds.user_rng(self.params.seed, s, uid).standard_normal(width)
        e = (
            math.sqrt(SEGMENT_COHESION) * self.centroids[s]
            + math.sqrt(1 - SEGMENT_COHESION) * raw[:, :dim]
        )
        p = raw[:, dim : dim + IDIO_RANK]
        r0 = raw[:, dim + IDIO_RANK : dim + IDIO_RANK + ERROR_RANK]
        r1 = raw[:, dim + IDIO_RANK + ERROR_RANK :]
        return UserBatch(
            e=e.astype(np.float32),
            p=p.astype(np.float32),
            r=(r0.astype(np.float32), r1.astype(np.float32)),
        )

    def ad_drift(self, t_s: float) -> F32:
        """``q_a(t)`` for every ad, on the DRIFT_STEP_S grid (frozen at t = 0 without drift)."""
        tq = 0.0 if not self.drift_rate_per_s else math.floor(t_s / DRIFT_STEP_S) * DRIFT_STEP_S
        cached = self._drift_cache.get(tq)
        if cached is not None:
            self._drift_cache.move_to_end(tq)
            return cached
        waves = np.cos(self._omega * tq + self._phase)
        q: F32 = (math.sqrt(2.0 / DRIFT_FEATURES) * waves.sum(axis=1)).astype(np.float32)
        q.setflags(write=False)
        self._drift_cache[tq] = q
        if len(self._drift_cache) > _DRIFT_CACHE:
            self._drift_cache.popitem(last=False)
        return q

    def _static_score(self, users: UserBatch, ads: npt.NDArray[Any] | None = None) -> F32:
        """``W_AFF·aff + W_IDIO·idio − Z0`` for every (user, ad): (B, ads) or (B, n) with ads."""
        if ads is None:
            aff = users.e @ self.emb.T
            idio = users.p @ self.idio.T
        else:  # ads: (B, n) per-user candidate ids
            aff = np.einsum("bd,bnd->bn", users.e, self.emb[ads])
            idio = np.einsum("br,bnr->bn", users.p, self.idio[ads])
        out: F32 = (W_AFF * aff + (W_IDIO / math.sqrt(IDIO_RANK)) * idio - Z0).astype(np.float32)
        return out

    def _retrieval_static(self, users: UserBatch) -> F32:
        out: F32 = (
            self.log_bid[None, :] + W_AFF * (users.e[:, : self.k] @ self._emb_index.T)
        ).astype(np.float32)
        return out

    @staticmethod
    def _top_n(scores: F32, n: int) -> IntArray:
        """Per row, the indices of the n highest scores, best first."""
        if n < scores.shape[1]:
            part = np.argpartition(-scores, n - 1, axis=1)[:, :n]
        else:
            part = np.broadcast_to(np.arange(scores.shape[1]), scores.shape).copy()
        order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1, kind="stable")
        return np.asarray(np.take_along_axis(part, order, axis=1), dtype=np.int64)

    def _mlp_raw(self, m: int, x: F32) -> F32:
        """The MLP on (..., ERROR_RANK) inputs, as one 2-D matrix product per layer."""
        mlp = self._mlp[m]
        flat = x.reshape(-1, ERROR_RANK)
        h = flat @ mlp.w1
        h += mlp.b1
        np.maximum(h, 0.0, out=h)
        out = np.asarray(h @ mlp.w2, dtype=np.float32).reshape(x.shape[:-1])
        return out

    def model_error(self, m: int, users: UserBatch, cands: IntArray) -> F32:
        """The model's standardised error ε_m(u, a) for (B, n) candidates: its forward pass."""
        x = users.r[m][:, None, :] * self._resid[m][cands]
        mlp = self._mlp[m]
        out: F32 = ((self._mlp_raw(m, x) - mlp.mean) / mlp.std).astype(np.float32)
        return out

    def _model_scores(self, m: int, s: int, users: UserBatch, cands: IntArray, z_cands: F32) -> F32:
        err = self.errors[m, s] * SCORE_STD
        z_hat = z_cands + np.float32(err) * self.model_error(m, users, cands)
        out: F32 = self.bid[cands] * _sigmoid(z_hat)
        return out

    # -- single-request API (workers) --------------------------------------------------------------

    def retrieve(self, user: int, segment: str | int, n: int, t_s: float = 0.0) -> IntArray:
        """The top-n candidate ad ids by the cheap retrieval score, best first."""
        out: IntArray = self.retrieve_batch(self.users([user], segment), n, t_s)[0]
        return out

    def retrieve_batch(self, users: UserBatch, n: int, t_s: float = 0.0) -> IntArray:
        """(B, n) candidate ids for a batch of users: the corpus scan and top-n selection."""
        self._check_n(n)
        r = self._retrieval_static(users) + W_DRIFT * self.ad_drift(t_s)[None, :]
        return self._top_n(r, n)

    def score_batch(
        self,
        users: UserBatch,
        segment: str | int,
        candidates: IntArray,
        model: Model | str | int,
        t_s: float = 0.0,
    ) -> F32:
        """(B, n) predicted utilities: the model's features and forward pass for each candidate."""
        s, m = self.segment_index(segment), int(Model.of(model))
        z = self._static_score(users, candidates) + W_DRIFT * self.ad_drift(t_s)[candidates]
        return self._model_scores(m, s, users, candidates, z)

    def score(
        self,
        user: int,
        segment: str | int,
        candidates: npt.ArrayLike,
        model: Model | str | int,
        t_s: float = 0.0,
    ) -> F32:
        """The model's predicted utility for each candidate (higher is better)."""
        cands = np.asarray(candidates, dtype=np.int64)[None, :]
        out: F32 = self.score_batch(self.users([user], segment), segment, cands, model, t_s)[0]
        return out

    def rank(
        self,
        user: int,
        segment: str | int,
        n: int,
        model: Model | str | int,
        t_s: float = 0.0,
    ) -> RankResult:
        """Retrieve n candidates for the user at t_s and rank them with the model."""
        s = self.segment_index(segment)
        cands = self.retrieve(user, s, n, t_s)
        scores = self.score(user, s, cands, model, t_s)
        ranking = cands[np.argsort(-scores, kind="stable")]
        top = int(ranking[0])
        quality, utility, best = self._quality_of(user, s, np.array([top]), t_s)
        return RankResult(
            ranking=ranking,
            top_ad=top,
            quality=float(quality[0]),
            utility=float(utility[0]),
            best_utility=best,
        )

    def quality(
        self, user: int, segment: str | int, n: int, model: Model | str | int, t_s: float = 0.0
    ) -> float:
        """Normalised true utility of the ad the model ranks first (see :meth:`rank`)."""
        return self.rank(user, segment, n, model, t_s).quality

    def ad_quality(
        self, user: int, segment: str | int, ads: npt.ArrayLike, t_s: float = 0.0
    ) -> FloatArray:
        """Normalised true utility of the given ads for the user at t_s (e.g. a stored ranking's
        first ad at visit time, for precompute)."""
        q, _, _ = self._quality_of(user, self.segment_index(segment), np.asarray(ads), t_s)
        return q

    def _quality_of(
        self, user: int, s: int, ads: npt.NDArray[Any], t_s: float
    ) -> tuple[FloatArray, FloatArray, float]:
        users = self.users([user], s)
        z = self._static_score(users)[0] + W_DRIFT * self.ad_drift(t_s)
        u = self.bid * _sigmoid(z)
        best = float(u.max())
        utility = u[np.asarray(ads, dtype=np.int64)].astype(np.float64)
        return utility / best, utility, best

    def _check_n(self, n: int) -> None:
        if not 1 <= n <= self.params.ads:
            raise ValueError(f"n must be in [1, {self.params.ads}], got {n}")

    # -- batch measurement (curves) ----------------------------------------------------------------

    def measure_curves(
        self,
        *,
        samples_per_segment: int | None = None,
        grid_points: int = 17,
        ages_s: npt.ArrayLike | None = None,
        batch: int = 64,
    ) -> ValueCurves:
        """Measure :class:`headroom.world.values.ValueCurves` on this world (see that module)."""
        p = self.params
        samples = samples_per_segment or DEFAULT_SAMPLES
        grid = np.unique(
            np.round(np.linspace(p.base_candidates, p.max_candidates, grid_points)).astype(np.int64)
        )
        if ages_s is None:
            ages = np.array(DEFAULT_AGES_S if self.drift_rate_per_s else [0.0], dtype=np.float64)
        else:
            ages = np.asarray(ages_s, dtype=np.float64)
        n_seg = len(p.segments)
        nmax = int(grid[-1])
        q_top = np.zeros((2, n_seg, samples, len(grid)), dtype=np.float64)
        q_pre = np.zeros((n_seg, samples, len(ages)), dtype=np.float64)
        for s in range(n_seg):
            for start in range(0, samples, batch):
                stop = min(samples, start + batch)
                # Distinct user ids per segment and chunk; each chunk starts at its own time so
                # the measurement averages over the drift process rather than one instant.
                ids = np.arange(start, stop, dtype=np.int64) + 1_000_000 * (s + 1)
                t0 = float(start // batch) * CHUNK_SPACING_S if self.drift_rate_per_s else 0.0
                users = self.users(ids, s)
                static = self._static_score(users)
                q0 = self.ad_drift(t0)
                z = static + W_DRIFT * q0[None, :]
                best = (self.bid[None, :] * _sigmoid(z)).max(axis=1)
                r = self._retrieval_static(users) + W_DRIFT * q0[None, :]
                cands = self._top_n(r, nmax)
                z_c = np.take_along_axis(z, cands, axis=1)
                qual_c = self.bid[cands] * _sigmoid(z_c) / best[:, None]
                rows = np.arange(stop - start)
                top_strong = None
                for m in (0, 1):
                    scores = self._model_scores(m, s, users, cands, z_c)
                    idx = _prefix_argmax(scores)  # (B, nmax): argmax among the first j+1
                    q_top[m, s, start:stop] = qual_c[rows[:, None], idx[:, grid - 1]]
                    if m == 1:
                        top_strong = cands[rows, idx[:, nmax - 1]]
                assert top_strong is not None
                for a, age in enumerate(ages):
                    if age == 0:
                        q_pre[s, start:stop, a] = q_top[1, s, start:stop, -1]
                        continue
                    qa = self.ad_drift(t0 + float(age))
                    za = static + W_DRIFT * qa[None, :]
                    ua = self.bid[None, :] * _sigmoid(za)
                    q_pre[s, start:stop, a] = ua[rows, top_strong] / ua.max(axis=1)
        return ValueCurves(
            segments=tuple(sp.name for sp in p.segments),
            n_grid=grid,
            mean=q_top.mean(axis=2),
            std=q_top.std(axis=2),
            age_grid_s=ages,
            precompute_mean=q_pre.mean(axis=1),
            precompute_std=q_pre.std(axis=1),
            precompute_n=nmax,
            samples_per_segment=samples,
        )


DEFAULT_SAMPLES = 256
CHUNK_SPACING_S = 7 * 3600.0  # chunks of users measured at different times (drift only)
DEFAULT_AGES_S = (0.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 57600.0, 86400.0)


def _sigmoid(x: F32) -> F32:
    out: F32 = 0.5 * (1.0 + np.tanh(0.5 * x))  # numerically safe for any x
    return out


def _prefix_argmax(scores: F32) -> IntArray:
    """Per row, for every prefix length j+1, the index of its (first) maximum."""
    b, n = scores.shape
    prev = np.maximum.accumulate(scores, axis=1)
    new = np.empty((b, n), dtype=bool)
    new[:, 0] = True
    new[:, 1:] = scores[:, 1:] > prev[:, :-1]
    pos = np.where(new, np.arange(n)[None, :], 0)
    return np.asarray(np.maximum.accumulate(pos, axis=1), dtype=np.int64)
