"""Data-parallel training (``torchrun``, gloo on CPU) equals the one-process run on the same global batch.

Every case launches the job the way a user does (``torchrun --standalone --nproc_per_node=2 -m
harness.run ...`` against ``python -m harness.run ...``) and compares what MLflow and the final
checkpoint hold: per-step loss and grad norm, the reward and advantage statistics, the token
count, and every weight after the last step.

The comparisons run in float64 (``model.dtype=float64``) to 1e-10: 2 ranks sum their gradients
and statistics in another order than one process, which moves a float64 result by ~1e-15, while
a real difference (a normaliser, a lost row, a wrong seed) is orders of magnitude larger. In
float32 the same comparison depends on the CPU (issue 33: a grad norm 4.4e-5 apart after 3
AdamW steps on an AMD Zen 4, within 1e-5 on an Intel Xeon), so the one float32 case
(``test_two_ranks_equal_one_default_grpo_with_mu2[float32]``) checks against float32's noise:
step 1 (before any optimizer step) to 1e-5, later steps to 2e-4, the weights by
:func:`tests.knob_probe.adamw_noise_ok`.

The policy is a tiny random Llama saved to a folder, with its EOS logit raised (as
``tests/knob_probe.py`` does) so completions end at varied lengths; the reward is the task's
verifier plus DAPO's soft overlong penalty (``overlong.*``), which depends on the length, so
groups have non-zero advantages and rows of uneven length land on both ranks.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from tests.conftest import job_threads
from tests.knob_probe import adamw_noise_ok

BASE = [
    "task=arith", "train.prompts_per_step=4", "group_size=4", "rollout.max_new_tokens=12", "eval.size=5",
    "eval.every=1", "rollout.progress=false", "train.micro_batch_size=3", "overlong.buffer=11",
    "overlong.penalty=1.0", "train.lr=1e-3",  # a large lr: the weights move far more than the tolerance
]
LR = 1e-3
F64 = "model.dtype=float64"  # the exactness comparisons' dtype (module docstring)


def _torchrun() -> list[str]:
    exe = Path(sys.executable).parent / "torchrun"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tokenizer):
    from tests import knob_probe
    from tests.conftest import tiny_llama

    folder = tmp_path_factory.mktemp("tiny_eos")
    model = tiny_llama(tokenizer)
    head = model.get_output_embeddings().weight
    d = torch.randn(head.shape[1], generator=torch.Generator().manual_seed(knob_probe.EOS_SEED))
    with torch.no_grad():
        head[tokenizer.eos_token_id] = d / d.norm() * knob_probe.EOS_NORM
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _env(mark: str | None = None, ranks: int = 1) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": job_threads(ranks)}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("WORLD_SIZE", None)
    if mark:
        env["HARNESS_TEST_MARK"] = mark
    return env


def _args(tiny_dir, out: Path, steps: int, extra) -> list[str]:
    # checkpoint.keep_final=full: the comparisons read the final checkpoint's weights, and some jobs train longer
    return [f"model.name_or_path={tiny_dir}", *BASE, f"train.steps={steps}", f"checkpoint.dir={out / 'ck'}",
            f"tracking.uri=sqlite:///{out / 'mlflow.db'}", "checkpoint.keep_final=full", *extra]


def launch(tiny_dir, out: Path, ranks: int, steps: int = 2, extra=(), check: bool = True, torchrun: bool = False):
    """Run one job in ``out`` with 1 process (``python -m``) or ``ranks`` processes (``torchrun``;
    ``torchrun=True``: under torchrun with one rank too)."""
    out.mkdir(parents=True, exist_ok=True)
    head = [sys.executable, "-m", "harness.run"] if ranks == 1 and not torchrun else [
        *_torchrun(), "--standalone", f"--nproc_per_node={ranks}", "-m", "harness.run"]
    proc = subprocess.run([*head, *_args(tiny_dir, out, steps, extra)], cwd=out, env=_env(ranks=ranks),
                          capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


KEYS = ["train/loss", "train/grad_norm", "train/reward_mean", "train/advantage_abs_mean", "train/entropy",
        "perf/completion_tokens", "train/groups_kept", "train/prompts_sampled", "eval/accuracy", "eval/completion_len_mean"]


def record(out: Path, keys=KEYS) -> dict:
    """The one MLflow run in ``out``: its tags and the metric histories of ``keys`` (step -> value)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("grpo-harness").experiment_id])
    assert len(runs) == 1, f"{len(runs)} MLflow runs in {out}"
    hist = {}
    for k in keys:
        ms = client.get_metric_history(runs[0].info.run_id, k)
        assert len({m.step for m in ms}) == len(ms), f"{k}: a step logged twice"
        hist[k] = {m.step: m.value for m in ms}
    hist["tags"] = runs[0].data.tags
    hist["status"] = runs[0].info.status
    hist["extra"] = {k: client.get_metric_history(runs[0].info.run_id, k) for k in ("train/kl", "train/value_loss")}
    return hist


def weights(out: Path) -> dict:
    return torch.load(sorted(glob.glob(str(out / "ck" / "step_*.pt")))[-1], weights_only=False)


EXACT = dict(rel=1e-10, abs=1e-12)  # float64: weights of 2 ranks vs 1 process measured <= 5e-14 apart


def assert_close(a: dict, b: dict, keys, float32: bool = False):
    """Every step of each metric history in ``keys`` equal: float64 to :data:`EXACT`; float32 step
    1 (no optimizer step yet) to 1e-5 and later steps to 2e-4 (float32 rounding after AdamW)."""
    for k in keys:
        assert sorted(a[k]) == sorted(b[k]), k
        for s in a[k]:
            tol = EXACT if not float32 else dict(rel=1e-5 if s <= 1 else 2e-4, abs=1e-6)
            assert b[k][s] == pytest.approx(a[k][s], **tol), (k, s, a[k][s], b[k][s], tol)


def assert_weights_close(wa: dict, wb: dict, steps: int, float32: bool = False, lr: float = LR):
    """The checkpoints' policy weights equal: float64 to 1e-10 (the largest difference and its
    tensor in the message); float32 within AdamW's rounding noise (:func:`adamw_noise_ok`)."""
    if float32:
        flat = [torch.cat([w["policy"][k].flatten().double() for k in sorted(wa["policy"])]) for w in (wa, wb)]
        why = adamw_noise_ok(*flat, lr=lr, steps=steps)
        assert not why, f"float32 weights differ beyond rounding noise: {why}"
        return
    assert all(v.dtype == torch.float64 for v in wa["policy"].values()), "the float64 run saved non-float64 weights"
    worst, where = max((float((wa["policy"][k] - wb["policy"][k]).abs().max()), k) for k in wa["policy"])
    assert worst < 1e-10, f"weights differ by {worst:.3g} in {where} (tolerance 1e-10)"


def assert_same(one: Path, two: Path, steps: int, tiny_dir: Path, keys=KEYS, float32: bool = False, ranks: int = 2):
    a, b = record(one, keys), record(two, keys)
    assert b["tags"]["world_size"] == str(ranks) and a["tags"]["world_size"] == "1"
    assert a["status"] == b["status"] == "FINISHED"
    assert_close(a, b, keys, float32)
    assert sorted(a["train/loss"]) == list(range(1, steps + 1))
    # the variant is on: the loss and its gradient are not trivially zero
    assert max(abs(v) for v in a["train/grad_norm"].values()) > 1e-3
    wa, wb = weights(one), weights(two)
    assert wa["step"] == wb["step"] == steps
    assert_weights_close(wa, wb, steps, float32)
    moved = max(float((wa["policy"][k] - w0).abs().max()) for k, w0 in _initial(tiny_dir).items())
    assert moved > 1e-3, "the updates did not move the weights: the comparison would be vacuous"
    return a, b


def _initial(tiny_dir: Path) -> dict:
    from safetensors.torch import load_file

    sd = load_file(str(tiny_dir / "model.safetensors"))
    sd.setdefault("lm_head.weight", sd["model.embed_tokens.weight"])
    return sd


def pair(tiny_dir, tmp_path, name: str, steps: int = 2, extra=()):
    one, two = tmp_path / f"{name}-1", tmp_path / f"{name}-2"
    for out, ranks in ((one, 1), (two, 2)):
        launch(tiny_dir, out, ranks, steps, extra)
    return one, two


@pytest.mark.parametrize("dtype", ["float64", pytest.param("float32", marks=pytest.mark.exactness)])
def test_two_ranks_equal_one_default_grpo_with_mu2(tiny_dir, tmp_path, dtype):
    """GRPO, seq-mean-token-mean, mu=2 (old log-probs, clipping), 3-row micro-batches over 8-row shards;
    float64 to 1e-10, and float32 against its rounding noise (module docstring)."""
    one, two = pair(tiny_dir, tmp_path, "grpo", extra=["mu=2", "checkpoint.every=1", f"model.dtype={dtype}"])
    a, _ = assert_same(one, two, 2, tiny_dir, float32=dtype == "float32")
    assert a["tags"]["estimator"] == "grpo"


def test_two_ranks_equal_one_token_mean_batch_whitening_and_kl(tiny_dir, tmp_path):
    """token-mean with REINFORCE++ (advantages whitened over the *global* batch) and a k3 KL term."""
    one, two = pair(tiny_dir, tmp_path, "rpp", extra=["advantage=reinforce_pp", "loss_agg=token-mean", "beta=0.1",
                                                      "kl.form=k3", "checkpoint.every=0", F64])
    a, b = assert_same(one, two, 2, tiny_dir)
    kl_a = {m.step: m.value for m in a["extra"]["train/kl"]}
    kl_b = {m.step: m.value for m in b["extra"]["train/kl"]}
    assert kl_a and kl_b == pytest.approx(kl_a, **EXACT)


def test_two_ranks_equal_one_seq_sum_norm_with_ppo_critic(tiny_dir, tmp_path):
    """seq-mean-token-sum-norm (Dr. GRPO's constant divisor) with PPO: GAE over gathered values and a
    data-parallel critic (its value loss normalised over the global batch)."""
    one, two = pair(tiny_dir, tmp_path, "ppo", extra=["advantage=ppo", "loss_agg=seq-mean-token-sum-norm",
                                                      "checkpoint.every=0", F64])
    a, b = assert_same(one, two, 2, tiny_dir)
    va = {m.step: m.value for m in a["extra"]["train/value_loss"]}
    vb = {m.step: m.value for m in b["extra"]["train/value_loss"]}
    assert va and vb == pytest.approx(va, **EXACT)


def test_two_ranks_equal_one_with_dapo_dynamic_sampling(tiny_dir, tmp_path):
    """DAPO's group filter keeps uneven numbers of groups per rank (possibly none on one) and resamples
    until the global count is reached; the kept count and the update match one process."""
    extra = ["group_filter=dapo", "group_filter.max_rounds=3", "overlong.buffer=3", "checkpoint.every=0", F64]
    one, two = pair(tiny_dir, tmp_path, "dapo", steps=3, extra=extra)
    a, _ = assert_same(one, two, 3, tiny_dir)
    assert max(a["train/prompts_sampled"].values()) > 4, "no group was filtered: the case tests nothing"
    assert min(a["train/groups_kept"].values()) >= 1


def test_two_ranks_equal_one_with_length_penalty_gdpo_and_adaptive_entropy(tiny_dir, tmp_path):
    """The knobs that take group statistics over the global batch (length_penalty, gdpo's
    per-component normalisation) and the entropy controller's state: 2 ranks = 1 process."""
    extra = ["length_penalty=linear", "advantage=gdpo", "task.format_reward=0.5", "entropy_coef=0.01",
             "entropy_control=adaptive", "entropy_control.target=100.0", "checkpoint.every=0", F64]
    one, two = pair(tiny_dir, tmp_path, "lpgdpo", steps=2, extra=extra)
    keys = [*KEYS, "train/length_penalty", "train/entropy_coef", "train/entropy_bonus_applied"]
    a, _ = assert_same(one, two, 2, tiny_dir, keys=keys)
    assert any(v != 0 for v in a["train/length_penalty"].values()), "the penalty never acted: the case tests nothing"
    assert a["train/entropy_bonus_applied"][2] == 1.0


def test_two_ranks_equal_one_with_lora(tiny_dir, tmp_path):
    """lora=peft: data-parallel sums only the adapters' gradients (the frozen weights have none);
    2 ranks = 1 process in the metrics, the KL against the adapters-off reference and every adapter
    tensor of the final checkpoint, which holds the adapters only."""
    extra = ["lora=peft", "lora.r=4", "beta=0.1", "checkpoint.every=0", F64]
    one, two = pair(tiny_dir, tmp_path, "lora", extra=extra)
    a, b = record(one), record(two)
    assert b["tags"]["world_size"] == "2" and a["tags"]["world_size"] == "1"
    assert a["status"] == b["status"] == "FINISHED"
    assert_close(a, b, KEYS)
    kl_a = {m.step: m.value for m in a["extra"]["train/kl"]}
    kl_b = {m.step: m.value for m in b["extra"]["train/kl"]}
    assert kl_a[1] == 0.0 and kl_a[2] > 0 and kl_b == pytest.approx(kl_a, **EXACT)
    wa, wb = weights(one), weights(two)
    assert set(wa["policy"]) == set(wb["policy"]) and all(".lora_" in k for k in wa["policy"])
    assert_weights_close(wa, wb, 2)
    moved = max(float(v.abs().max()) for k, v in wa["policy"].items() if ".lora_B." in k)
    assert moved > 1e-4, "the adapters did not move: the comparison would be vacuous"


def _rank_pid(mark: str, rank: int) -> int | None:
    """The pid of the torchrun worker with ``RANK=rank`` among the processes started with ``mark``."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = set((proc / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        try:  # the worker itself, not a process it started (verifier workers inherit its environment)
            is_worker = b"harness.run" in (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if is_worker and f"HARNESS_TEST_MARK={mark}".encode() in env and f"RANK={rank}".encode() in env:
            return int(proc.name)
    return None


def test_kill_one_rank_then_resume(tiny_dir, tmp_path):
    """SIGKILL of rank 1 mid-run: torchrun stops the job with an error naming the rank; the same
    command resumes from the last checkpoint into the same MLflow run, and the result equals the
    uninterrupted one-process run (float64: metrics and weights to 1e-10, every metric step logged
    once; in float32 this comparison failed on an AMD Zen 4 CPU, issue 33)."""
    steps, extra = 10, ["checkpoint.every=2", "eval.every=5", F64]
    one, two = tmp_path / "kill-1", tmp_path / "kill-2"
    launch(tiny_dir, one, 1, steps, extra)
    two.mkdir()

    mark = uuid.uuid4().hex
    cmd = [*_torchrun(), "--standalone", "--nproc_per_node=2", "-m", "harness.run", *_args(tiny_dir, two, steps, extra)]
    proc = subprocess.Popen(cmd, cwd=two, env=_env(mark, ranks=2), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    killed_at = None
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if glob.glob(str(two / "ck" / "step_*.pt")):
            pid = _rank_pid(mark, 1)
            if pid is not None:
                killed_at = sorted(glob.glob(str(two / "ck" / "step_*.pt")))[-1]
                os.kill(pid, signal.SIGKILL)
                break
        time.sleep(0.02)
    out, _ = proc.communicate(timeout=300)
    assert killed_at is not None, "rank 1 was never found to kill:\n" + out[-3000:]
    assert proc.returncode != 0, "the job did not fail after its rank 1 was killed:\n" + out[-3000:]
    assert "rank      : 1" in out and "Signal 9 (SIGKILL)" in out, out[-3000:]
    assert weights(two)["step"] < steps, "the kill came after the last step: nothing to resume"

    again = launch(tiny_dir, two, 2, steps, extra)
    assert "resuming from" in again.stdout + again.stderr
    a, b = record(one), record(two)
    assert b["status"] == "FINISHED"
    assert_close(a, b, ("train/loss", "train/grad_norm", "eval/accuracy"))
    assert_weights_close(weights(one), weights(two), steps)
    shutil.rmtree(two / "ck", ignore_errors=True)


def test_rerun_of_a_finished_two_rank_job_trains_nothing_then_trains_longer(tiny_dir, tmp_path):
    """torchrun with 2 ranks, then the same command again: rank 0 finds the job finished and tells
    rank 1; both exit 0 without training, one report is printed, the store still holds one run
    with every metric once. Then train.steps raised: both ranks continue that run from the final
    checkpoint."""
    from mlflow.tracking import MlflowClient

    out, extra = tmp_path / "again", ["checkpoint.every=1"]

    def run_ids() -> list[str]:
        client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
        return [r.info.run_id for r in client.search_runs([client.get_experiment_by_name("grpo-harness").experiment_id])]

    launch(tiny_dir, out, 2, 2, extra)
    first, ids = record(out), run_ids()
    again = launch(tiny_dir, out, 2, 2, extra)
    log = again.stdout + again.stderr
    assert log.count("this job is already finished; nothing was trained or logged") == 1, log[-3000:]
    assert f"MLflow run    : {ids[0]} (FINISHED" in again.stdout and "step 1/2" not in log
    second = record(out)  # one run, no step twice
    assert run_ids() == ids and second["status"] == "FINISHED"
    assert all(second[k] == first[k] for k in KEYS) and sorted(second["train/loss"]) == [1, 2]
    longer = launch(tiny_dir, out, 2, 3, extra)
    assert "training longer: train.steps 2 -> 3" in longer.stdout + longer.stderr
    third = record(out)
    assert run_ids() == ids and sorted(third["train/loss"]) == [1, 2, 3] and third["status"] == "FINISHED"
    assert third["tags"]["harness.extended_from"] == "2" and weights(out)["step"] == 3


# ----------------------------------------------------------------------------- FSDP2
def _history(out: Path, key: str) -> dict:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("grpo-harness").experiment_id])[0]
    return {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}


def _shard_frac(out: Path) -> list[float]:
    return list(_history(out, "perf/param_shard_frac").values())


def test_fsdp2_two_ranks_equal_one_process(tiny_dir, tmp_path):
    """train.sharding=fsdp2 on 2 gloo ranks (decoder layers and the root sharded, gradients
    reduce-scattered, generation and old/reference log-probs on gathered weights) equals the
    unsharded one-process run: GRPO with mu=2, a k3 KL term against a sharded reference refreshed
    every step, prefix sharing on, 3-row micro-batches (uneven counts per rank come from the uneven
    lengths' trimming, not from the count; DAPO below makes the counts uneven)."""
    extra = ["mu=2", "beta=0.1", "kl.form=k3", "kl.ref_refresh_steps=1", "checkpoint.every=1", F64]
    one, two = tmp_path / "fsdp-1", tmp_path / "fsdp-2"
    launch(tiny_dir, one, 1, 2, extra)
    launch(tiny_dir, two, 2, 2, [*extra, "train.sharding=fsdp2"])
    assert_same(one, two, 2, tiny_dir)
    # the knob ran: each rank held about half of the policy (1.0 in the unsharded run)
    assert _shard_frac(one) == [1.0, 1.0]
    assert all(0.45 < f < 0.55 for f in _shard_frac(two)), _shard_frac(two)


def test_fsdp2_with_dapo_uneven_micro_batches_and_resume(tiny_dir, tmp_path):
    """DAPO leaves the ranks with different numbers of groups (micro-batches), so the idle rank runs
    zero-loss passes to join the collectives; the run is stopped after step 2 and resumed from its
    full-state checkpoint (every rank loads its shard), and still equals the one-process run."""
    extra = ["group_filter=dapo", "group_filter.max_rounds=3", "overlong.buffer=3", "checkpoint.every=2",
             "train.micro_batch_size=2", F64]
    one, two = tmp_path / "fdapo-1", tmp_path / "fdapo-2"
    launch(tiny_dir, one, 1, 4, extra)
    launch(tiny_dir, two, 2, 2, [*extra, "train.sharding=fsdp2"])
    ck = weights(two)
    assert ck["step"] == 2 and ck["finished"]
    launch(tiny_dir, two, 2, 4, [*extra, "train.sharding=fsdp2", f"resume={sorted((two / 'ck').glob('step_*.pt'))[-1]}"])
    a, b = record(one), record(two)  # one MLflow run each: the resume continued the sharded run's
    assert max(a["train/prompts_sampled"].values()) > 4, "no group was filtered: the case tests nothing"
    idle = _history(two, "train/idle_passes")
    assert sorted(idle) == [1, 2, 3, 4] and max(idle.values()) > 0, f"no rank ever waited: {idle}"
    assert_close(a, b, ("train/loss", "train/grad_norm", "train/groups_kept", "eval/accuracy"))
    wa, wb = weights(one), weights(two)
    assert wb["step"] == 4
    assert_weights_close(wa, wb, 4)


def test_two_ranks_equal_one_with_a_calculator_tool(tiny_dir, tmp_path):
    """Episode rollouts (tools=calculator; the tiny model "calls" on any token with an "e", as in
    tests/test_tools.py): each rank's episodes are seeded by their global rows, the observations
    are masked out of the loss on both, and the step equals the one-process step."""
    keys = [*KEYS, "rollout/tool_calls_mean", "rollout/observation_tokens_mean", "rollout/tool_errors"]
    one, two = pair(tiny_dir, tmp_path, "tools", extra=["tools=calculator", "tools.call_open=", "tools.call_close=e",
                                                         "rollout.max_new_tokens=24", "checkpoint.every=0", F64])
    a, _ = assert_same(one, two, 2, tiny_dir, keys=keys)
    assert min(a["rollout/tool_calls_mean"].values()) > 0 and min(a["rollout/observation_tokens_mean"].values()) > 0
