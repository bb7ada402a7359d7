"""A study's report, ``results/studies/<name>.md``: the verdict and its wording, the effect and
interval, the design as registered, the per-seed table, the power paragraph, the secondary metrics,
the figures and the provenance. Text only: the numbers come from
:func:`analysis.study.verdicts.analyse`, the figures from :mod:`analysis.study.figures`."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from mlflow.tracking import MlflowClient

from analysis import stats
from analysis.study.figures import plot, plot_secondary
from analysis.study.spec import EVAL_SUMMARIES, RULE_CHANGES, store_uri
from analysis.study.store import secondary_curves
from analysis.study.verdicts import design_looks

BOUNDARY_TEXT = {
    "obrien_fleming": "Lan-DeMets alpha spending, O'Brien-Fleming type 2 - 2 Phi(z_{1-a/2} / sqrt(t))",
    "pocock": "Lan-DeMets alpha spending, Pocock type a ln(1 + (e - 1) t)",
    "bonferroni": "alpha / looks at every look"}


def _num(x: float, scale: float, signed: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x * scale:+.3g}" if signed else f"{x * scale:.3g}"


def effect_text(spec: dict, result: dict) -> str:
    """``effect [lo, hi]`` in the metric's display scale; "n/a" without an effect."""
    s = spec["metric"].get("scale", 1)
    if math.isnan(result.get("effect", math.nan)):
        return "n/a"
    return f"{_num(result['effect'], s, True)} [{_num(result['lo'], s, True)}, {_num(result['hi'], s, True)}]"


def test_text(spec: dict) -> str:
    """The registered test in words: kind, direction or margin, alpha (a family's Bonferroni split)."""
    t, s = spec["test"], spec["metric"].get("scale", 1)
    diff = f"{spec['treatment']} - {spec['control']}"
    fam = spec.get("comparison_of")  # one comparison of several against the control (analysis/stats/family.py)
    if fam:
        return _test_text(t, s, diff, f"{t['alpha']:.4g} (Bonferroni: family alpha {fam['alpha_family']} over "
                          f"{fam['m']} comparisons with {spec['control']})")
    return _test_text(t, s, diff, t.get("alpha", 0.05))


def _test_text(t: dict, s: float, diff: str, alpha_text) -> str:
    if t["kind"] == "difference":
        return (f"difference, predicted sign {'+' if t['sign'] > 0 else '-'}: {diff} {'> 0' if t['sign'] > 0 else '< 0'}; "
                f"alpha {alpha_text} (two-sided {100 * (1 - t.get('alpha', 0.05)):.4g}% interval); "
                f"power stated for a difference of {_num(t['delta'], s)}")
    return (f"equivalence: |{diff}| < {_num(t['margin'], s)} (TOST, {100 * (1 - 2 * t.get('alpha', 0.05)):.4g}% "
            f"interval inside the margin); alpha {alpha_text}")


def verdict_text(spec: dict, result: dict) -> str:
    """The verdict as the report and the index state it: what was decided, what the budget could
    decide, a design below the minimum, and the verdicts of the earlier rules where they differ."""
    if not result["runs_finished"]:
        return f"not run ({spec.get('not_run', 'no finished run in its store yet')})"
    v = result["verdict"]
    if result["runs_finished"] < result["runs_registered"]:
        v += (f" (only {result['runs_finished']} of {result['runs_registered']} registered runs finished: "
              f"analysed as they are)")
    if result["verdict"] == "inconclusive":
        v += _inconclusive_text(spec, result)
    below = [f"{len(result['seeds_run'])} seeds: below the {stats.MIN_SEEDS}-seed minimum"] \
        if 0 < len(result["seeds_run"]) < stats.MIN_SEEDS else []
    if result.get("window_steps") == 1:
        below.append("a 1-step window: below the 2-step minimum")
    if below:
        v += f" ({'; '.join(below)})"
    if result.get("verdict_before_t"):
        z, sc = result["verdict_before_t"], spec["metric"].get("scale", 1)
        v += (f"; re-issued under the t boundaries: the z boundaries used before {RULE_CHANGES['t_boundaries']['since']} "
              f"read \"{z['verdict']}\" at {z['seeds']} seeds, {_num(z['mean'], sc, True)} [{_num(z['lo'], sc, True)}, "
              f"{_num(z['hi'], sc, True)}]")
    if result.get("verdict_before"):
        v += (f"; re-issued under the paired-t rule: the two-level bootstrap rule used before "
              f"{RULE_CHANGES['paired_t_rule']['since']} read \"{result['verdict_before']}\"")
    return v


def _inconclusive_text(spec: dict, result: dict) -> str:
    """What an inconclusive verdict says about the budget: the next look, what the last look's interval
    excludes, or the seeds a conclusive answer needs at the measured spread."""
    p, sc = result["power"], spec["metric"].get("scale", 1)
    if result.get("looks") and result["looks"][-1]["seeds"] < spec["sequential"]["max_seeds"]:
        return (f" after the look at {result['looks'][-1]['seeds']} of up to {spec['sequential']['max_seeds']} seeds "
                f"(the next look adds {spec['sequential']['add']})")
    if result.get("looks"):  # max_seeds reached
        return (f" at max_seeds {spec['sequential']['max_seeds']}: the last look's interval excludes effects below "
                f"{_num(result['lo'], sc, True)} and above {_num(result['hi'], sc, True)}")
    if not p.get("seeds_needed"):
        return ""
    if p["seeds_needed"] > p["seeds"] or p.get("power", 0) < 0.8:
        return f" at this budget; a conclusive answer needs about {p['seeds_needed']} seeds per arm at the measured spread"
    size = _num(p.get("delta", p.get("margin")), sc)  # the seeds run were enough for the registered size
    return (f": the seeds run had {p['power']:.0%} power for the registered {size} at the measured spread, "
            f"and the effect is smaller than that; a smaller effect needs more seeds than {p['seeds_needed']}")


def _level_text(level: float) -> str:
    return f"{100 * level:.4g}%"


def _bootstrap_lines(spec: dict, result: dict) -> list[str]:
    b = result.get("bootstrap")
    if not b:
        return []
    s = spec["metric"].get("scale", 1)
    units = "problems" if spec["metric"]["summary"] in EVAL_SUMMARIES else "window steps"
    rule = RULE_CHANGES["paired_t_rule"]
    return [f"Secondary (not the verdict): the two-level bootstrap over seeds and {units} gives "
            f"[{_num(b['lo'], s, True)}, {_num(b['hi'], s, True)}]; the rule before {rule['since']} decided on it and "
            f"read **{b['verdict']}**. It treats the {units} as units beside the seeds and is miscalibrated at a few "
            f"seeds ({rule['evidence']}).", ""]


def _look_lines(spec: dict, result: dict) -> list[str]:
    """The sequential design's looks: seeds, nominal alpha, interval, decision."""
    if "sequential" not in spec:
        return []
    seq, sc = spec["sequential"], spec["metric"].get("scale", 1)
    looks, levels = design_looks(spec, 0)
    out = [f"Sequential design: first {seq['first']} seeds, then {seq['add']} more per look up to {seq['max_seeds']}; "
           f"boundary `{seq['boundary']}` ({BOUNDARY_TEXT[seq['boundary']]}). Each look's nominal alpha is the "
           f"two-sided level of the paired t interval at the look's t boundary (the boundary of the t statistic "
           f"with seeds - 1 df, simulated under the null: `analysis.stats.nominal_levels`).", "",
           "| look | seeds | nominal alpha (two-sided) | effect [interval] | decision |", "|---|---|---|---|---|"]
    done = {r["seeds"]: r for r in result.get("looks", [])}
    for i, (n, a) in enumerate(zip(looks, levels)):
        r = done.get(n)
        cells = ([f"{_num(r['effect'], sc, True)} [{_num(r['lo'], sc, True)}, {_num(r['hi'], sc, True)}]", r["decision"]]
                 if r else ["-", "not reached" if result.get("looks") and result["verdict"] != "inconclusive"
                            else "not run yet"])
        out.append(f"| {i + 1} | {n} | {a:.4g} | " + " | ".join(cells) + " |")
    return [*out, ""]


def power_lines(spec: dict, p: dict) -> list[str]:
    """The report's power paragraph: the deciding test's exact power at the measured spread, the seeds
    80% needs, and the same count at the ends of the spread's chi-square 95% interval."""
    s = spec["metric"].get("scale", 1)
    if p.get("power") is None:
        return ["Not computable: fewer than 2 paired seeds, or no spread between them."]
    need = lambda k: f"{p[k]}" if p[k] < 10_000 else ">= 10,000"
    lines = [f"Spread of the per-seed effects: sd {_num(p['sd'], s)} over {p['seeds']} seeds (it includes the "
             f"eval-problem or step noise that pairing does not cancel); its 95% interval (chi-square, "
             f"{p['seeds'] - 1} df) is [{_num(p['sd_lo'], s)}, {_num(p['sd_hi'], s)}]."]
    if spec["test"]["kind"] == "difference":
        lines.append(f"At this spread the two-sided paired t-test with {p['seeds']} seeds has power {p['power']:.2f} "
                     f"(noncentral t) for a difference of {_num(p['delta'], s)}, detects {_num(p['mde'], s)} with 80% "
                     f"power (exact), and needs **{need('seeds_needed')} seeds** per arm for 80% power at "
                     f"{_num(p['delta'], s)}; at the ends of the sd's interval, {need('seeds_needed_lo')} to "
                     f"{need('seeds_needed_hi')} seeds.")
    else:
        lines.append(f"At this spread TOST with {p['seeds']} seeds has power {p['power']:.2f} (exact: integrated "
                     f"over the sample sd) to show equivalence within {_num(p['margin'], s)} when the true "
                     f"difference is 0; 80% power needs **{need('seeds_needed')} seeds** per arm; at the ends of the "
                     f"sd's interval, {need('seeds_needed_lo')} to {need('seeds_needed_hi')} seeds.")
    return lines


def _window_text(spec: dict) -> str:
    m = spec["metric"]
    if m["summary"] == "last_third":
        first = spec["steps"] - math.ceil(spec["steps"] / 3) + 1
        return f"mean of `{m['name']}` over steps {first}-{spec['steps']} (the last third)"
    return {"final": "greedy eval accuracy at the last step", "auc": "area under the greedy eval accuracy curve"}[
        m["summary"]] + f" on {spec['eval_size']} problems"


def write_report(spec: dict, result: dict, records: dict, path: Path, study_file: Path, meta: dict,
                 client=None) -> Path:
    """``results/studies/<name>.md`` (``path``) and its figures under ``plots/`` beside it; ``meta``:
    the machine, the runs' first and last start, provenance lines."""
    plots = _figures(spec, result, records, path, client)
    lines = [*_verdict_lines(spec, result, records, client), *_bootstrap_lines(spec, result),
             *_look_lines(spec, result), *_design_lines(spec, study_file), *_per_seed_lines(spec, result),
             "", "## Power (of the deciding test, exact)", "", *power_lines(spec, result["power"])]
    if spec.get("notes"):
        lines += ["", "## Notes written after the runs (not part of the registration)", "", spec["notes"].strip()]
    lines += _secondary_lines(spec, records, client, path.stem)
    lines += ["", "## Plot", "", *plots, "", "## Provenance", "",
              f"- machine: {meta['machine']}; runs started between {meta['first']} and {meta['last']} (UTC)",
              *[f"- {x}" for x in meta.get("provenance", [])], ""]
    path.write_text("\n".join(lines))
    return path


def _figures(spec: dict, result: dict, records: dict, path: Path, client=None) -> list[str]:
    """Draw the report's figures (none before a run finished); their markdown image lines."""
    if not result["runs_finished"]:
        return []
    png = plot(spec, records, result, path.parent / "plots" / f"{path.stem}.png", client)
    out = [f"![{spec['name']}](plots/{png.name})"]
    sec = plot_secondary(spec, records, path.parent / "plots" / f"{path.stem}_secondary.png", client)
    if sec is not None:
        out.append(f"![{spec['name']} secondary metrics](plots/{sec.name})")
    return out


def _verdict_lines(spec: dict, result: dict, records: dict, client=None) -> list[str]:
    """The title, claim, source, verdict, the effect with its interval, and the ``per_step`` table."""
    s = spec["metric"].get("scale", 1)
    used = result.get("seeds_used", len(result["seeds_run"]))
    units = "eval problems" if spec["metric"]["summary"] in EVAL_SUMMARIES else "window steps"
    return [f"# Study `{spec['name']}`{' (GPU arm set)' if spec.get('variant') == 'gpu' else ''}", "",
            f"**Claim.** {spec['claim']}", "", f"**Source.** {spec['source']}", "",
            f"**Verdict: {verdict_text(spec, result)}.**", "",
            f"Effect ({spec['treatment']} - {spec['control']}, {_window_text(spec)}; x{s}): "
            f"**{effect_text(spec, result)}** ({_level_text(result['level'])} paired t interval over "
            f"{used} per-seed effects, {max(0, used - 1)} df; each seed's effect is its mean over "
            f"the {units}), {len(result['seeds_run'])} paired seeds.", *_per_step_lines(spec, records, client), ""]


def _design_lines(spec: dict, study_file: Path) -> list[str]:
    """How to regenerate the report, and the design as registered (with why, written before the runs)."""
    lines = ["Regenerate this report (from the committed store; runs only what is missing):", "", "```bash",
             f"python -m analysis.study {'--gpu ' if spec.get('variant') == 'gpu' else ''}{study_file.as_posix()}",
             "```", "", "## Pre-registered design", "",
             f"- test: {test_text(spec)}", f"- metric: {_window_text(spec)}",
             f"- seeds {list(spec['seeds'])}, {spec['steps']} steps, eval set: first {spec['eval_size']} problems",
             f"- base overrides: `{' '.join(spec['base'])}`"]
    lines += [f"- arm `{a}`: `{' '.join(o) or '(base only)'}`" for a, o in spec["arms"].items()]
    return lines + ["", "Why this design (written before the study ran):", "", spec.get("design", "").strip()]


def _per_seed_lines(spec: dict, result: dict) -> list[str]:
    """Each arm's value and the paired effect, per registered seed ("not run" / "-" where missing)."""
    s = spec["metric"].get("scale", 1)
    lines = ["", "## Per seed", "", f"| arm | {' | '.join(f's{x}' for x in spec['seeds'])} |",
             "|---|" + "---|" * len(spec["seeds"])]
    for arm in spec["arms"]:
        vals = result["per_arm"].get(arm, {})
        lines.append(f"| {arm} | " + " | ".join(_num(vals[x], s) if x in vals else "not run" for x in spec["seeds"])
                     + " |")
    eff = dict(zip(result["seeds_run"], result["per_seed"]))
    lines.append("| effect | " + " | ".join(_num(eff[x], s, True) if x in eff else "-" for x in spec["seeds"]) + " |")
    return lines


def _per_step_lines(spec: dict, records: dict, client=None) -> list[str]:
    """The study file's ``per_step`` metrics (not tested) as a table per step, shown under the verdict."""
    if not spec.get("per_step") or not any(records.values()):
        return []
    return secondary_curve_lines(spec, records, client, key="per_step", title="Shown beside the verdict (`per_step`, "
                                 "not tested): per step, mean over each arm's seeds.")


def _secondary_lines(spec: dict, records: dict, client=None, stem: str | None = None) -> list[str]:
    """``secondary`` metrics of the study file (not part of the test): per arm, the mean over seeds
    of each run's mean over its logged steps, per seed in brackets; ``stem``: the report file's stem,
    which names its per-step plot (default: the study's name)."""
    names = spec.get("secondary") or []
    if not names or not any(records.values()):
        return []
    client = client or MlflowClient(store_uri(spec))
    out = ["", "## Secondary metrics (not tested)", "", "Mean over all logged steps of each run; per seed in brackets.",
           "", "| metric | " + " | ".join(spec["arms"]) + " |", "|---|" + "---|" * len(spec["arms"])]
    for name in names:
        cells = []
        for arm in spec["arms"]:
            per = {s: np.mean([m.value for m in client.get_metric_history(r.run_id, name)] or [math.nan])
                   for s, r in sorted(records.get(arm, {}).items())}
            cells.append(f"{np.mean(list(per.values())):.4g} [" + ", ".join(f"{v:.4g}" for v in per.values()) + "]"
                         if per else "n/a")
        out.append(f"| `{name}` | " + " | ".join(cells) + " |")
    out += secondary_curve_lines(spec, records, client, stem=stem)
    return out


def secondary_curve_lines(spec: dict, records: dict, client=None, max_columns: int = 10, key: str = "secondary",
                          title: str | None = None, stem: str | None = None) -> list[str]:
    """A markdown table of :func:`analysis.study.store.secondary_curves` of the ``key`` metrics: a row per
    (metric, arm), a column per logged step (at most ``max_columns``, evenly spaced, always the first and
    last), under ``title`` (default: the secondary metrics' line naming their plot, ``plots/<stem>_secondary.png``,
    ``stem`` the report file's stem, default the study's name)."""
    curves = secondary_curves(spec, records, client, key)
    steps = sorted({x for arms in curves.values() for c in arms.values() for x in c})
    if not steps:
        return []
    if len(steps) > max_columns:
        idx = np.unique(np.linspace(0, len(steps) - 1, max_columns).round().astype(int))
        steps = [steps[i] for i in idx]
    title = title or f"Per step, mean over seeds (plot: `plots/{stem or spec['name']}_secondary.png`):"
    out = ["", title, "",
           "| metric | arm | " + " | ".join(f"step {x}" for x in steps) + " |", "|---|---|" + "---|" * len(steps)]
    for name, arms in curves.items():
        for arm, c in arms.items():
            out.append(f"| `{name}` | {arm} | " + " | ".join(f"{c[x]:.4g}" if x in c else "" for x in steps) + " |")
    return out
