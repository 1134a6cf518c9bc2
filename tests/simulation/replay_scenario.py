"""The scenario both replay tests record and replay: ten minutes of one region with a CPU trace,
a preemption and grant of the strong model's accelerators, and a surge (small enough for a
simulation test, varied enough that replay and derived scenarios have something to get wrong)."""

from __future__ import annotations


def replay_scenario_text(name: str) -> str:
    """The scenario's YAML, named ``name``."""
    return _YAML.replace("name: roundtrip", f"name: {name}", 1)


_YAML = """
name: roundtrip
seed: 21
duration_s: 600
slo: {p99_ms: 200, window_s: 10}
world: {ads: 4000, dim: 16, base_candidates: 200, max_candidates: 600, holdout: 0.05}
models:
  base:   {cpu_ms_per_candidate: 0.1,   accelerator_ms_per_candidate: 0.02,
           hardware: [gpu-a, gpu-b]}
  strong: {cpu_ms_per_candidate: 0.005, accelerator_ms_per_candidate: 0.1,
           hardware: [gpu-b], load_s: 30}
segments:
  - {name: premium, share: 0.2, value: {mean: 3.0, sigma: 0.8}, base_error: 0.15,
     strong_error: 0.10}
  - {name: casual,  share: 0.8, value: {mean: 0.6, sigma: 0.6}, base_error: 0.50,
     strong_error: 0.20}
regions:
  - name: r1
    dedicated: {cpu: 12, accelerator: 2, hardware: gpu-a}
    traffic: {rps: 100, noise: 0.05}
    opportunistic:
      - {resource: cpu,         hardware: any,   trace: [[0, 6], [200, 12], [450, 3]]}
      - {resource: accelerator, hardware: gpu-b, trace: [[0, 2]], expires_in_s: 600}
events:
  - {at_s: 250, kind: preempt, region: r1, resource: accelerator, hardware: gpu-b, units: 0}
  - {at_s: 330, kind: grant,   region: r1, resource: accelerator, hardware: gpu-b, units: 2}
  - {at_s: 480, kind: surge,   region: r1, factor: 1.5, duration_s: 60}
"""
