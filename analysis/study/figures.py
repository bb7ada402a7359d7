"""A study's figures: the primary metric of every seed and the per-seed effects (one per report), the
secondary metrics' curves, and a family's arms on one figure. PNGs without a version string, so a
report regenerates byte for byte."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from analysis.plots import integer_steps  # noqa: E402
from analysis.study.spec import store_uri  # noqa: E402
from analysis.study.store import metric_history, secondary_curves  # noqa: E402


def plot(spec: dict, records: dict, result: dict, path: Path, client=None) -> Path:
    """Left: the primary metric vs step, every seed of every arm (thin), arm means (thick). Right:
    the per-seed paired effect, its mean and interval, and the margin or 0."""
    scale = spec["metric"].get("scale", 1)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    for arm in spec["arms"]:
        runs = records.get(arm, {})
        curves = {s: metric_history(spec, r, client) for s, r in sorted(runs.items())}
        color = None
        for s, h in curves.items():
            xs = sorted(h)
            line, = ax.plot(xs, [h[x] * scale for x in xs], lw=0.8, alpha=0.6, ls="--", color=color, marker=".")
            color = line.get_color()
        if curves:
            steps = sorted(set.intersection(*(set(h) for h in curves.values())))
            ax.plot(steps, [np.mean([h[x] for h in curves.values()]) * scale for x in steps], lw=2.2, color=color,
                    label=f"{arm} ({len(curves)} seeds)")
    if spec["metric"]["summary"] == "last_third":
        ax.axvspan(spec["steps"] - math.ceil(spec["steps"] / 3) + 0.5, spec["steps"] + 0.5, alpha=0.08, color="k")
    integer_steps(ax)
    ax.set(xlabel="training step", ylabel=f"{spec['metric']['name']} (x{scale})" if scale != 1 else spec["metric"]["name"],
           title="every seed (dashed), mean over seeds (solid)")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    _effects_panel(bx, spec, result, scale)
    fig.suptitle(f"{spec['name']}: {result['verdict']}", fontsize="medium")
    return _save(fig, path, dpi=110)


def _effects_panel(bx, spec: dict, result: dict, scale: float) -> None:
    """The per-seed paired effects, their mean and interval, 0 and the equivalence margin."""
    ps = [x * scale for x in result.get("per_seed", [])]
    bx.scatter(range(len(ps)), ps, color="k", zorder=3, label="per seed")
    for i, s in enumerate(result.get("seeds_run", [])):
        bx.annotate(f"s{s}", (i, ps[i]), textcoords="offset points", xytext=(5, 0), fontsize="x-small")
    if not math.isnan(result.get("effect", math.nan)):
        e, lo, hi = (result[k] * scale for k in ("effect", "lo", "hi"))
        bx.errorbar([len(ps)], [e], yerr=[[e - lo], [hi - e]], fmt="o", color="C3", capsize=4,
                    label=f"mean, {100 * result['level']:.3g}% paired t CI")
    bx.axhline(0, color="k", lw=0.8)
    if spec["test"]["kind"] == "equivalence":
        for m in (-1, 1):
            bx.axhline(m * spec["test"]["margin"] * scale, color="C2", ls=":", label="margin" if m > 0 else None)
    bx.set(title=f"{spec['treatment']} - {spec['control']}", xticks=[])
    bx.legend(fontsize="x-small")
    bx.grid(alpha=0.3)


def _save(fig, path: Path, dpi: int) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, metadata={"Software": None})  # no version string: regenerates byte for byte
    plt.close(fig)
    return path


def plot_secondary(spec: dict, records: dict, path: Path, client=None) -> Path | None:
    """One panel per ``secondary`` metric: its per-step mean over seeds, a line per arm; None when nothing
    was logged."""
    curves = secondary_curves(spec, records, client)
    if not curves:
        return None
    n = len(curves)
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.8 * rows), squeeze=False)
    for ax, (name, arms) in zip(axes.flat, curves.items()):
        for arm, c in arms.items():
            xs = sorted(c)
            ax.plot(xs, [c[x] for x in xs], marker=".", label=arm)
        ax.set_title(name, fontsize="small")
        ax.set_xlabel("step", fontsize="small")
        integer_steps(ax)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    axes.flat[0].legend(fontsize="x-small")
    fig.suptitle(f"{spec['name']}: secondary metrics, mean over seeds", fontsize="medium")
    return _save(fig, path, dpi=100)


def family_figure(spec: dict, root: Path) -> Path:
    """Where :func:`plot_family` writes the figure of a study with ``comparisons``:
    ``<root>/plots/<name>_arms.png`` (the README links it once it exists)."""
    return root / "plots" / f"{spec['name']}_arms.png"


def plot_family(spec: dict, records: dict, results: dict, path: Path, client=None) -> Path | None:
    """A study with ``comparisons`` on one figure: a panel per arm (the control first) with the primary
    metric vs step, every seed a thin line and the arm's mean a thick one, the control's mean dashed in
    every panel, and the comparison's verdict in the title; a second thin line style for ``train/accuracy``
    when the runs logged it (sampled, every step). None when no run finished."""
    if not any(records.values()):
        return None
    client = client or MlflowClient(store_uri(spec))
    scale = spec["metric"].get("scale", 1)
    arms = [spec["control"], *spec["comparisons"]]
    cols = min(4, len(arms))
    rows = math.ceil(len(arms) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 2.9 * rows), squeeze=False, sharey=True)

    def mean_curve(curves):
        steps = sorted(set.intersection(*(set(h) for h in curves))) if curves else []
        return steps, [np.mean([h[x] for h in curves]) * scale for x in steps]

    control = [metric_history(spec, r, client) for _, r in sorted(records.get(spec["control"], {}).items())]
    for i, (ax, arm) in enumerate(zip(axes.flat, arms)):
        color = f"C{i}"
        evals = [metric_history(spec, r, client) for _, r in sorted(records.get(arm, {}).items())]
        train = [{m.step: m.value for m in client.get_metric_history(r.run_id, "train/accuracy")}
                 for _, r in sorted(records.get(arm, {}).items())]
        for h in train:
            ax.plot(sorted(h), [h[x] * scale for x in sorted(h)], lw=0.5, alpha=0.35, color=color, ls=":")
        for h in evals:
            ax.plot(sorted(h), [h[x] * scale for x in sorted(h)], lw=0.7, alpha=0.6, color=color, marker=".")
        if evals:
            ax.plot(*mean_curve(evals), lw=2.2, color=color, label=f"{arm} ({len(evals)} seeds)")
        if arm != spec["control"] and control:
            ax.plot(*mean_curve(control), lw=1.2, color="k", ls="--", label=f"{spec['control']} mean")
        verdict = (results.get(arm) or {}).get("verdict") if arm != spec["control"] else "control"
        ax.set_title(f"{arm}: {verdict}" if evals else f"{arm}: not run", fontsize="small")
        ax.set_xlabel("training step", fontsize="small")
        integer_steps(ax)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="xx-small", loc="lower right")
    for ax in list(axes.flat)[len(arms):]:
        ax.axis("off")
    name = spec["metric"]["name"]
    axes[0][0].set_ylabel(f"{name} (x{scale})" if scale != 1 else name, fontsize="small")
    fig.suptitle(f"{spec['name']}: {name}, every seed (thin: greedy eval with dots, train/accuracy dotted), "
                 f"arm mean (thick)", fontsize="medium")
    return _save(fig, path, dpi=100)
