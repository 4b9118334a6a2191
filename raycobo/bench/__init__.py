"""Throughput benchmarks (``raycobo bench``): figures, never tests.

- ``engine``: the local engine against the per-client loop per model and n (time, memory)
- ``scaling``: CoBo with O(1/n) sampling at growing n (time, memory, quality)
- ``ray``: CoBo on the Ray engine against the local engine (coordination share)
- ``paper``: the CoBo paper's ResNet-9 experiments at full size against one plain model
"""

from raycobo.bench.engine import bench_engine
from raycobo.bench.ray import bench_ray
from raycobo.bench.scaling import bench_scaling

__all__ = ["bench_engine", "bench_ray", "bench_scaling"]
