"""Experiment tracking callbacks (MLflow). Nothing below this layer imports mlflow."""

from raycobo.tracking.mlflow_tracker import MLflowTracker, ParentRole, flatten_params

__all__ = ["MLflowTracker", "ParentRole", "flatten_params"]
