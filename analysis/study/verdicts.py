"""A study's verdict from its runs: the per-seed paired effects, the paired t rule at each look (the
sequential design's t boundaries, or the fixed design's level), the exact power, and the verdicts
the earlier rules gave (:data:`analysis.study.spec.RULE_CHANGES`). The statistics are
:mod:`analysis.stats`'."""

from __future__ import annotations

import math

import numpy as np

from analysis import stats
from analysis.study.spec import RULE_CHANGES, window_steps
from analysis.study.store import seed_values


def paired_effects(spec: dict, records: dict, client=None) -> tuple[np.ndarray, list[int], dict]:
    """``(d [seeds, units], seeds, per_arm)``: treatment minus control per paired seed over the units
    (problems, or window steps both runs of every seed logged); ``per_arm``: ``{arm: {seed: value}}``."""
    ctl, trt = records.get(spec["control"], {}), records.get(spec["treatment"], {})
    seeds = sorted(set(ctl) & set(trt))
    per_arm = {arm: {s: float(np.mean(seed_values(spec, r, client)[0])) for s, r in records.get(arm, {}).items()}
               for arm in spec["arms"]}
    if not seeds:
        return np.zeros((0, 0)), [], per_arm
    rows_c, rows_t = [], []
    for s in seeds:
        (vc, lc), (vt, lt) = seed_values(spec, ctl[s], client), seed_values(spec, trt[s], client)
        rows_c.append(dict(zip(lc, vc)))
        rows_t.append(dict(zip(lt, vt)))
    common = sorted(set.intersection(*(set(r) for r in rows_c + rows_t)))
    d = np.asarray([[t[u] - c[u] for u in common] for c, t in zip(rows_c, rows_t)], dtype=float)
    return d, seeds, per_arm


def verdict(test: dict, lo: float, hi: float, n_seeds: int) -> str:
    """The pre-registered rule (:func:`analysis.stats.decide`) applied to an interval of the effect;
    fewer than 2 seeds: inconclusive."""
    if n_seeds < 2:
        return "inconclusive"
    return stats.VERDICT_NAMES[int(stats.decide(test, lo, hi))]


def power_analysis(test: dict, sd: float, n: int) -> dict:
    """Exact power of the deciding test at the measured spread ``sd`` of the per-seed effects with
    ``n`` seeds (:mod:`analysis.stats.paired`): ``power``, ``seeds_needed`` for 80%, the chi-square 95%
    interval of the sd (``sd_lo``, ``sd_hi``) and the seeds needed at its ends; for a difference also
    the effect detected with 80% power (``mde``)."""
    out = {"sd": sd, "seeds": n}
    if n < 2 or not sd > 0 or math.isnan(sd):
        return out
    sd_lo, sd_hi = stats.sd_interval(sd, n)
    out.update(power=stats.deciding_power(test, sd, n), seeds_needed=stats.seeds_for_power(test, sd),
               sd_lo=sd_lo, sd_hi=sd_hi, seeds_needed_lo=stats.seeds_for_power(test, sd_lo),
               seeds_needed_hi=stats.seeds_for_power(test, sd_hi))
    if test["kind"] == "difference":
        out.update(delta=test["delta"], mde=stats.min_detectable(sd, n, test.get("alpha", 0.05)))
    else:
        out.update(margin=test["margin"])
    return out


def design_looks(spec: dict, n_run: int, z: bool = False) -> tuple[list[int], list[float]]:
    """``(looks, nominal two-sided alphas)``: the ``sequential`` looks and their boundary's levels (the
    t boundaries that decide; with ``z`` the z boundaries of :func:`analysis.stats.z_nominal_levels`,
    for the re-issue note), or one look at the ``n_run`` seeds run with the fixed design's ``1 - level``."""
    test = spec["test"]
    level = stats.interval_level(test["kind"], test.get("alpha", 0.05))
    if "sequential" not in spec:
        return [n_run], [1 - level]
    seq = spec["sequential"]
    looks = stats.look_sizes(seq["first"], seq["add"], seq["max_seeds"])
    levels = (stats.z_nominal_levels if z else stats.nominal_levels)(seq["boundary"], looks, 1 - level)
    return looks, [float(x) for x in levels]


def t_table_designs(spec: dict) -> list[tuple[str, tuple, float]]:
    """``(boundary, looks, total)`` of the sequential design a study's verdicts use (one per study:
    a family's comparisons share theirs), for :func:`analysis.stats.write_t_table`; [] for a fixed
    design or a Bonferroni boundary."""
    if "sequential" not in spec or spec["sequential"]["boundary"] == "bonferroni":
        return []
    sub = stats.sub_spec(spec, spec["comparisons"][0]) if "comparisons" in spec else spec
    seq, test = spec["sequential"], sub["test"]
    looks = tuple(stats.look_sizes(seq["first"], seq["add"], seq["max_seeds"]))
    return [(seq["boundary"], looks, 1 - stats.interval_level(test["kind"], test.get("alpha", 0.05)))]


def z_boundary_verdict(spec: dict, values: list[float]) -> dict | None:
    """The sequential rule over the per-seed effects ``values`` (registered order) at the z levels
    (:func:`design_looks` with ``z``): ``verdict``, ``seeds``, ``effect``, ``lo``, ``hi`` at its
    stopping look; None when no look was taken."""
    looks, levels = design_looks(spec, len(values), z=True)
    seq = stats.sequential(np.asarray([values], dtype=float), spec["test"], looks, levels)
    if not seq["code"].shape[1]:
        return None
    return {"verdict": stats.VERDICT_NAMES[int(seq["verdict"][0])], "seeds": int(seq["seeds_used"][0]),
            **{k: float(seq[f"{k}_final"][0]) for k in ("mean", "lo", "hi")}}


def analyse(spec: dict, records: dict, n_boot: int = 2000, seed: int = 0, client=None) -> dict:
    """Effect, interval, verdict, power and per-seed values of one study: the paired t rule over the
    per-seed effects (each seed's mean over the problems or window steps), at every look of a
    sequential design; the two-level bootstrap interval beside it (``bootstrap``: secondary, the rule
    before the paired t)."""
    test = spec["test"]
    d, seeds, per_arm = paired_effects(spec, records, client)
    # one comparison of a family (stats.sub_spec) owns its two arms' runs, not the family's
    counted = (spec["control"], spec["treatment"]) if "comparison_of" in spec else tuple(spec["arms"])
    out = {"name": spec["name"], "variant": spec.get("variant", "cpu"), "seeds_run": seeds,
           "seeds_registered": list(spec["seeds"]), "per_arm": per_arm,
           "level": stats.interval_level(test["kind"], test.get("alpha", 0.05)),
           "runs_finished": sum(len(records.get(a, {})) for a in counted),
           "runs_registered": len(spec["seeds"]) * len(counted), "window_steps": window_steps(spec)}
    if len(seeds) == 0 or d.size == 0:
        return {**out, "effect": math.nan, "lo": math.nan, "hi": math.nan, "verdict": "inconclusive",
                "per_seed": [], "power": {"seeds": 0}, "looks": []}
    per_seed = d.mean(axis=1)
    draws = stats.two_level_bootstrap(d, n_boot, np.random.default_rng(seed))
    q = (1 - out["level"]) / 2
    blo, bhi = (float(x) for x in np.quantile(draws, [q, 1 - q]))
    by_seed = dict(zip(seeds, per_seed))
    ordered = _registered_order(spec, by_seed)
    looks, levels = design_looks(spec, len(ordered))
    seq = stats.sequential(np.asarray([[by_seed[s] for s in ordered]]), test, looks, levels)
    taken, k = seq["code"].shape[1], int(seq["stop"][0])
    used = ordered[:looks[k]] if taken else ordered
    sd = float(np.std([by_seed[s] for s in used], ddof=1)) if len(used) > 1 else math.nan
    final = ({"effect": float(seq["mean_final"][0]), "lo": float(seq["lo_final"][0]), "hi": float(seq["hi_final"][0]),
              "level": 1 - levels[k], "verdict": stats.VERDICT_NAMES[int(seq["verdict"][0])]} if taken else
             {"effect": math.nan, "lo": math.nan, "hi": math.nan, "level": out["level"], "verdict": "inconclusive"})
    if "sequential" in spec and taken:  # a sequential study registers the runs up to the look it stopped at
        out["runs_registered"] = len(counted) * looks[k]
        out["z_boundaries"] = z_boundary_verdict(spec, [float(by_seed[s]) for s in ordered])
    return {**out, **final, "units": d.shape[1], "seeds_used": len(used),
            "looks": _look_rows(seq, looks, levels) if "sequential" in spec else [],
            "per_seed": [float(x) for x in per_seed],
            "bootstrap": {"lo": blo, "hi": bhi, "verdict": verdict(test, blo, bhi, len(seeds))},
            "power": power_analysis(test, sd, len(used))}


def _registered_order(spec: dict, by_seed: dict) -> list[int]:
    """The seeds of ``by_seed`` in the registered order the looks use; a sequential look needs its first
    n registered seeds, so a sequential study keeps the unbroken prefix of the registered seeds."""
    if "sequential" in spec:
        return spec["seeds"][:next((i for i, s in enumerate(spec["seeds"]) if s not in by_seed), len(spec["seeds"]))]
    return [s for s in spec["seeds"] if s in by_seed]


def _look_rows(seq: dict, looks: list[int], levels: list[float]) -> list[dict]:
    """One row per look taken up to the stopping one: seeds, nominal alpha, effect, interval, decision."""
    taken, k = seq["code"].shape[1], int(seq["stop"][0])
    return [{"seeds": looks[i], "alpha": levels[i], "effect": float(seq["mean"][0, i]),
             "lo": float(seq["lo"][0, i]), "hi": float(seq["hi"][0, i]),
             "decision": stats.VERDICT_NAMES[int(seq["code"][0, i])]} for i in range(min(taken, k + 1))]


def mark_reissued(result: dict, meta: dict, bootstrap_rule: bool = True) -> None:
    """The verdicts an earlier rule gave, for a study whose runs started (``meta["first"]``) before the
    rule changed (:data:`analysis.study.spec.RULE_CHANGES`), where they differ from ``result``'s:
    ``verdict_before_t``, the z boundaries' (:func:`z_boundary_verdict`); with ``bootstrap_rule`` (a
    two-arm study: the families came with the paired t) ``verdict_before``, the two-level bootstrap's."""
    boot = result.get("bootstrap", {}).get("verdict")
    if bootstrap_rule and boot and boot != result["verdict"] and meta["first"] < RULE_CHANGES["paired_t_rule"]["since"]:
        result["verdict_before"] = boot
    z = result.get("z_boundaries")
    if z and z["verdict"] != result["verdict"] and meta["first"] < RULE_CHANGES["t_boundaries"]["since"]:
        result["verdict_before_t"] = z
