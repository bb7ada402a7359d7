"""Provenance in the MLflow record, re-running a run from it, and the record's readability."""

from __future__ import annotations

import hashlib
import logging

import pytest
import torch

from harness.train.trainer import TIMED_METRICS
from tests.conftest import QUICK, run_job

NOT_REPRODUCIBLE = TIMED_METRICS


def _histories(client, run_id) -> dict:
    run = client.get_run(run_id)
    return {k: [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, k), key=lambda m: m.step)]
            for k in run.data.metrics if not k.startswith(NOT_REPRODUCIBLE)}


def test_run_records_provenance_standard_tags_datasets_and_a_readable_name(run_dir, dense_rewards):
    from mlflow.tracking import MlflowClient

    from harness.runtime import provenance

    _, run, _ = run_job("seed=3")
    p, tags = run.data.params, run.data.tags
    for pkg in ("python", "torch", "transformers", "vllm", "mlflow", "hydra-core", "optuna", "datasets",
                "math-verify"):
        assert p[f"provenance.version.{pkg}"], pkg
    assert p["provenance.version.torch"] == torch.__version__
    assert p["provenance.machine.cpu"] and int(p["provenance.machine.cores"]) >= 1
    assert p["provenance.machine.cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert p["provenance.machine.gpu"] == ("none" if not torch.cuda.is_available() else torch.cuda.get_device_name(0))
    assert len(p["provenance.git.commit"]) == 40 and p["provenance.git.dirty"] in ("true", "false")
    assert tags["mlflow.source.git.commit"] == p["provenance.git.commit"]
    assert tags["mlflow.source.name"] == "harness.run" and tags["mlflow.note.content"]
    # the data: the problems actually used, hashed; arith is generated
    from tests.conftest import compose
    from harness.tasks import build_task

    task = build_task(compose(*QUICK, "seed=3").task)
    assert p["provenance.data.eval.problems_sha256"] == provenance.problems_sha256(task.eval)
    assert p["provenance.data.test.source"].startswith("generated:arith")
    # the weights actually loaded (tiny random init, seed 3): hash of the initial state dict
    assert p["provenance.model.source_sha256"] == "random-init"
    assert len(p["provenance.model.weights_sha256"]) == 64
    # named from its defining choices, a model-training experiment, the data as dataset inputs
    assert run.info.run_name == "grpo-G4-arith-s3"
    client = MlflowClient()
    exp = client.get_experiment(run.info.experiment_id)
    assert exp.tags.get("mlflow.experimentKind") == "custom_model_development"
    inputs = {d.dataset.name: d for d in run.inputs.dataset_inputs}
    assert set(inputs) == {"arith-train", "arith-test"}
    assert inputs["arith-test"].dataset.digest == p["provenance.data.eval.problems_sha256"][:36]
    assert {t.key: t.value for t in inputs["arith-test"].tags}["mlflow.data.context"] == "eval"
    assert "perf/peak_mem_gib" in run.data.metrics and 0.01 < run.data.metrics["perf/peak_mem_gib"] < 64
    # per-problem greedy verdicts of each eval, for intervals over problems
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        rec = json.load(open(client.download_artifacts(run.info.run_id, "eval/correct_step_000002.json", tmp)))
    final = [v for s, v in client.get_metric_history(run.info.run_id, "eval/accuracy") and
             [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "eval/accuracy")] if s == 2]
    assert len(rec["correct"]) == len(rec["problem_ids"]) == 4 and rec["step"] == 2
    assert sum(rec["correct"]) / 4 == pytest.approx(final[0])


def test_data_file_hash_is_the_file_sha256(tmp_path):
    from harness.tasks.gsm8k import GSM8KTask, GSM8KTaskConfig

    row = '{"question": "1+1?", "answer": "1+1=2\\n#### 2"}\n'
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text(row * 3)
    task = GSM8KTask(GSM8KTaskConfig(data_dir=str(tmp_path), eval_size=None))  # None: all 3 test problems
    assert task.sources["test"] == {"source": str(tmp_path / "test.jsonl"),
                                    "sha256": hashlib.sha256((row * 3).encode()).hexdigest()}


def test_cpu_fields_come_from_the_first_processor_of_cpuinfo(tmp_path, monkeypatch):
    from harness.runtime import provenance

    # two processors as Linux lists them; a VM that names its Zen 4 only "AMD EPYC"
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
                    "model name\t: AMD EPYC\nflags\t\t: fpu avx512f\n\n"
                    "processor\t: 1\ncpu family\t: 6\nmodel\t\t: 143\nmodel name\t: other\n")
    assert provenance._cpuinfo(info) == {"processor": "0", "vendor_id": "AuthenticAMD", "cpu family": "25",
                                         "model": "17", "model name": "AMD EPYC", "flags": "fpu avx512f"}
    assert provenance._cpuinfo(tmp_path / "absent") == {}
    read = provenance._cpuinfo
    monkeypatch.setattr(provenance, "_cpuinfo", lambda: read(info))
    assert provenance.cpu_model() == "AMD EPYC" and provenance.cpu_family_model() == "25/17"
    cap = torch.backends.cpu.get_cpu_capability()
    assert provenance.cpu_label() == f"AMD EPYC (family/model 25/17, {cap})"
    m = provenance.machine()
    assert (m["cpu"], m["cpu_family_model"], m["cpu_capability"], m["cpu_bf16"]) == ("AMD EPYC", "25/17", cap, "none")
    monkeypatch.setattr(provenance, "_cpuinfo", lambda: read(tmp_path / "absent"))  # macOS, Windows
    assert provenance.cpu_family_model() == "unknown" and provenance.cpu_model()


def test_weights_hash_sees_a_one_ulp_change(tokenizer):
    from harness.runtime import provenance
    from tests.conftest import tiny_llama

    m = tiny_llama(tokenizer)
    h0 = provenance.state_dict_sha256(m)
    assert provenance.state_dict_sha256(tiny_llama(tokenizer)) == h0
    with torch.no_grad():
        w = m.model.norm.weight
        w[0] = torch.nextafter(w[0], torch.tensor(2.0))
    assert provenance.state_dict_sha256(m) != h0


def test_rerun_from_the_record_repeats_the_metric_history(run_dir, dense_rewards):
    from mlflow.tracking import MlflowClient

    from harness.launch.rerun import rerun

    _, run, _ = run_job("seed=1", "train.steps=3", "advantage=rloo", "beta=0.05")
    rerun(run.info.run_id)
    client = MlflowClient()
    runs = client.search_runs([run.info.experiment_id], order_by=["attributes.start_time ASC"])
    assert len(runs) == 2
    new = runs[1]
    assert new.data.tags["rerun_of"] == run.info.run_id and new.info.run_name == f"{run.info.run_name}-rerun"
    assert not [k for k in new.data.tags if k.startswith("rerun.differs.")]
    a, b = _histories(client, run.info.run_id), _histories(client, new.info.run_id)
    assert a == b
    assert len({v for _, v in a["train/loss"]}) > 1 and len(a["train/loss"]) == 3  # a real, varying history
    assert new.data.params["advantage.name"] == "rloo" and new.data.params["beta"] == "0.05"


def test_rerun_with_an_override_and_a_changed_environment_warns(run_dir, dense_rewards, monkeypatch, caplog):
    from mlflow.tracking import MlflowClient

    from harness.runtime import provenance
    from harness.launch.rerun import rerun

    _, run, _ = run_job("train.steps=1")
    real = provenance.versions
    monkeypatch.setattr(provenance, "versions", lambda: {**real(), "torch": "9.9.9"})
    with caplog.at_level(logging.WARNING, logger="harness"):
        rerun(run.info.run_id, ["seed=5"])
    assert any("version.torch: recorded" in r.getMessage() and "'9.9.9'" in r.getMessage() for r in caplog.records)
    client = MlflowClient()
    new = [r for r in client.search_runs([run.info.experiment_id]) if r.info.run_id != run.info.run_id][0]
    assert new.data.params["seed"] == "5" and "version.torch" in " ".join(new.data.tags)
    assert new.data.tags["rerun.differs.version.torch"].endswith("'9.9.9'")
    # a different seed initialises the tiny model differently: the weights digest says so too
    assert "rerun.differs.model.weights_sha256" in new.data.tags


def test_rerun_of_a_lora_run_repeats_it_and_records_the_adapter(run_dir, dense_rewards):
    """A lora=peft run's record holds the adapter config and the base weights' digest; its rerun
    (config from the record) repeats the metric history with no provenance difference."""
    from mlflow.tracking import MlflowClient

    from harness.launch.rerun import rerun

    _, run, _ = run_job("lora=peft", "lora.r=2", "lora.target_modules=[q_proj,v_proj]", "beta=0.05", "train.lr=1e-2")
    full = run_job("beta=0.05")[1]
    params = run.data.params
    assert params["lora.name"] == "peft" and params["lora.r"] == "2"
    assert '"target_modules": ["q_proj", "v_proj"]' in params["provenance.model.adapter"]
    assert params["provenance.model.weights_sha256"] == full.data.params["provenance.model.weights_sha256"]
    rerun(run.info.run_id)
    client = MlflowClient()
    new = [r for r in client.search_runs([run.info.experiment_id]) if r.data.tags.get("rerun_of") == run.info.run_id][0]
    assert not [k for k in new.data.tags if k.startswith("rerun.differs.")]
    assert new.data.params["provenance.model.adapter"] == params["provenance.model.adapter"]
    a, b = _histories(client, run.info.run_id), _histories(client, new.info.run_id)
    assert a == b and a["perf/trainable_param_frac"][0][1] < 0.1


def test_rerun_of_a_record_from_before_lora_existed_is_full_fine_tuning():
    from omegaconf import OmegaConf

    from harness.launch.rerun import rebuild_config
    from tests.conftest import compose

    resolved = OmegaConf.to_container(compose(*QUICK), resolve=True)
    resolved.pop("lora")
    assert rebuild_config(resolved, []).lora.name == "none"
    assert rebuild_config(resolved, ["lora=peft"]).lora.r == 8


def test_rerun_of_a_record_from_before_the_reward_group_scores_with_the_verifier():
    """A group with no "none" option takes its default, the behaviour before it existed."""
    from omegaconf import OmegaConf

    from harness.launch.rerun import rebuild_config
    from tests.conftest import compose

    resolved = OmegaConf.to_container(compose(*QUICK), resolve=True)
    resolved.pop("reward")
    assert rebuild_config(resolved, []).reward.name == "verifier"
    assert rebuild_config(resolved, ["reward=random"]).reward.p == 0.5


def test_rerun_errors_name_the_input(run_dir):
    from harness.launch.rerun import main

    assert main(["0123456789abcdef"]) == 2


def test_rerun_rejects_an_unknown_override(run_dir, dense_rewards):
    from harness.launch.rerun import RerunError, rerun

    _, run, _ = run_job("train.steps=1")
    with pytest.raises(RerunError, match="no_such_key"):
        rerun(run.info.run_id, ["train.no_such_key=1"])
    with pytest.raises(RerunError, match="advantage must be one of"):
        rerun(run.info.run_id, ["advantage=nope"])


def test_report_lists_provenance_differences():
    import pandas as pd

    from analysis.report import provenance_differences

    runs = pd.DataFrame({"params.provenance.version.torch": ["2.13.0", "2.13.0", "2.14.0"],
                         "params.provenance.git.commit": ["abc"] * 3,
                         "params.provenance.machine.hostname": ["a", "b", "c"]})
    diff = provenance_differences(runs)
    assert list(diff["key"]) == ["version.torch"]
    assert diff["values"].iloc[0] == "2.13.0: 2; 2.14.0: 1"


def test_system_metrics_are_sampled_when_asked(run_dir, dense_rewards):
    _, run, _ = run_job("tracking.system_metrics=true", "tracking.system_metrics_interval_s=0.2", "train.steps=2")
    assert any(k.startswith("system/") for k in run.data.metrics), sorted(run.data.metrics)


def test_rerun_from_a_moved_store_into_another(run_dir, dense_rewards, monkeypatch):
    """A sqlite store copied elsewhere with its mlartifacts/ folder (results/ablation in a fresh
    clone) still reruns: the recorded config is found beside the database; --into logs elsewhere."""
    import os
    import shutil

    from mlflow.tracking import MlflowClient

    from harness.launch.rerun import main

    _, run, _ = run_job("train.steps=1")
    src = os.environ["MLFLOW_TRACKING_URI"][len("sqlite:///"):]
    moved = run_dir / "moved"
    moved.mkdir()
    shutil.copy(src, moved / "mlflow.db")
    shutil.copytree(run_dir / "mlartifacts", moved / "mlartifacts")
    shutil.rmtree(run_dir / "mlartifacts")  # the recorded artifact folder is gone
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert main([run.info.run_id, "--tracking-uri", f"sqlite:///{moved / 'mlflow.db'}",
                 "--into", f"sqlite:///{run_dir / 'new.db'}"]) == 0
    new = MlflowClient(f"sqlite:///{run_dir / 'new.db'}").search_runs(["1"])
    assert len(new) == 1 and new[0].data.tags["rerun_of"] == run.info.run_id


def test_torch_version_names_its_build_where_the_wheel_metadata_does_not(monkeypatch):
    """PyPI's Linux torch 2.13.0 wheel says ``2.13.0`` in its metadata and ``2.13.0+cu130`` in
    ``torch.__version__``; provenance keeps the build (seen on a fresh machine, 2026-12-05)."""
    from harness.runtime import provenance

    real = provenance.importlib.metadata.version
    monkeypatch.setattr(provenance.importlib.metadata, "version",
                        lambda pkg: "2.13.0" if pkg == "torch" else real(pkg))
    monkeypatch.setattr(provenance.torch, "__version__", "2.13.0+cu130")
    assert provenance.versions()["torch"] == "2.13.0+cu130"
