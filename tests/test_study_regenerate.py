"""Every committed study report regenerates from the committed stores byte for byte: the reports,
result.json, the plots and results/STUDIES.md, as ``python -m analysis.study --no-run studies/*.yaml``
writes them in a fresh copy of the repository's studies and stores."""

from __future__ import annotations

import shutil
from pathlib import Path

from analysis import stats, study
from analysis.stats import boundaries

REPO = Path(__file__).resolve().parents[1]


def _outputs(root: Path) -> dict[str, bytes]:
    files = [root / "STUDIES.md", *(root / "studies").glob("*.md"), *(root / "studies" / "plots").glob("*.png"),
             *(root / "studies").glob("*/result.json"), *(root / "studies").glob("*/registration.json")]
    return {f.relative_to(root).as_posix(): f.read_bytes() for f in files}


def test_committed_reports_regenerate_without_a_diff(tmp_path, monkeypatch):
    shutil.copytree(REPO / "studies", tmp_path / "studies")
    for d in sorted((REPO / "results" / "studies").iterdir()):
        if (d / "mlflow.db").exists():  # the stores only: everything else is regenerated
            dst = tmp_path / "results" / "studies" / d.name
            dst.mkdir(parents=True)
            for name in ("mlflow.db", "registration.json"):
                shutil.copy2(d / name, dst / name)
            if (d / "mlartifacts").exists():
                shutil.copytree(d / "mlartifacts", dst / "mlartifacts")
    monkeypatch.chdir(tmp_path)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "studies").glob("*.yaml"))
    assert study.main(["--no-run", *files]) == 0
    committed, regenerated = _outputs(REPO / "results"), _outputs(tmp_path / "results")
    assert sorted(regenerated) == sorted(committed)
    differ = [name for name in committed if committed[name] != regenerated[name]]
    assert differ == [], f"regenerate and commit: python -m analysis.study --no-run studies/*.yaml ({differ})"


def test_every_sequential_study_reads_its_t_boundaries_from_the_committed_table():
    """A report's nominal levels come from analysis/stats/t_boundaries.json, so that regenerating it does not
    depend on numpy's normal stream (a design missing there is derived at report time)."""
    table = boundaries._t_table()["designs"]
    missing = [stats.design_key(*d) for f in sorted((REPO / "studies").glob("*.yaml"))
               for d in study.t_table_designs(study.load_study(f)) if stats.design_key(*d) not in table]
    assert missing == [], f"python -m analysis.study --t-table studies/*.yaml (missing: {missing})"
