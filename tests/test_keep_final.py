"""What a finished run leaves on disk (``checkpoint.keep_final``), and what still works from it.

One tiny job per value (two steps, a checkpoint after each), then the files left in its
checkpoint folder and their sizes: ``full`` keeps the final checkpoint with the optimizer state,
``weights`` (the default) the finished marker and the final policy as safetensors, ``none`` the
marker alone; neither of the last two leaves an intermediate checkpoint. The same command again
is still reported, not trained (idempotent); training such a job longer is refused.
"""

from __future__ import annotations

import os

import pytest
import torch


def _files(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _state(path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def test_keep_final_leaves_what_it_says_and_a_marker_still_reports(run_dir, capsys):
    from mlflow.tracking import MlflowClient
    from safetensors.torch import load_file

    from harness.model.models import load_causal_lm
    from harness.launch.validate import ConfigError
    from tests.conftest import run_job

    runs, sizes = {}, {}
    for kept in ("full", "weights", "none"):
        ck = run_dir / kept
        every = 1 if kept == "weights" else 0  # weights: step 1's checkpoint is written, then removed at the end
        _, runs[kept], _ = run_job(f"checkpoint.dir={ck}", f"checkpoint.every={every}", "eval.every=0",
                                   f"checkpoint.keep_final={kept}")
        marker = ck / "step_000002.pt"
        sizes[kept] = marker.stat().st_size
        state = _state(marker)
        assert state["finished"] and state["step"] == 2 and state["keep_final"] == kept
        assert state["run_id"] == runs[kept].info.run_id and state["pending_metrics"] is not None
        if kept == "full":
            assert _files(ck) == [".lock", "run.json", "step_000002.pt"]
            assert state["optimizer"]["state"], "full keeps the optimizer state"
            full_policy = state["policy"]
        elif kept == "weights":
            assert _files(ck) == [".lock", "final", "run.json", "step_000002.pt"]  # step 1's checkpoint is gone
            assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(_files(ck / "final"))
            assert all(state.get(k) is None for k in ("policy", "optimizer", "ref", "critic"))
            saved = load_file(str(ck / "final" / "model.safetensors"))
            # the weights file holds the policy (tied lm_head stored once) and nothing else
            n_bytes = sum(t.numel() * t.element_size() for t in saved.values())
            weights_size = (ck / "final" / "model.safetensors").stat().st_size
            assert n_bytes <= weights_size < n_bytes + 64 * 1024
            # a model folder: loading it gives the trained policy, the same as the full checkpoint's
            model = load_causal_lm(str(ck / "final"))
            worst = max(float((model.state_dict()[k] - v).abs().max()) for k, v in full_policy.items())
            assert worst == 0.0, f"final weights differ from the full checkpoint's policy by {worst:.3g}"
        else:
            assert _files(ck) == [".lock", "run.json", "step_000002.pt"]
            assert all(state.get(k) is None for k in ("policy", "optimizer", "ref", "critic"))
    # the full checkpoint holds weights and AdamW's two moments: about 3x the weights file, the marker KBs
    assert sizes["full"] > 2.5 * weights_size, (sizes, weights_size)
    assert sizes["weights"] < 100_000 and sizes["none"] < 100_000, sizes

    # the same command again: the job is finished, reported, nothing trained (run and marker unchanged)
    ck = run_dir / "weights"
    stamp = (ck / "step_000002.pt").stat().st_mtime_ns
    capsys.readouterr()
    run_job(f"checkpoint.dir={ck}", "checkpoint.every=1", "eval.every=0")
    out = capsys.readouterr().out
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    assert len(client.search_runs([runs["weights"].info.experiment_id])) == 3  # no new run
    assert "this job is already finished" in out and "(checkpoint.keep_final=weights)" in out, out
    assert f"final weights : {ck / 'final'}" in out and "train longer : not from this folder" in out
    assert (ck / "step_000002.pt").stat().st_mtime_ns == stamp

    # training it longer needs the optimizer state the marker does not hold: refused, saying how
    for kept in ("weights", "none"):
        with pytest.raises(ConfigError) as err:
            run_job(f"checkpoint.dir={run_dir / kept}", "eval.every=0", "train.steps=3")
        msg = str(err.value)
        assert msg.startswith("train.steps=3 would train the finished job further from step 2")
        assert f"was kept with checkpoint.keep_final={kept} (no optimizer state" in msg
        assert "rerun the job with resume=never checkpoint.keep_final=full train.steps=3" in msg
        assert "start fresh in another checkpoint.dir" in msg
    assert _files(run_dir / "none") == [".lock", "run.json", "step_000002.pt"]  # the refusal changed nothing


def test_keep_final_takes_only_its_values():
    from harness.launch.validate import ConfigError, validate
    from tests.conftest import QUICK, compose

    with pytest.raises(ConfigError, match=r"checkpoint.keep_final='optimizer' is not valid; expected one of "
                                          r"\['full', 'merged', 'none', 'weights'\]"):
        validate(compose(*QUICK, "checkpoint.keep_final=optimizer"))
