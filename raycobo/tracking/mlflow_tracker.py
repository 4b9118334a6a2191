"""MLflow tracking as a run callback.

Logs the resolved config as params, every evaluation's metrics with step = round (mean
and per client), round statistics, and at the end the plots, summary.json, config.yaml,
metrics.csv and W as artifacts. The default store is a sqlite file (MLflow 3 refuses the
plain file store by default); ``tracking.uri`` selects any other, e.g. an http tracking
server. If the store cannot be reached the run warns once, goes on, and still writes its
run directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raycobo.algorithms.settings import MethodConfig
from raycobo.config import TrackingConfig, flat_tree
from raycobo.lifecycle.callbacks import BaseCallback, RunContext
from raycobo.lifecycle.provenance import mlflow_tags, provenance
from raycobo.tracking.params import read_params

_MAX_BATCH = 100
# experiments open on MLflow 3's runs view for model training, not its GenAI layout
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def in_percent(key: str, value: float) -> float:
    """Accuracies go to MLflow in percent, as the console and the report show them."""
    return 100.0 * value if "accuracy" in key else value


def flatten_params(tree: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A config tree as MLflow params (dotted keys). A null key is left out: it is unset
    (or not one that applies), and the string "None" would be searched as a value."""
    return _as_params(flat_tree(tree, prefix))


@contextlib.contextmanager
def _store_errors_unlogged():
    """MLflow logs a failed store call (a deleted sqlite file: an 80-line SQLAlchemy
    traceback) before raising it; the tracker says it in one line of its own."""
    logger = logging.getLogger("mlflow")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _root_cause(err: BaseException) -> BaseException:
    """The error beneath the wrappers (SQLAlchemy's ``orig``, the ``__cause__`` chain)."""
    seen = set()
    while id(err) not in seen:
        seen.add(id(err))
        inner = getattr(err, "orig", None) or err.__cause__
        if not isinstance(inner, BaseException):
            break
        err = inner
    return err


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__


def _as_params(flat: dict[str, Any]) -> dict[str, str]:
    """Flat keys as MLflow params (a null key is left out: unset, or not one that applies)."""
    return {k: str(v)[:6000] for k, v in flat.items() if v is not None}


def resolve_uri(uri: str) -> str:
    """Make a relative sqlite path absolute so workers and `mlflow ui` agree on it."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str(Path(uri[len(prefix) :]).resolve())
    return uri


@contextlib.contextmanager
def store_lock(uri: str, wait_s: float = 120.0):
    """Serialize first contact with a sqlite store across processes: MLflow creates and
    migrates the schema on first use, and runs that start at once on a new file collide
    (``table ... already exists``). A lock file beside the database; a bounded wait, then
    on without it."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        yield
        return
    db = Path(uri[len(prefix) :])
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a+") as f:
        deadline = time.monotonic() + wait_s
        locked = False
        while not locked and time.monotonic() < deadline:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = True
            except OSError:
                time.sleep(0.05)
        try:
            yield
        finally:
            if locked:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def absolute_locations(cfg: TrackingConfig) -> dict[str, str]:
    """``tracking.uri`` and ``tracking.artifact_root`` as overrides that every process
    (sweep trials, parallel compare runs) finds whatever its working directory."""
    art = cfg.artifact_root
    return {
        "tracking.uri": resolve_uri(cfg.uri),
        "tracking.artifact_root": art if "://" in art else str(Path(art).resolve()),
    }


@dataclass(frozen=True)
class ParentRole:
    """What a parent run (a comparison, a sweep) is: ``kind``, its own params (the
    entries and seeds, or the search space and metric) and the config keys that vary
    among its children (left out of its params)."""

    kind: str
    params: dict[str, Any]
    varied: tuple[str, ...] = ()


class MLflowTracker(BaseCallback):
    def __init__(
        self,
        cfg: TrackingConfig,
        run_name: str | None = None,
        quiet: bool = False,
        parent: MLflowTracker | str | None = None,
        role: ParentRole | None = None,
        run_dir: Path | None = None,
        tags: dict[str, str] | None = None,
    ):
        """``parent``: a run id, or the tracker of a parent run (compare, sweep) whose id
        is read when this run starts. ``role``: this run is itself such a parent: it
        records what it is (its entries or search space) instead of one method's
        settings. ``tags``: more tags for the run (a sweep's: trial or final test run)."""
        self.cfg = cfg
        self.parent = parent
        self.role = role
        self.run_dir = run_dir  # where the run's folder is kept, if not where it runs
        self.tags = dict(tags or {})
        self.uri = resolve_uri(cfg.uri)
        self.run_name = run_name
        self.quiet = quiet
        self.enabled = cfg.enabled
        self.client = None
        self.run_id: str | None = None
        self._pending: list[Any] = []

    # -- helpers -----------------------------------------------------------------------
    def _disable(self, err: BaseException) -> None:
        if self.enabled and not self.quiet:
            msg = _first_line(_root_cause(err))
            print(
                f"warning: MLflow tracking disabled ({self.uri}): {msg}; "
                "the run continues and its run directory is written",
                file=sys.stderr,
            )
        self.enabled = False

    def _guard(self, fn, *args, **kwargs):
        if not self.enabled or self.client is None or self.run_id is None:
            return None
        try:
            with _store_errors_unlogged():
                return fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - tracking must never stop a run
            self._disable(err)
            return None

    def experiment_id(self, client) -> str:
        exp = client.get_experiment_by_name(self.cfg.experiment)
        if exp is not None:
            if not exp.tags.get("mlflow.experimentKind"):  # made before raycobo set it
                for key, value in EXPERIMENT_KIND.items():
                    client.set_experiment_tag(exp.experiment_id, key, value)
            return exp.experiment_id
        root = Path(self.cfg.artifact_root)
        location = root.resolve().as_uri() if "://" not in self.cfg.artifact_root else None
        return client.create_experiment(
            self.cfg.experiment,
            artifact_location=location or self.cfg.artifact_root,
            tags=EXPERIMENT_KIND,
        )

    # -- callback ----------------------------------------------------------------------
    def on_run_start(self, ctx: RunContext) -> None:
        if not self.enabled:
            return
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        try:
            from mlflow.entities import Param
            from mlflow.tracking import MlflowClient

            # after mlflow configured its loggers: hide schema-migration chatter on new stores
            for name in ("mlflow", "alembic"):
                logging.getLogger(name).setLevel(logging.WARNING)

            with store_lock(self.uri), _store_errors_unlogged():  # created once
                client = MlflowClient(tracking_uri=self.uri)
                resumed = ctx.resumed_mlflow_run_id
                if resumed and self._reopen(client, resumed):
                    ctx.mlflow_run_id = self.run_id
                    return
                exp_id = self.experiment_id(client)
            tags = {
                "raycobo.lifecycle.run_dir": str((self.run_dir or ctx.run_dir).resolve()),
                **mlflow_tags(ctx.provenance or provenance()),
                **self.tags,
            }
            if self.role is None:
                tags["raycobo.algorithm"] = ctx.cfg.algorithm.name
            else:
                tags["raycobo.kind"] = self.role.kind
            parent = self.parent.run_id if isinstance(self.parent, MLflowTracker) else self.parent
            parent = parent or ctx.parent_run_id
            if parent:
                tags["mlflow.parentRunId"] = parent
            run = client.create_run(exp_id, run_name=self.run_name or ctx.run_dir.name, tags=tags)
            self.client, self.run_id = client, run.info.run_id
            params = [Param(k, v) for k, v in self._params(ctx.cfg).items()]
            for a in range(0, len(params), _MAX_BATCH):
                client.log_batch(self.run_id, params=params[a : a + _MAX_BATCH])
            ctx.mlflow_run_id = self.run_id
        except Exception as err:  # noqa: BLE001
            self._disable(err)

    def _params(self, cfg) -> dict[str, str]:
        """A run's params: the method's settings as it runs them (CoBo's rule-decided keys
        filled in) and the rest of its config; a parent's: what it compares or searches
        and the settings its runs share (no one method's keys, no swept key)."""
        if self.role is not None:
            tree = {k: v for k, v in cfg.to_dict().items() if k != "algorithm"}
            shared = _as_params(read_params(cfg, tree, ("compare",)))
            for key in self.role.varied:
                shared.pop(key, None)
            return {**shared, **{k: str(v) for k, v in self.role.params.items()}}
        algo = cfg.algorithm
        own = algo.effective() if isinstance(algo, MethodConfig) else algo.model_dump()
        return _as_params(read_params(cfg, {**cfg.to_dict(), "algorithm": own}))

    def log_summary_metrics(self, metrics: dict[str, float | None]) -> None:
        """A parent's summary numbers (each entry's mean accuracy, the best trial's)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [
            Metric(k, in_percent(k, float(v)), now, 0) for k, v in metrics.items() if v is not None
        ]
        if batch:
            self._guard(self.client.log_batch, self.run_id, metrics=batch)

    def _reopen(self, client, run_id: str) -> bool:
        """A resumed run continues the MLflow run it started (metrics go on by round)."""
        try:
            client.get_run(run_id)
        except Exception:  # noqa: BLE001 - another store, or the run was deleted: a new one
            return False
        client.update_run(run_id, status="RUNNING")
        client.set_tag(run_id, "raycobo.resumed", "true")
        self.client, self.run_id = client, run_id
        return True

    def on_round_end(self, ctx: RunContext, round: int, stats: dict[str, float]) -> None:
        if not self.enabled:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._pending.extend(Metric(f"round/{k}", float(v), now, round) for k, v in stats.items())

    def on_eval(self, ctx: RunContext, round: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = self._pending
        self._pending = []
        for key in ("mean_accuracy", "mean_loss", "w_within", "w_across"):
            if metrics.get(key) is not None:
                batch.append(Metric(key, in_percent(key, float(metrics[key])), now, round))
        if self.cfg.client_series:  # asked for: otherwise the clients are a table at the end
            for c in metrics.get("clients", []):
                for key in ("accuracy", "loss"):
                    if c.get(key) is not None:
                        value = in_percent(key, float(c[key]))
                        batch.append(Metric(f"{key}/client_{c['id']:03d}", value, now, round))
        for a in range(0, len(batch), 1000):
            self._guard(self.client.log_batch, self.run_id, metrics=batch[a : a + 1000])

    def log_files(self, paths: list[Path], artifact_path: str | None = None) -> None:
        """Log extra files (tables, reports, plots) as artifacts of this run."""
        for path in paths:
            if Path(path).exists():
                self._guard(self.client.log_artifact, self.run_id, str(path), artifact_path)

    def on_run_end(self, ctx: RunContext, summary: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self._pending:
            self._guard(self.client.log_batch, self.run_id, metrics=self._pending)
            self._pending = []
        self.log_files(summary.get("files", []))  # a comparison's table, report and plots
        for name in (
            "summary.json",
            "config.yaml",
            "metrics.csv",
            "rounds.csv",
            "collaboration.npy",
        ):
            path = ctx.run_dir / name
            if path.exists():
                self._guard(self.client.log_artifact, self.run_id, str(path))
        if (ctx.run_dir / "plots").is_dir():
            self._guard(self.client.log_artifacts, self.run_id, str(ctx.run_dir / "plots"), "plots")
        if summary.get("data"):  # what the clients got (raycobo.data.report)
            self._guard(self.client.log_dict, self.run_id, summary["data"], "data_report.json")
        if summary.get("clients"):  # the last evaluation, one row a client
            table = clients_table(summary["clients"])
            self._guard(self.client.log_table, self.run_id, table, "clients.json")
        note = describe_run(ctx.cfg, summary) if self.role is None else None
        if note:
            self._guard(self.client.set_tag, self.run_id, "mlflow.note.content", note)
        if summary.get("status") == "stopped":  # a scheduler's decision: the run ended well
            for key in ("stopped_by", "last_round"):
                self._guard(self.client.set_tag, self.run_id, f"raycobo.{key}", summary[key])
        self._guard(self.client.set_terminated, self.run_id, mlflow_status(summary))


def clients_table(clients: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """A run's clients as MLflow's table: id, cluster, accuracy (%) and loss."""
    acc = [
        None if c.get("accuracy") is None else in_percent("accuracy", c["accuracy"])
        for c in clients
    ]
    return {
        "client": [c["id"] for c in clients],
        "cluster": [c.get("cluster") for c in clients],
        "accuracy (%)": acc,
        "loss": [c.get("loss") for c in clients],
    }


def describe_run(cfg, summary: dict[str, Any]) -> str | None:
    """The MLflow run's description: method, data and the headline figure."""
    if "n_clients" not in summary:
        return None
    what = f"{cfg.algorithm.name} on {cfg.data.name}, {summary['n_clients']} clients, "
    rounds = summary.get("last_round") or summary.get("rounds") or cfg.rounds
    what += f"{rounds} rounds ({summary.get('status')})"
    acc, loss = summary.get("mean_accuracy"), summary.get("mean_loss")
    if acc is not None:
        return f"{what}: mean accuracy {100 * acc:.2f} %"
    return f"{what}: mean loss {loss:.4g}" if loss is not None else what


def mlflow_status(summary: dict[str, Any]) -> str:
    """MLflow's end status for a raycobo summary status (a run a sweep's scheduler
    stopped early ended as it was asked to: FINISHED, with tags saying so)."""
    return {"completed": "FINISHED", "stopped": "FINISHED", "interrupted": "KILLED"}.get(
        summary.get("status", "failed"), "FAILED"
    )


UI_PORT = 5000


def runs_link(cfg: TrackingConfig) -> str | None:
    """The MLflow UI's page of the experiment's runs table (not its landing page), or
    None where the experiment cannot be read."""
    try:
        from mlflow.tracking import MlflowClient

        exp = MlflowClient(tracking_uri=resolve_uri(cfg.uri)).get_experiment_by_name(cfg.experiment)
    except Exception:  # noqa: BLE001 - a link is a convenience
        return None
    if exp is None:
        return None
    # MLflow 3 keeps a GenAI / model-training mode of its own (the experiment's kind tag
    # does not choose it): the link opens the model-training view, which then stays
    return (
        f"http://127.0.0.1:{UI_PORT}/#/experiments/{exp.experiment_id}/runs"
        "?workflowType=machine_learning"
    )


def ui_command(cfg: TrackingConfig) -> str:
    uri = resolve_uri(cfg.uri)
    return f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port {UI_PORT}"


class ScalingLogger:
    """Logs a scaling study to MLflow: one run, metrics with step = n, CSV and plot."""

    def __init__(self, cfg: TrackingConfig):
        self.cfg = cfg

    def log_scaling(self, rows: list[Any], out: Path) -> str | None:
        tracker = MLflowTracker(self.cfg, run_name="bench-scaling")
        from raycobo.config import Config

        tracker.on_run_start(RunContext(Config(name="bench-scaling"), out))
        if not tracker.enabled:
            return None
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(key, float(getattr(r, key)), now, int(r.n))
            for r in rows
            for key in (
                "ms_per_round",
                "rss_mib",
                "mib_per_client",
                "final_loss",
                "edges_per_round",
            )
        ]
        tracker._guard(tracker.client.log_batch, tracker.run_id, metrics=metrics)
        tracker.log_files([out / "bench_scaling.csv", out / "bench_scaling.png"])
        tracker._guard(tracker.client.set_terminated, tracker.run_id, "FINISHED")
        return tracker.run_id
