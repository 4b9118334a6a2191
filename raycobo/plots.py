"""PNG plots of a run: accuracy/loss curves and collaboration-matrix heatmaps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def cluster_order(clusters: list[int | None]) -> np.ndarray:
    """Client order that groups ground-truth clusters (stable; unknown clusters last)."""
    keys = [(c is None, c if c is not None else 0, i) for i, c in enumerate(clusters)]
    return np.array([k[2] for k in sorted(keys)], dtype=int)


def _boundaries(clusters: list[int | None], order: np.ndarray) -> list[float]:
    lab = [clusters[i] for i in order]
    return [i - 0.5 for i in range(1, len(lab)) if lab[i] != lab[i - 1]]


PANEL_IN = 3.6  # inches a W panel takes (about 360 px: labels of 10 px at 1280 px)
TICK_PT, TITLE_PT = 10, 11


def below_cut(M: np.ndarray, cut: float | None) -> np.ndarray:
    """The learned weights the update leaves out: 0 < w_ij < cut (bool, NaN: False)."""
    if not cut:
        return np.zeros(M.shape, dtype=bool)
    with np.errstate(invalid="ignore"):
        return np.greater(M, 0) & np.less(M, cut)


def heatmap(
    ax, W: np.ndarray, clusters: list[int | None], title: str, cut: float | None = None
) -> Any:
    """``cut``: the least w_ij the method's update reads; the weights below it keep
    their colour on the one colour bar and are marked with a cross (hatching)."""
    known = any(c is not None for c in clusters) if clusters else False
    order = cluster_order(clusters) if known else np.arange(W.shape[0])
    M = W[np.ix_(order, order)].astype(float).copy()
    np.fill_diagonal(M, np.nan)  # the diagonal carries no information
    vmax = 1.0 if np.nanmax(M, initial=0) <= 1.0 else np.nanmax(M)
    im = ax.imshow(M, cmap="viridis", vmin=0.0, vmax=vmax, interpolation="nearest")
    n = W.shape[0]
    low = below_cut(M, cut)
    if low.any():
        ii, jj = np.nonzero(low)
        size = max(4.0, (PANEL_IN * 72 / n) ** 2 * 0.35)  # a cross inside its cell
        ax.scatter(jj, ii, marker="x", s=size, c="white", linewidths=0.8, alpha=0.9)
    for b in _boundaries(clusters, order) if known else []:
        ax.axhline(b, color="white", lw=0.8)
        ax.axvline(b, color="white", lw=0.8)
    ax.set_title(title, fontsize=TITLE_PT)
    # client ids (in cluster order) where they fit side by side; else every k-th
    every = max(1, -(-n // 8))
    ticks = list(range(0, n, every))
    ax.set_xticks(ticks, [str(order[i]) for i in ticks], fontsize=TICK_PT, rotation=90)
    ax.set_yticks(ticks, [str(order[i]) for i in ticks], fontsize=TICK_PT)
    ax.set_xlabel("client j", fontsize=TICK_PT)
    ax.set_ylabel("client i", fontsize=TICK_PT)
    return im


def heatmap_note(clustered: bool, cut: bool) -> str:
    """The note under a W figure, as the setting is (clusters known, a cut drawn)."""
    note = "Row i: client i's weights w_ij; "
    if clustered:
        note += "clients ordered by true cluster, white lines between clusters; "
    note += "the diagonal is blank (w_ii is not learned)"
    if cut:
        note += (
            "; where the method pulls only toward weights at or above a threshold (CoBo's "
            "pull_threshold, the red line on the colour bar), the weights below it are "
            "marked with a white cross: learned, but not pulled toward"
        )
    return note + "."


def _colorbar(fig, im, axes: list, cuts: set[float], shrink: float) -> None:
    bar = fig.colorbar(im, ax=axes, shrink=shrink)
    bar.set_label("w_ij", fontsize=TICK_PT)
    bar.ax.tick_params(labelsize=TICK_PT)
    for cut in sorted(cuts):
        bar.ax.axhline(cut, color="red", lw=1.5)


def plot_collaboration(
    path: Path,
    snapshots: dict[int, np.ndarray],
    clusters: list[int | None],
    label: str = "",
    cut: float | None = None,
) -> None:
    rounds = sorted(snapshots)
    side = PANEL_IN
    fig, axes = plt.subplots(1, len(rounds), figsize=(side * len(rounds), side), squeeze=False)
    im = None
    for ax, r in zip(axes[0], rounds, strict=True):
        im = heatmap(ax, snapshots[r], clusters, f"{label} round {r}".strip(), cut)
    _colorbar(fig, im, axes[0].tolist(), {cut} if cut else set(), 0.8)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def plot_curves(path: Path, histories: dict[str, list[dict[str, Any]]]) -> None:
    """Mean accuracy (when defined) and mean loss against rounds, one line per run."""
    plot_curves_band(path, {name: [h] for name, h in histories.items()})


def write_run_plots(
    run_dir: Path,
    summary: dict[str, Any],
    snapshots: dict[int, np.ndarray],
    clusters: list[int | None],
) -> list[Path]:
    plots = run_dir / "plots"
    plots.mkdir(exist_ok=True)
    written = []
    curves = plots / "curves.png"
    plot_curves(curves, {summary["algorithm"]: summary["history"]})
    written.append(curves)
    if snapshots:
        final, name = max(snapshots), summary["algorithm"]
        cut = summary.get("collaboration_cut")
        p = plots / "collaboration.png"
        plot_collaboration(p, {final: snapshots[final]}, clusters, name, cut)
        written.append(p)
        p = plots / "collaboration_rounds.png"
        plot_collaboration(p, snapshots, clusters, name, cut)
        written.append(p)
    return written


def plot_curves_band(
    path: Path, runs: dict[str, list[list[dict[str, Any]]]], only: str | None = None
) -> None:
    """Mean accuracy (when defined) and loss against rounds: mean over seeds, +- std band
    (``only``: one of the two, a panel of its own)."""
    first = next(iter(runs.values()))[0]
    has_acc = any(h.get("mean_accuracy") is not None for h in first)
    keys = ["mean_accuracy", "mean_loss"] if has_acc else ["mean_loss"]
    keys = [only] if only is not None else keys
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.6), squeeze=False)
    for name, histories in runs.items():
        rounds = [h["round"] for h in histories[0]]
        for ax, key in zip(axes[0], keys, strict=True):
            vals = np.array(
                [[np.nan if h.get(key) is None else h[key] for h in hs] for hs in histories],
                dtype=float,
            ) * (100.0 if key == "mean_accuracy" else 1.0)  # accuracy in %, as in the tables
            mean = np.nanmean(vals, axis=0)
            (line,) = ax.plot(rounds, mean, label=name)
            if len(histories) > 1:
                sd = np.nanstd(vals, axis=0)
                ax.fill_between(rounds, mean - sd, mean + sd, color=line.get_color(), alpha=0.2)
    for ax, key in zip(axes[0], keys, strict=True):
        ax.set_xlabel("round")
        ax.set_ylabel("mean accuracy (%)" if key == "mean_accuracy" else "mean loss")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        if key == "mean_loss" and not has_acc:
            ax.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_matrix_grid(
    path: Path,
    snaps: dict[str, dict[int, np.ndarray]],
    clusters: dict[str, list[int | None]] | list[int | None],
    cuts: dict[str, float | None] | None = None,
) -> None:
    """W of every method (rows) at several rounds (columns), as in CoBo's Figure 3.
    ``clusters``: the true clusters of each row's clients (entries of a comparison may
    have different numbers of clients), or one list for all. ``cuts``: each method's
    least weight its update reads (``heatmap``)."""
    cuts = cuts or {}
    names = list(snaps)
    ncols = max(len(v) for v in snaps.values())
    fig, axes = plt.subplots(
        len(names), ncols, figsize=(PANEL_IN * ncols, PANEL_IN * len(names)), squeeze=False
    )
    im = None
    for i, name in enumerate(names):
        rounds = sorted(snaps[name])
        for j in range(ncols):
            ax = axes[i][j]
            if j < len(rounds):
                own = clusters[name] if isinstance(clusters, dict) else clusters
                title = f"{name} round {rounds[j]}"
                im = heatmap(ax, snaps[name][rounds[j]], own, title, cuts.get(name))
                if j > 0:  # one axis title per row and column: no label runs into the next
                    ax.set_ylabel("")
                if i < len(names) - 1:
                    ax.set_xlabel("")
            else:
                ax.axis("off")
    if im is not None:
        drawn = {c for name, c in cuts.items() if c and name in snaps}
        _colorbar(fig, im, axes.ravel().tolist(), drawn, 0.6)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def plot_distribution(path: Path, values: dict[str, list[float]]) -> None:
    """Per-client final accuracy of each method (box plot with the points)."""
    names = list(values)
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(names)), 3.6))
    pct = {n: [100.0 * v for v in values[n]] for n in names}  # in %, as in the tables
    ax.boxplot([pct[n] for n in names], showfliers=False)
    for k, n in enumerate(names, start=1):
        xs = np.full(len(pct[n]), k) + np.linspace(-0.15, 0.15, len(pct[n]))
        ax.scatter(xs, pct[n], s=8, alpha=0.6)
    ax.set_xticks(range(1, len(names) + 1), names, rotation=30)
    ax.set_ylabel("client test accuracy (%)")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_label_mix(path: Path, counts: list[list[int]]) -> None:
    """Each client's training labels: the share of each class, one bar a client."""
    mix = np.asarray(counts, dtype=float)
    share = mix / np.maximum(mix.sum(axis=1, keepdims=True), 1.0)
    n, C = share.shape
    fig, ax = plt.subplots(figsize=(min(12, max(5, 0.25 * n + 2)), 3.2))
    cmap = plt.get_cmap("tab20" if C > 10 else "tab10")
    bottom = np.zeros(n)
    for c in range(C):
        ax.bar(np.arange(n), share[:, c], bottom=bottom, width=0.9, color=cmap(c % cmap.N))
        bottom += share[:, c]
    ax.set_xlabel("client")
    ax.set_ylabel("share of its training labels")
    ax.set_xlim(-0.5, n - 0.5)
    ax.set_ylim(0, 1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_scaling(path: Path, rows: list[dict[str, Any]]) -> None:
    """Round time, memory and final quality against the number of clients."""
    n = [r["n"] for r in rows]
    quality = (
        "final_accuracy" if rows and rows[0].get("final_accuracy") is not None else "final_loss"
    )
    panels = [("ms_per_round", "ms per round"), ("rss_mib", "memory (MiB)"), (quality, quality)]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, (key, label) in zip(axes, panels, strict=True):
        values = [r[key] for r in rows]
        ax.plot(n, values, marker="o")
        ax.set_xscale("log")
        if key != "final_accuracy" and all(v is not None and v > 0 for v in values):
            ax.set_yscale("log")
        ax.set_xlabel("clients n")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_communication(path: Path, points: dict[str, tuple[float, float]]) -> None:
    """Final accuracy against megabytes sent over the run (FedSep Figure 2)."""
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for name, (mb, acc) in points.items():
        ax.scatter([mb], [100.0 * acc], s=30)
        ax.annotate(name, (mb, 100.0 * acc), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("megabytes sent (both ways, whole run)")
    ax.set_ylabel("final mean test accuracy (%)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
