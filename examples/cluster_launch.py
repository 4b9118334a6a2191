"""Run a raycobo command on the Ray cluster this script is submitted to.

    ray submit cluster/cluster.yaml examples/cluster_launch.py -- \
        sweep tune_spaces/cobo_cross_silo.yaml
    ray submit cluster/cluster.yaml examples/cluster_launch.py -- \
        compare examples/cross_device_cifar100.yaml
    ray job submit --address http://HEAD:8265 --working-dir . -- \
        python examples/cluster_launch.py run examples/scaling_study.yaml

It joins the running cluster (engine.address=auto) and logs to the head's MLflow server
(tracking.uri=http://<head>:5000; RAYCOBO_MLFLOW_HOST and RAYCOBO_MLFLOW_PORT change the
address, as in the recipes' head_setup_commands) unless the arguments set those keys.
Use --smoke-test with a sweep to check the cluster end to end first.
"""

from __future__ import annotations

import os
import socket
import sys


def cluster_args(argv: list[str], tracking_host: str | None = None) -> list[str]:
    """argv plus the cluster defaults for keys the user did not set."""
    if not argv or argv[0] in ("-h", "--help"):
        return argv
    args = list(argv)
    keys = {a.split("=", 1)[0] for a in args if "=" in a and not a.startswith("-")}
    if args[0] in ("run", "compare", "sweep", "demo"):
        if "engine.address" not in keys:
            args.append("engine.address=auto")
        if "tracking.uri" not in keys:
            host = tracking_host or os.environ.get("RAYCOBO_MLFLOW_HOST") or socket.gethostname()
            port = os.environ.get("RAYCOBO_MLFLOW_PORT", "5000")
            args.append(f"tracking.uri=http://{host}:{port}")
    return args


def main() -> None:
    from raycobo.cli import app

    app(cluster_args(sys.argv[1:]), prog_name="raycobo")


if __name__ == "__main__":
    main()
