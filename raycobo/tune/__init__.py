"""Ray Tune sweeps over dotted config keys (``raycobo sweep``)."""

from raycobo.tune.space import SweepSpec, load_sweep

__all__ = ["SweepSpec", "load_sweep"]
