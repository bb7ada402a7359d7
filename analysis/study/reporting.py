"""One study from its store to its outputs: the verdict (:mod:`analysis.study.verdicts`), the report
(:mod:`analysis.study.render`), ``result.json`` beside the store; for a study with ``comparisons``
one report per comparison and the family's figure."""

from __future__ import annotations

import json
from pathlib import Path

from mlflow.tracking import MlflowClient

from analysis import stats
from analysis.study.figures import family_figure, plot_family
from analysis.study.render import effect_text, verdict_text, write_report
from analysis.study.spec import RESULTS, store_uri, study_dir
from analysis.study.store import annotate, load_records, run_meta, this_machine
from analysis.study.verdicts import analyse, mark_reissued


def report(spec: dict, study_file: Path, root: Path = RESULTS, machine: str | None = None) -> dict:
    """Analyse the store and write the report, result.json and the index. A study with ``comparisons``
    writes one report per comparison (``<name>--<arm>.md``, :func:`analysis.stats.sub_spec`) and a
    result.json holding ``{"comparisons": {arm: result}}``."""
    if "comparisons" in spec:
        return _report_family(spec, study_file, root, machine)
    records, meta, client = _open(spec, root, machine)
    result = analyse(spec, records, client=client)
    mark_reissued(result, meta)
    suffix = "-gpu" if spec.get("variant") == "gpu" else ""
    _write(spec, result, records, root / "studies" / f"{spec['name']}{suffix}.md", study_file, meta, client)
    d = study_dir(spec, root)
    d.mkdir(parents=True, exist_ok=True)
    (d / "result.json").write_text(json.dumps(result, indent=1, sort_keys=True, default=float) + "\n")
    return result


def _open(spec: dict, root: Path, machine: str | None) -> tuple[dict, dict, MlflowClient | None]:
    """``(records, meta, client)`` of the study's store: the FINISHED runs, where (``machine``, else the
    one the runs recorded, else this one) and when they ran with their provenance, and a client (None
    for a study never run: opening the uri would create an empty store)."""
    records = load_records(spec, root)
    provenance, recorded = annotate(spec, records, root) if any(records.values()) else ([], None)
    client = MlflowClient(store_uri(spec, root)) if any(records.values()) else None
    meta = {**run_meta(records, machine or recorded or this_machine()), "provenance": provenance}
    return records, meta, client


def _write(spec: dict, result: dict, records: dict, path: Path, study_file: Path, meta: dict, client) -> None:
    """Write the report at ``path`` and add to ``result`` what the index shows: ``measured`` (machine,
    date), ``effect_text``, ``verdict_text``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_report(spec, result, records, path, study_file, meta, client)
    result["measured"] = f"{meta['machine']}, {meta['first'][:10]}" if result["runs_finished"] else ""
    result["effect_text"], result["verdict_text"] = effect_text(spec, result), verdict_text(spec, result)


def _report_family(spec: dict, study_file: Path, root: Path, machine: str | None) -> dict:
    records, meta, client = _open(spec, root, machine)
    out = {}
    for arm in spec["comparisons"]:
        sub = stats.sub_spec(spec, arm)
        result = analyse(sub, records, client=client)
        mark_reissued(result, meta, bootstrap_rule=False)
        _write(sub, result, records, root / "studies" / f"{spec['name']}--{arm}.md", study_file, meta, client)
        out[arm] = result
    d = study_dir(spec, root)
    d.mkdir(parents=True, exist_ok=True)
    runs = [r for arm_runs in records.values() for r in arm_runs.values()]
    family = {"comparisons": out, "correction": "bonferroni", "m": len(out),
              "cost": {"runs": len(runs), "run_hours": sum(r.params["_run_s"] for r in runs) / 3600} if runs else {}}
    figure = plot_family(spec, records, out, family_figure(spec, root), client)
    if figure is not None:
        family["figure"] = figure.relative_to(root).as_posix()
    (d / "result.json").write_text(json.dumps(family, indent=1, sort_keys=True, default=float) + "\n")
    return family
