"""The control plane facade: one call per region per control interval, for both engines.

(Interface published first; the allocator, PID, coverage and router bodies follow.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from controllers.config import ControlConfig
from controllers.levers import LeverRegistry
from controllers.types import RegionObservation, RegionTargets

__all__ = ["ControlConfig", "ControlPlane"]


class ControlPlane:
    """Runs allocator → RMA PID → SBM coverage → router for one region per :meth:`step`."""

    def __init__(
        self,
        config: ControlConfig,
        rng: np.random.Generator,
        levers: LeverRegistry | None = None,
    ) -> None:
        self.config = config
        self.rng = rng
        self.levers = levers or LeverRegistry.standard(
            config.costs,
            config.base_candidates,
            config.max_candidates,
            max_coverage=config.coverage.max_coverage,
            precompute=config.precompute_enabled,
        )
        self._epochs: dict[str, int] = {}

    def step(self, obs: RegionObservation) -> RegionTargets:
        epoch = max(self._epochs.get(obs.region, 0) + 1, int(obs.now))
        self._epochs[obs.region] = epoch
        cfg = self.config
        return RegionTargets(
            region=obs.region,
            ts=obs.now,
            epoch=epoch,
            ttl_s=cfg.ttl_s,
            rma_candidates=cfg.base_candidates,
            rma_base=cfg.base_candidates,
            rma_max=cfg.max_candidates,
            sbm_coverage=0.0,
            sbm_segments={s: 0.0 for s in cfg.segment_names},
            budget_cpu=0.0,
            budget_accelerator=0.0,
            reason="baseline",
        )

    def snapshot(self) -> dict[str, Any]:
        return {"version": 1, "epochs": dict(self._epochs)}

    @classmethod
    def restore(
        cls,
        config: ControlConfig,
        snapshot: dict[str, Any],
        rng: np.random.Generator,
        levers: LeverRegistry | None = None,
    ) -> ControlPlane:
        plane = cls(config, rng, levers)
        plane._epochs = {str(k): int(v) for k, v in snapshot.get("epochs", {}).items()}
        return plane
