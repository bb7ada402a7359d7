"""``python -m benchmarks.gpu_smoke --device cpu --tiny``: the GPU script's four parts run on the CPU
(issue 46), so that the script a GPU machine runs once has run here first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_smoke import MATHS, ReplayBackend, rel

ROOT = Path(__file__).resolve().parents[1]


def test_replay_refuses_a_call_that_differs_from_the_recording():
    rb = ReplayBackend([(["p0", "p1"], 4, "batch")])
    with pytest.raises(RuntimeError, match="replay call 0"):
        rb.generate(["p0", "other"], 4, None)
    assert rb.generate(["p0", "p1"], 4, None) == "batch"


def test_rel_is_the_largest_difference_over_the_largest_value():
    assert rel([1.0, -4.0], [1.0, -2.0]) == 2.0 / 2.0
    assert rel([0.0, 3.0], [1e-30, 3.0]) == pytest.approx(1e-30 / 3.0)  # a loss near 0 is not divided by itself
    assert rel([0.0], [0.0]) == 0.0


def test_cpu_tiny_run_passes_every_equality_case(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "-m", "benchmarks.gpu_smoke", "--device", "cpu", "--tiny", "--threads", "1",
                        "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads((tmp_path / "gpu_smoke.json").read_text())
    assert r["device_side"].startswith("cpu")  # said, not hidden: no CUDA ran
    f64 = [m for m in r["maths"] if m["dtype"] == "float64"]
    assert [m["run"] for m in f64] == list(MATHS)
    assert all(m["passed"] and m["nonzero_advantages"] for m in f64)
    # the five jobs are five different computations (a knob that did nothing would repeat a loss)
    assert len({tuple(m["loss_cpu"]) for m in f64}) == len(MATHS)
    assert len(r["maths"]) == 2 * len(MATHS) and all(len(m["loss_cpu"]) == 2 for m in r["maths"])
    none, fsdp2 = r["torchrun"]
    # one rank in a real process group (gloo here: no CUDA), the DDP-exact path and FSDP2 on a 1-rank mesh
    for row, sharded in ((none, False), (fsdp2, True)):
        assert row["passed"] and row["returncode"] == 0 and "refused" not in row
        assert (row["world_size"], row["process_group"], row["backend"], row["sharded"]) == (1, True, "gloo", sharded)
        assert row["loss_rel"] < 1e-9 and row["weights_rel"] < 1e-9
    assert r["equality_cases"] == {"passed": len(MATHS) + 2, "of": len(MATHS) + 2} and r["all_equal"]
    shapes = r["real_shapes"]
    assert shapes["full_length_frac"] == 1.0  # EOS suppressed: every completion runs to max_new_tokens
    assert shapes["update_tokens"] > 0 and shapes["matmul_tflops"] > 0
    assert (tmp_path / "gpu_smoke.log").read_text().count("maths ") == 2 * len(MATHS)
