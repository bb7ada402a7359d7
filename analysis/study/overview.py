"""The index of every study: ``results/STUDIES.md`` (a row per study, per comparison of a family) and
the README's shorter table, copied between its studies-table markers."""

from __future__ import annotations

import json
from pathlib import Path

from analysis import stats
from analysis.study.figures import family_figure
from analysis.study.spec import RESULTS, load_study, study_dir

README_MARKS = ("<!-- studies-table: copied from results/STUDIES.md -->", "<!-- /studies-table -->")


def index(root: Path = RESULTS, studies: Path = Path("studies")) -> Path:
    """``results/STUDIES.md``: one row per study file (its result.json when it ran); with ``root`` the
    committed ``results``, the README's table too (:func:`update_readme`)."""
    rows = ["# Studies", "",
            "Pre-registered studies (`studies/<name>.yaml`), each run and reported by "
            "`python -m analysis.study studies/<name>.yaml` (see `analysis/study/`); regenerate every report "
            "from the committed stores with `python -m analysis.study --no-run studies/*.yaml`.", "",
            "| study | claim | source | our setup | effect (CI) | verdict | power | report | regenerate |",
            "|---|---|---|---|---|---|---|---|---|"]
    short = ["| study | claim | budget | effect (CI) | verdict |", "|---|---|---|---|---|"]
    files = [(f, load_study(f)) for f in sorted(studies.glob("*.yaml"))]
    # a study named in another file's ``pilots`` was superseded by that file's second version: its
    # row stays here, the README keeps the current versions (it stays <= 150 lines)
    superseded = {p: study["name"] for _, study in files for p in study.get("pilots", [])}
    # the README's first row group: the studies with ``comparisons`` (the design card's grid), one row per arm
    families = [(f, s) for f, s in files if "comparisons" in s]
    not_run = []  # studies with no finished run: named in the README's note, rows here
    before_look = []  # (name, seeds run, seeds registered): runs but no completed first look; in the note too
    for f, study in families + [(f, s) for f, s in files if "comparisons" not in s]:
        res_path = study_dir(study, root) / "result.json"
        res = json.loads(res_path.read_text()) if res_path.exists() else None
        keep = short if study["name"] not in superseded else []
        finished = (res or {}).get("cost", {}).get("runs") if "comparisons" in study else (res or {}).get("runs_finished")
        if study["name"] not in superseded and not finished:
            not_run.append(study["name"])
            keep = []
        elif keep and not _looked(study, res):
            before_look.append((study["name"], _seeds_so_far(study, res), len(study["seeds"])))
            keep = []
        if "comparisons" in study:  # the family's own row first: its claim once, what was decided, its cost
            _family_row(study, res, f, rows, keep)
        for spec, sub_res, page in _index_entries(study, res):
            _index_rows(spec, sub_res, page, f, rows, keep)
    notes = _readme_notes(root, families, superseded, not_run, before_look)
    if notes:
        short += ["", " ".join(notes)]
    out = root / "STUDIES.md"
    out.write_text("\n".join(rows) + "\n")
    readme = Path("README.md")
    if root == RESULTS and readme.exists():
        update_readme(readme, short)
    return out


def _looked(study: dict, res: dict | None) -> bool:
    """Whether ``study`` (its result.json ``res``) completed its first look: any comparison's, for a
    family; a fixed design (no ``sequential``) has one look, when it has runs."""
    if not study.get("sequential"):
        return True
    if "comparisons" in study:
        return any(r.get("looks") for r in (res or {}).get("comparisons", {}).values())
    return bool((res or {}).get("looks"))


def _seeds_so_far(study: dict, res: dict | None) -> int:
    """The seeds with a finished run of every arm so far (a family: its most advanced comparison)."""
    if "comparisons" in study:
        return max((len(r.get("seeds_run", [])) for r in (res or {}).get("comparisons", {}).values()), default=0)
    return len((res or {}).get("seeds_run", []))


def _readme_notes(root: Path, families: list, superseded: dict, not_run: list[str],
                  before_look: list[tuple[str, int, int]]) -> list[str]:
    """The note under the README's table: each family's figure, the superseded pilots, the studies not
    run yet and those started but before their first look (their rows are in ``results/STUDIES.md``
    only, so that the README stays within its 150 lines)."""
    notes = []
    for _, study in families:
        figure = family_figure(study, root)
        if figure.exists():
            rel = figure.relative_to(root).as_posix()
            notes.append(f"`{study['name']}`, every arm vs step: [{rel}](results/{rel}).")
    if superseded:
        pilots = ", ".join(f"`{p}` ({v})" for p, v in sorted(superseded.items()))
        notes.append(f"Pilots superseded by a second version, with their rows in "
                     f"[results/STUDIES.md](results/STUDIES.md): {pilots}.")
    if not_run:
        notes.append("Registered, not run yet (rows in [results/STUDIES.md](results/STUDIES.md)): "
                     + ", ".join(f"`{n}`" for n in not_run) + ".")
    if before_look:
        notes.append("Started, before their first look (rows in [results/STUDIES.md](results/STUDIES.md)): "
                     + ", ".join(f"`{n}` ({k} of {m} seeds run)" for n, k, m in before_look) + ".")
    return notes


def _index_entries(spec: dict, res: dict | None) -> list[tuple[dict, dict | None, str]]:
    """``(spec, result or None, report page stem)`` per row: one for a two-arm study, one per
    comparison (its :func:`analysis.stats.sub_spec`) for a study with ``comparisons``; ``res``: the
    study's result.json."""
    if "comparisons" not in spec:
        return [(spec, res, spec["name"])]
    return [(stats.sub_spec(spec, a), (res or {}).get("comparisons", {}).get(a), f"{spec['name']}--{a}")
            for a in spec["comparisons"]]


def _family_row(spec: dict, res: dict | None, f: Path, rows: list[str], short: list[str]) -> None:
    """A family's header row in the full table ``rows`` and the README's ``short`` one: its claim once,
    "k of n comparisons decided" (naming the decided ones), the seeds its comparisons used and its cost
    (runs, run-hours: the sum of the seconds each run computed, :func:`analysis.study.store.run_seconds`);
    its comparisons' rows follow."""
    n, seq = len(spec["comparisons"]), spec.get("sequential")
    ran = {a: r for a, r in (res or {}).get("comparisons", {}).items() if r.get("runs_finished")}
    label = f"{spec['name']}: {n} comparisons with {spec['control']}"
    design = f"{seq['first']}-{seq['max_seeds']}, sequential" if seq else "fixed"
    if ran:
        decided = [f"{a} {r['verdict']}" for a, r in ran.items() if r["verdict"] != "inconclusive"]
        verdict = f"{len(decided)} of {n} comparisons decided" + (f": {', '.join(decided)}" if decided else "")
        # a comparison analysed before its first look completed has no look yet: its paired seeds so far
        used = sorted({r.get("seeds_used", len(r.get("seeds_run", []))) for r in ran.values()})
        cost = res.get("cost", {})
        seeds = f"{used[0]}-{used[-1]} seeds used ({design})" if len(used) > 1 else f"{used[0]} seeds used ({design})"
        cost_text = f"; {cost['runs']} runs, {cost['run_hours']:.1f} run-hours" if cost else ""
        measured = next((r["measured"] for r in ran.values() if r.get("measured")), "")
    else:
        verdict, seeds, cost_text, measured = f"not run ({spec.get('not_run', 'no finished run yet')})", \
            f"{len(spec['seeds'])} seeds ({design})", "", ""
    figure = (res or {}).get("figure")
    setup = spec.get("setup", "") + (f" (measured on {measured})" if measured else "")
    cells = [f"`{label}`", spec["claim"], spec["source"], setup, "-", verdict + cost_text, "-",
             f"[{figure}]({figure})" if figure else "-", f"`python -m analysis.study {f.as_posix()}`"]
    rows.append(_md_row(cells))
    link = f"[{label}](results/{figure})" if figure else f"`{label}`"
    budget = f"{seeds} x {spec['steps']} steps, {spec['eval_size']} eval problems{cost_text}"
    short.append(_md_row((link, spec["claim"], budget, "-", verdict)))


def _md_row(cells) -> str:
    """One markdown table row (``|`` inside a cell escaped)."""
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def _row_claim(spec: dict) -> str:
    """The claim of a row: the study's, or for one comparison of a family its own (the family's claim is in
    the family's row and the comparison's report)."""
    if "comparison_of" not in spec:
        return spec["claim"]
    test, scale = spec["test"], spec["metric"].get("scale", 1)
    return (f"{spec['treatment']} reaches {spec['control']}'s {spec['metric']['name']} within "
            f"{test['margin'] * scale:g} points" if test["kind"] == "equivalence"
            else f"{spec['treatment']} differs from {spec['control']} in {spec['metric']['name']}")


def _index_rows(spec: dict, res: dict | None, page: str, f: Path, rows: list[str], short: list[str]) -> None:
    """Append ``spec``'s row to the full table ``rows`` and the README's ``short`` table."""
    label = spec["name"] if page == spec["name"] else f"{spec['name']}: {spec['treatment']} - {spec['control']}"
    if res is not None:
        p = res["power"]
        cap = lambda k: str(p[k]) if p[k] < 10_000 else ">= 10,000"
        power = (f"{p['power']:.2f}; {p['seeds_needed']} seeds for 80% ({cap('seeds_needed_lo')} to "
                 f"{cap('seeds_needed_hi')} over the sd's 95% interval)" if p.get("power") is not None else "n/a")
        eff, ver = res["effect_text"], res["verdict_text"]
        setup = spec.get("setup", "") + (f" (measured on {res['measured']})" if res.get("measured") else "")
        report = f"[{page}.md](studies/{page}.md)"
    else:
        eff, ver, power, report = "n/a", f"not run ({spec.get('not_run', 'no finished run yet')})", "n/a", "-"
        setup = spec.get("setup", "")
    cells = [f"`{label}`", _row_claim(spec), spec["source"], setup, eff, ver, power, report,
             f"`python -m analysis.study {f.as_posix()}`"]
    rows.append(_md_row(cells))
    link = f"[{label}](results/studies/{page}.md)" if res is not None and res.get("runs_finished") else f"`{label}`"
    seeds = (f"{spec['sequential']['first']}-{spec['sequential']['max_seeds']} seeds (sequential)"
             if "sequential" in spec else f"{len(spec['seeds'])} seeds")
    if "sequential" in spec and res is not None and res.get("runs_finished") and "seeds_used" in res:
        seeds = f"{res['seeds_used']} seeds used ({spec['sequential']['first']}-{spec['sequential']['max_seeds']}, sequential)"
    budget = f"{seeds} x {spec['steps']} steps, {spec['eval_size']} eval problems"
    short.append(_md_row((link, _row_claim(spec), budget, eff, ver)))


def update_readme(readme: Path, rows: list[str]) -> bool:
    """Put ``rows`` (a short markdown table) between the README's studies-table markers; False when
    the markers are not there (the README is left as it is)."""
    text = readme.read_text()
    start, end = README_MARKS
    if start not in text or end not in text:
        return False
    head, rest = text.split(start, 1)
    readme.write_text(head + start + "\n" + "\n".join(rows) + "\n" + end + rest.split(end, 1)[1])
    return True
