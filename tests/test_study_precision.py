"""A study that trains in bf16-autocast on a CPU: refused without native bf16, its report names the
precision and the CPU flags; the flags as ``/proc/cpuinfo`` lists them."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis import study
from analysis.study.precision import arm_precisions, check_native_bf16, precision_line
from harness.runtime.provenance import cpu_bf16_flags
from test_study import _spec, in_tmp, launched  # noqa: F401 (fixtures)


def _bf16(tmp_path, **extra) -> dict:
    return study.load_study(_spec(tmp_path, name="p", arms={"A": [], "B": ["train.precision=bf16-autocast"]},
                                  **extra))


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile\n\nprocessor\t: 1\n")
    assert cpu_bf16_flags(info) == ["avx512_bf16"]
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_bf16 avx512_bf16\n")
    assert cpu_bf16_flags(info) == ["avx512_bf16", "amx_bf16"]
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n")
    assert cpu_bf16_flags(info) == []
    assert cpu_bf16_flags(tmp_path / "absent") == []


def test_a_bf16_study_is_refused_on_a_cpu_without_native_bf16(in_tmp):
    spec = _bf16(in_tmp)
    assert arm_precisions(spec) == {"A": "fp32", "B": "bf16-autocast"}
    with pytest.raises(study.StudyError, match=r"\['B'\].*train.precision=bf16-autocast.*avx512_bf16 or amx_bf16"):
        check_native_bf16(spec, flags=[], error=study.StudyError)
    check_native_bf16(spec, flags=["amx_bf16"], error=study.StudyError)  # a CPU with one of them: runs
    fp32 = study.load_study(_spec(in_tmp, name="q"))
    check_native_bf16(fp32, flags=[], error=study.StudyError)  # fp32 everywhere: nothing asked of the CPU
    on_gpu = _bf16(in_tmp, base=["model=tiny", "model.device=cuda"])
    check_native_bf16(on_gpu, flags=[], error=study.StudyError)  # trains on a GPU


def test_run_missing_refuses_before_launching_anything(in_tmp, launched, monkeypatch):  # noqa: F811
    monkeypatch.setattr("analysis.study.precision.cpu_bf16_flags", lambda: [])
    spec = _bf16(in_tmp)
    with pytest.raises(study.StudyError, match="native bf16"):
        study.run_missing(spec, in_tmp / "results", log=lambda m: None)
    assert launched == []
    monkeypatch.setattr("analysis.study.precision.cpu_bf16_flags", lambda: ["avx512_bf16"])
    assert study.run_missing(spec, in_tmp / "results", log=lambda m: None) == {"A": [0, 1, 2], "B": [0, 1, 2]}
    assert len(launched) == 2


def test_the_report_line_names_each_arms_precision_and_the_recorded_flags(tmp_path):
    spec = _bf16(tmp_path)
    assert precision_line(spec, ["avx512_bf16"]) == ("precision (`train.precision`): `A` fp32, `B` bf16-autocast; "
                                                     "the runs' CPU bf16 flags (`machine.cpu_bf16`): avx512_bf16")
    assert precision_line(study.load_study(_spec(tmp_path, name="q")), ["avx512_bf16"]) is None
    assert "not recorded" in precision_line(spec, [])


def test_the_registered_precision_study_trains_its_bf16_arms_in_bf16():
    spec = study.load_study(Path(__file__).resolve().parents[1] / "studies" / "precision_bf16.yaml")
    precisions = arm_precisions(spec)
    assert precisions[spec["control"]] == "fp32"
    assert {precisions[a] for a in spec["comparisons"]} == {"bf16-autocast"}
    assert "avx512_bf16" in spec["claim"] and "amx_bf16" in spec["claim"]  # the registration names the flags
