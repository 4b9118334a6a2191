"""Experiment tracking callbacks (MLflow). Nothing below this layer imports mlflow."""

from raycobo.tracking.mlflow_tracker import MLflowTracker, flatten_params

__all__ = ["MLflowTracker", "flatten_params"]
