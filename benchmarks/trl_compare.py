"""End-to-end GRPO step throughput: the harness vs TRL ``GRPOTrainer``, A B A B, same setup.

What is measured: completion tokens processed per second of wall time over whole training
steps (rollout + reward + log-probs + loss + backward + optimizer), for the harness
(``Trainer.train_step``, side A) and TRL's ``GRPOTrainer`` (side B) on an identical setup:
the same weights (the embedded SmolLM2-135M-Instruct, fp32), the same prompt strings in the
same order (the ``arith`` task's prompts exactly as the harness trainer builds them, handed
to TRL as a plain-string ``prompt`` column so no chat template is applied twice), the same
reward code (:func:`harness.train.rewards.compute_rewards` with the task's verifier), P prompts x
G samples per step, max new tokens, temperature, top-p, no top-k, mu = 1, beta, epsilon, lr,
AdamW betas, max grad norm, token-mean loss (TRL ``loss_type="dapo"``), group-scaled
advantages (TRL ``scale_rewards="group"``), no vLLM, and the same number of torch threads.
Defaults are the harness's ``preset=arith_cpu``.

How: each round runs one fresh subprocess per side, in the order A B A B (``--rounds 2``).
A worker loads the model (timed separately, excluded from step time), runs ``--warmup``
untimed steps, then ``--steps`` timed steps, and writes its per-step figures as JSON. The
harness step time is the trainer's own ``time/step_s`` (with its ``time/*`` split); the TRL
step time is a ``TrainerCallback`` timing ``on_step_begin`` -> ``on_step_end`` (TRL generates
inside the step). Completion tokens are counted the same way on both sides: tokens up to
and including the first EOS (TRL hands exactly those ids to the reward function as
``completion_ids``). The reported ratio is harness / TRL completion tokens per second, per
pair (A_i, B_i), and their mean; only ratios taken in the same run mean much on a shared
machine.

TRL is never a dependency of the package: it is installed with ``--no-deps`` into
``.bench/trl-<version>/`` (its dependencies are already in the harness environment) and that
folder is put on ``PYTHONPATH`` of the TRL worker only.

    python -m benchmarks.trl_compare                    # defaults: preset=arith_cpu, 2 rounds
    python -m benchmarks.trl_compare --rounds 1 --steps 1 --warmup 0 --max-new-tokens 16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.runtime.alloc import tune_malloc
from harness.runtime.provenance import cpu_label

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
TRL_VERSION = "1.16.0"
TRL_DIR = ROOT / ".bench" / f"trl-{TRL_VERSION}"
PIP_CMD = f"{sys.executable} -m pip install --no-deps --target {TRL_DIR} trl=={TRL_VERSION}"

# = preset=arith_cpu (conf/preset/arith_cpu.yaml) plus the run-wide defaults it inherits
DEFAULTS = dict(
    model=None,  # None = the embedded SmolLM2-135M-Instruct folder; "tiny" = the random 2-layer Llama
    task="arith", advantage="grpo", prompts=4, group_size=8, max_new_tokens=48, temperature=0.7, top_p=1.0,
    beta=0.0, epsilon=0.2, lr=1e-5, max_grad_norm=1.0, micro_batch_size=8, threads=2, seed=0,
    rounds=2, warmup=1, steps=2, order="AB",
    overrides=(),  # extra Hydra overrides of the harness config (harness-only knobs, e.g. train.share_prefix=false)
)
SIDES = {"A": "harness", "B": "trl"}

# TRL settings we set away from GRPOConfig's defaults, and why (printed under the table)
TRL_NON_DEFAULTS = [
    ("gradient_checkpointing", "False", "TRL defaults to True; it only recomputes activations (costs time) "
                                        "and the harness does not checkpoint here"),
    ("bf16", "False", "TRL defaults to True; both sides train in fp32"),
    ("use_cpu", "True", "this machine has no GPU"),
    ("shuffle_dataset", "False", "so TRL sees the harness's prompts in the harness's order"),
    ("adam_beta2", "0.99", "the harness's AdamW betas are (0.9, 0.99); TRL's default is 0.999"),
    ("lr_scheduler_type", "constant", "the harness's schedule; TRL's default is linear decay"),
    ("learning_rate", "{lr}", "the harness's preset; TRL's default is 1e-6"),
    ("max_completion_length", "{max_new_tokens}", "TRL's default is 512"),
    ("temperature", "{temperature}", "TRL's default is 1.0"),
    ("per_device_train_batch_size / gradient_accumulation_steps / steps_per_generation", "{mb} / {accum} / {accum}",
     "P x G completions per optimizer step, generated as one batch and trained in micro-batches of {mb} completions "
     "(TRL's own micro-batching, = the harness's train.micro_batch_size; one 32-completion forward/backward peaked at "
     "20 GiB RSS and was OOM-killed next to other jobs on this 24 GiB machine)"),
    ("report_to / save_strategy / logging_steps", "none / no / 1", "no trackers, no checkpoints; logs are "
                                                                   "written after on_step_end, outside the timing"),
]


class TRLUnavailable(RuntimeError):
    """TRL could not be installed into, or imported from, the benchmark's own folder."""


# ----------------------------------------------------------------------------- shared setup
def compose_cfg(settings: dict):
    """The harness config both sides are built from (``preset=arith_cpu`` + the settings).

    Args:
        settings: a full settings dict (see :data:`DEFAULTS`); ``model`` must already be resolved.
    Returns:
        the composed OmegaConf config.
    """
    from hydra import compose, initialize_config_dir

    from harness.launch.config import register_configs

    s = settings
    model = ["model=tiny"] if s["model"] == "tiny" else [f"model.name_or_path={s['model']}", "model.dtype=float32"]
    overrides = [
        "preset=arith_cpu", f"task={s['task']}", *model, f"advantage={s['advantage']}", "loss_agg=token-mean", "mu=1",
        f"group_size={s['group_size']}", f"train.prompts_per_step={s['prompts']}",
        f"rollout.max_new_tokens={s['max_new_tokens']}", f"rollout.temperature={s['temperature']}",
        f"rollout.top_p={s['top_p']}", f"beta={s['beta']}", f"policy_loss.epsilon={s['epsilon']}", f"train.lr={s['lr']}",
        f"train.max_grad_norm={s['max_grad_norm']}", f"train.micro_batch_size={s['micro_batch_size']}",
        f"train.threads={s['threads']}", f"seed={s['seed']}", "rollout.batch_size=0", "rollout.progress=false",
        "checkpoint.every=0", "group_filter=none", "train.warmup_steps=0", "train.lr_schedule=constant",
        *s.get("overrides", ()),
    ]
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def train_prompts(cfg, task, tokenizer, num_steps: int) -> tuple[list[str], list[str]]:
    """Exactly the prompt strings (and gold answers) the harness trainer uses for its first steps.

    Args:
        cfg: the composed config.
        task: the built task.
        tokenizer: the policy's tokenizer (its chat template renders the prompt).
        num_steps: steps to cover (``train.prompts_per_step`` prompts each).
    Returns:
        (prompts, golds), in the trainer's order.
    """
    n = num_steps * cfg.train.prompts_per_step
    problems = [task.train_problem(i, cfg.seed) for i in range(n)]
    return [task.prompt(p, tokenizer) for p in problems], [p.gold for p in problems]


def _build(settings: dict):
    """cfg and (task, tokenizer, policy, critic, backend) from :func:`harness.launch.run.build_components`,
    the objects :func:`harness.launch.run.train` trains."""
    import torch

    from harness.launch.run import build_components
    from harness.launch.validate import validate

    cfg = compose_cfg(settings)
    validate(cfg)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.train.threads)
    return cfg, *build_components(cfg)


def harness_source_id() -> str:
    """A short hash of the harness package's sources, to tell which working tree was measured."""
    import hashlib

    h = hashlib.sha1()
    for f in sorted((ROOT / "harness").rglob("*.py")):
        h.update(f.relative_to(ROOT).as_posix().encode() + f.read_bytes())
    return h.hexdigest()[:12]


class _NoTracker:
    """Stands in for :class:`harness.launch.tracking.Tracker`: the benchmark writes no MLflow runs."""

    run_id = None
    pending: list = []

    def __getattr__(self, name):
        return lambda *a, **k: None


# ----------------------------------------------------------------------------- workers
def harness_worker(settings: dict) -> dict:
    """Side A: ``warmup`` untimed then ``steps`` timed :meth:`harness.train.trainer.Trainer.train_step` calls.

    Args:
        settings: a full, resolved settings dict.
    Returns:
        ``{"side", "load_s", "warmup": [step records], "steps": [step records], "info"}``; a
        step record holds ``step_s``, ``completion_tokens``, every ``time/*`` metric and the
        step's ``train/*`` metrics.
    """
    import torch

    t0 = time.perf_counter()
    from harness.runtime.perf import PeakMemory
    from harness.train.trainer import Trainer

    cfg, task, tokenizer, policy, critic, backend = _build(settings)
    trainer = Trainer(cfg, task, tokenizer, policy, backend, _NoTracker(), critic=critic, checkpoint_dir=None)
    load_s = time.perf_counter() - t0
    from omegaconf import OmegaConf

    records, peak = [], PeakMemory()
    for i in range(settings["warmup"] + settings["steps"]):
        peak.reset()
        m = trainer.train_step()
        rec = {"step_s": m["time/step_s"], "completion_tokens": m["perf/completion_tokens"],
               "peak_mem_bytes": peak.read()}
        rec.update({k: float(v) for k, v in m.items() if k.startswith(("time/", "train/", "perf/"))})
        records.append(rec)
        print(f"harness step {i + 1}: {rec['step_s']:.1f} s, {rec['completion_tokens']:.0f} completion tokens",
              file=sys.stderr, flush=True)
    w = settings["warmup"]
    return {"side": "harness", "load_s": load_s, "warmup": records[:w], "steps": records[w:],
            "info": {"torch_threads": torch.get_num_threads(), "ref_model": trainer.ref is not None,
                     "harness_source": harness_source_id(),
                     "train_cfg": OmegaConf.to_container(cfg.train, resolve=True)}}


def trl_micro_batch(s: dict) -> int:
    """TRL's ``per_device_train_batch_size``: the harness's micro-batch, or the whole P x G batch when it does not
    divide it."""
    batch, mb = s["prompts"] * s["group_size"], s["micro_batch_size"]
    return mb if 0 < mb <= batch and batch % mb == 0 else batch


def trl_accum(s: dict) -> int:
    """TRL's ``gradient_accumulation_steps`` (= ``steps_per_generation``): micro-batches per optimizer step."""
    return s["prompts"] * s["group_size"] // trl_micro_batch(s)


def trl_non_defaults(s: dict) -> list[tuple[str, str, str]]:
    """:data:`TRL_NON_DEFAULTS` filled in with the settings ``s``: (key, value, why) rows for the report."""
    fill = dict(batch=s["prompts"] * s["group_size"], mb=trl_micro_batch(s), accum=trl_accum(s))
    return [(k, v.format(**fill, **s), why.format(**fill)) for k, v, why in TRL_NON_DEFAULTS]


def trl_config_kwargs(settings: dict, output_dir: str) -> dict:
    """The ``GRPOConfig`` keyword arguments matching the harness setup.

    Args:
        settings: a full, resolved settings dict.
        output_dir: TRL's (unused, temporary) output folder.
    Returns:
        keyword arguments for ``trl.GRPOConfig``.
    """
    s = settings
    return dict(
        output_dir=output_dir, seed=s["seed"], use_cpu=True, bf16=False, fp16=False,
        gradient_checkpointing=False, report_to="none", save_strategy="no", eval_strategy="no",
        logging_steps=1, disable_tqdm=True, log_level="warning", dataloader_num_workers=0,
        max_steps=s["warmup"] + s["steps"], shuffle_dataset=False, remove_unused_columns=False,
        per_device_train_batch_size=trl_micro_batch(s), gradient_accumulation_steps=trl_accum(s),
        steps_per_generation=trl_accum(s), num_generations=s["group_size"], max_completion_length=s["max_new_tokens"],
        temperature=s["temperature"], top_p=s["top_p"], top_k=0, num_iterations=1, beta=s["beta"],
        epsilon=s["epsilon"], loss_type="dapo", scale_rewards="group", use_vllm=False,
        learning_rate=s["lr"], adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.0, max_grad_norm=s["max_grad_norm"],
        lr_scheduler_type="constant", warmup_steps=0, log_completions=False, mask_truncated_completions=False,
    )


def trl_worker(settings: dict, output_dir: str) -> dict:
    """Side B: TRL ``GRPOTrainer.train`` for ``warmup + steps`` steps, timed per step by a callback.

    Also times, inside each step, TRL's generation (``_generate_single_turn``), the reward
    function, and the whole generate-and-score phase, by wrapping them (negligible overhead);
    the rest of the step is loss + backward + optimizer.

    Args:
        settings: a full, resolved settings dict.
        output_dir: a temporary folder for TRL's output_dir.
    Returns:
        the same shape as :func:`harness_worker`; step records hold ``step_s`` (on_step_begin
        -> on_step_end), ``loop_s`` (on_step_end to on_step_end, incl. data loading and
        logging), ``completion_tokens``, ``time/*`` and TRL's logged metrics (``trl/*``).
    Raises:
        TRLUnavailable: trl is not importable.
    """
    import torch

    t0 = time.perf_counter()
    try:
        import trl
        from datasets import Dataset
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as e:
        raise TRLUnavailable(f"cannot import trl ({e}); install it with: {PIP_CMD}") from e
    from harness.train.rewards import compute_rewards

    s = settings
    from harness.runtime.perf import PeakMemory

    cfg, task, tokenizer, policy, _, _ = _build(settings)  # the harness side's config, task and weights
    peak = PeakMemory()
    prompts, golds = train_prompts(cfg, task, tokenizer, s["warmup"] + s["steps"])
    # TRL tokenizes a plain-string prompt with the tokenizer's defaults (add_special_tokens=True);
    # the harness uses add_special_tokens=False. Check that they give the same ids.
    same_ids = all(tokenizer(p)["input_ids"] == tokenizer(p, add_special_tokens=False)["input_ids"]
                   for p in prompts)
    if not same_ids:
        raise RuntimeError("TRL would tokenize the prompts differently from the harness (special tokens added)")
    dataset = Dataset.from_dict({"prompt": prompts, "gold": golds})
    clock: dict = {"reward_s": 0.0, "generate_s": 0.0, "score_s": 0.0, "tokens": 0, "rows": 0}

    def arith_reward(prompts, completions, completion_ids, gold, **kwargs):
        t = time.perf_counter()
        lengths = torch.tensor([len(c) for c in completion_ids])
        rew = compute_rewards(task, list(completions), list(gold), lengths, format_weight=cfg.task.format_reward,
                              max_new_tokens=cfg.rollout.max_new_tokens, overlong_buffer=cfg.overlong.buffer,
                              overlong_factor=cfg.overlong.penalty)
        clock["tokens"] += int(lengths.sum())
        clock["rows"] += len(completion_ids)
        clock["reward_s"] += time.perf_counter() - t
        return rew.rewards.tolist()

    records: list[dict] = []
    trl_logs: list[dict] = []

    class StepTimer(TrainerCallback):
        last_end = None

        def on_step_begin(self, args, state, control, **kwargs):
            for k in ("reward_s", "generate_s", "score_s", "tokens", "rows"):
                clock[k] = 0
            peak.reset()
            self.begin = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            end = time.perf_counter()
            step_s = end - self.begin
            records.append({
                "step_s": step_s, "loop_s": end - (self.last_end or self.begin),
                "completion_tokens": float(clock["tokens"]), "completions": clock["rows"],
                "peak_mem_bytes": peak.read(),
                "time/step_s": step_s, "time/rollout_s": clock["generate_s"], "time/reward_s": clock["reward_s"],
                "time/generate_and_score_s": clock["score_s"],
                "time/logprob_other_s": clock["score_s"] - clock["generate_s"] - clock["reward_s"],
                "time/update_s": step_s - clock["score_s"],
            })
            self.last_end = end
            print(f"trl step {len(records)}: {step_s:.1f} s, {clock['tokens']} completion tokens",
                  file=sys.stderr, flush=True)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs:
                trl_logs.append({"step": state.global_step,
                                 **{k: v for k, v in logs.items() if isinstance(v, (int, float))}})

    args = GRPOConfig(**trl_config_kwargs(settings, output_dir))
    trainer = GRPOTrainer(model=policy, reward_funcs=[arith_reward], args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[StepTimer()])

    def timed(fn, key):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                clock[key] += time.perf_counter() - t
        return wrapper

    trainer._generate_single_turn = timed(trainer._generate_single_turn, "generate_s")
    trainer._generate_and_score_completions = timed(trainer._generate_and_score_completions, "score_s")
    torch.set_num_threads(cfg.train.threads)  # in case accelerate/Trainer changed it
    load_s = time.perf_counter() - t0
    trainer.train()
    for step, rec in enumerate(records, start=1):  # attach TRL's own logged metrics of that step
        for log in trl_logs:
            if log["step"] == step:
                rec.update({f"trl/{k}": v for k, v in log.items() if k != "step"})
    w = s["warmup"]
    return {"side": "trl", "load_s": load_s, "warmup": records[:w], "steps": records[w:],
            "info": {"trl_version": trl.__version__, "torch_threads": torch.get_num_threads(),
                     "prompt_ids_identical": same_ids, "ref_model": trainer.ref_model is not None,
                     "gradient_checkpointing": bool(policy.is_gradient_checkpointing),
                     "loss_type": trainer.loss_type, "scale_rewards": trainer.scale_rewards,
                     "eos_token_ids": list(trainer.eos_token_ids)}}


# ----------------------------------------------------------------------------- parent
def ensure_trl(install: bool = True) -> Path:
    """Make ``trl==TRL_VERSION`` importable from :data:`TRL_DIR` (never from the harness env).

    Args:
        install: run ``pip install --no-deps --target`` when it is missing.
    Returns:
        the folder to put on the TRL worker's ``PYTHONPATH``.
    Raises:
        TRLUnavailable: not installed and cannot be installed or imported; the message holds
            the pip command to run by hand.
    """

    def importable() -> tuple[bool, str]:
        env = {**os.environ, "PYTHONPATH": str(TRL_DIR)}
        r = subprocess.run([sys.executable, "-c", "import trl; print(trl.__version__)"], env=env,
                           capture_output=True, text=True)
        return r.returncode == 0 and r.stdout.strip() == TRL_VERSION, (r.stderr.strip().splitlines() or [""])[-1]

    ok, err = importable() if TRL_DIR.exists() else (False, "not installed")
    if ok:
        return TRL_DIR
    if install:
        print(f"installing trl=={TRL_VERSION} into {TRL_DIR} (no deps) ...", file=sys.stderr, flush=True)
        r = subprocess.run(PIP_CMD.split(), capture_output=True, text=True)
        if r.returncode != 0:
            raise TRLUnavailable(f"pip could not install trl=={TRL_VERSION}:\n{r.stderr[-2000:]}\n"
                                 f"run by hand: {PIP_CMD}")
        ok, err = importable()
    if not ok:
        raise TRLUnavailable(f"trl=={TRL_VERSION} is not importable from {TRL_DIR} ({err}); "
                             f"its dependencies (accelerate, datasets, transformers) must be in this environment. "
                             f"Install it with: {PIP_CMD}")
    return TRL_DIR


def resolve_settings(**settings) -> dict:
    """Fill defaults and resolve ``model=None`` to the embedded model's converted folder.

    Raises:
        ValueError: an unknown setting or a bad ``order``.
    """
    unknown = set(settings) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown settings {sorted(unknown)}; expected some of {sorted(DEFAULTS)}")
    s = {**DEFAULTS, **{k: v for k, v in settings.items() if v is not None}}
    if not s["order"] or set(s["order"]) - set(SIDES):
        raise ValueError(f"order={s['order']!r}: a string of the sides A (harness) and B (TRL)")
    if "B" in s["order"] and s["advantage"] != "grpo":
        raise ValueError(f"advantage={s['advantage']!r}: TRL's GRPOTrainer only runs grpo; use order='A'")
    if s["model"] is None:
        from harness.model.models import embedded_model_dir

        s["model"] = str(embedded_model_dir())
    return s


def run_worker(side: str, settings: dict, workdir: Path, trl_dir: Path | None = None) -> dict:
    """Run one side in a fresh subprocess and return its JSON result.

    Args:
        side: ``"harness"`` or ``"trl"``.
        settings: a full, resolved settings dict.
        workdir: a temporary folder for the settings/result files and the worker's log.
        trl_dir: the TRL folder (only this worker gets it on ``PYTHONPATH``).
    Returns:
        the worker's result dict plus ``wall_s`` (whole subprocess, incl. imports).
    Raises:
        RuntimeError: the worker failed (the message holds the tail of its log).
    """
    tag = f"{side}-{len(list(workdir.glob(f'{side}-*.json')))}"
    settings_file, result_file, log_file = (workdir / f"{tag}.settings", workdir / f"{tag}.json",
                                            workdir / f"{tag}.log")
    settings_file.write_text(json.dumps(settings))
    path = [str(ROOT)] + ([str(trl_dir)] if side == "trl" else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": str(settings["threads"]), "MKL_NUM_THREADS": str(settings["threads"]),
           "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "MLFLOW_TRACKING_URI": f"sqlite:///{workdir}/mlflow.db"}
    cmd = [sys.executable, "-m", "benchmarks.trl_compare", "--worker", side, "--settings-file", str(settings_file),
           "--result-file", str(result_file), "--workdir", str(workdir / f"{tag}-out")]
    t = time.perf_counter()
    with open(log_file, "w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - t
    if rc != 0 or not result_file.exists():
        tail = "\n".join(log_file.read_text().splitlines()[-30:])
        raise RuntimeError(f"{side} worker failed (exit {rc}); last lines of its log:\n{tail}")
    out = json.loads(result_file.read_text())
    out["wall_s"] = wall
    return out


def summarize(run: dict) -> dict:
    """Per-side figures of one worker run: mean step s, completion tokens/step and /s, time split.

    Args:
        run: a worker result.
    Returns:
        ``{"step_s", "tokens_per_step", "tokens_per_s", "load_s", "split": {time key: mean s}}``;
        tokens/s = all timed completion tokens / all timed step seconds.
    """
    steps = run["steps"]
    n = max(1, len(steps))
    total_s = sum(r["step_s"] for r in steps)
    total_tok = sum(r["completion_tokens"] for r in steps)
    keys = sorted({k for r in steps for k in r if k.startswith("time/") and k != "time/elapsed_s"})
    return {"step_s": total_s / n, "tokens_per_step": total_tok / n,
            "peak_mem_bytes": max((r.get("peak_mem_bytes", 0) for r in steps), default=0),
            "tokens_per_s": total_tok / total_s if total_s else float("nan"), "load_s": run.get("load_s"),
            "split": {k: sum(r.get(k, 0.0) for r in steps) / n for k in keys}}


def pair_ratios(rounds: list[dict]) -> list[float]:
    """Harness / TRL completion tokens per second for each round holding both sides.

    Args:
        rounds: ``[{"harness": summary, "trl": summary}, ...]`` (see :func:`summarize`).
    Returns:
        one ratio per round that has both sides.
    """
    return [r["harness"]["tokens_per_s"] / r["trl"]["tokens_per_s"] for r in rounds
            if "harness" in r and "trl" in r and r["trl"]["tokens_per_s"] > 0]


def run_comparison(**settings) -> dict:
    """Run the A B A B comparison and return the raw data and summaries.

    Args:
        **settings: any of :data:`DEFAULTS` (None = default). ``order`` is the side sequence
            inside a round (``"AB"``; ``"A"`` runs the harness only, without TRL).
    Returns:
        ``{"settings", "rounds": [{"harness": summary, "trl": summary}], "raw": [[worker
        results of round i]], "ratios", "mean_ratio", "wall_s", "trl_non_defaults"}``.
    Raises:
        TRLUnavailable: TRL is needed and cannot be installed/imported.
    """
    s = resolve_settings(**settings)
    trl_dir = ensure_trl() if "B" in s["order"] else None
    t0 = time.perf_counter()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rounds, raw = [], []
    with tempfile.TemporaryDirectory(prefix="trl-compare-") as tmp:
        for i in range(s["rounds"]):
            summary, results = {}, []
            for code in s["order"]:
                side = SIDES[code]
                print(f"round {i + 1}/{s['rounds']}: {code} ({side}) ...", file=sys.stderr, flush=True)
                res = run_worker(side, s, Path(tmp), trl_dir)
                res["round"] = i + 1
                results.append(res)
                summary[side] = summarize(res)
                print(f"  {side}: {summary[side]['step_s']:.1f} s/step, "
                      f"{summary[side]['tokens_per_s']:.1f} completion tok/s (load {res['load_s']:.1f} s, "
                      f"process {res['wall_s']:.0f} s)", file=sys.stderr, flush=True)
            rounds.append(summary)
            raw.append(results)
    ratios = pair_ratios(rounds)
    return {"settings": s, "rounds": rounds, "raw": raw, "ratios": ratios,
            "mean_ratio": sum(ratios) / len(ratios) if ratios else None, "wall_s": time.perf_counter() - t0,
            "trl_version": TRL_VERSION, "machine": f"{cpu_label()}, {os.cpu_count()} cores", "started": started,
            "trl_non_defaults": trl_non_defaults(s)}


def markdown(result: dict) -> list[str]:
    """A markdown section for ``results/benchmarks.md``.

    Args:
        result: what :func:`run_comparison` returned.
    Returns:
        lines: a settings line, a table per round, the per-pair ratios and their mean, the
        harness (and TRL) step-time split, and the TRL settings that differ from its defaults.
    """
    s = result["settings"]
    model = "tiny random Llama" if s["model"] == "tiny" else Path(str(s["model"])).name
    lines = [f"## End to end: harness vs TRL {result.get('trl_version', TRL_VERSION)} `GRPOTrainer` "
             f"({''.join(s['order'])} x {s['rounds']})", "",
             *([f"Machine: {result['machine']}; started {result['started']}.", ""] if "machine" in result else []),
             f"Same setup on both sides: {model} fp32, task `{s['task']}` (the harness's prompts, same order), "
             f"P={s['prompts']} prompts x G={s['group_size']}, {s['max_new_tokens']} new tokens, "
             f"temperature {s['temperature']}, top-p {s['top_p']}, no top-k, mu=1, beta={s['beta']}, "
             f"epsilon={s['epsilon']}, lr {s['lr']:g} AdamW (0.9, 0.99), max grad norm {s['max_grad_norm']}, "
             f"token-mean loss (TRL `dapo`), group-scaled advantages, TRL without vLLM (`use_vllm=False`), "
             f"{s['threads']} torch threads, "
             f"seed {s['seed']}; each side a fresh process per round, {s['warmup']} untimed warm-up step(s) then "
             f"{s['steps']} timed step(s); model loading excluded. Throughput = completion tokens (up to and "
             f"including EOS) per second of whole training step."
             + (f" Harness config overrides: `{' '.join(s['overrides'])}`." if s.get("overrides") else ""), ""]
    for i, rnd in enumerate(result["rounds"]):
        lines += [f"Round {i + 1}:", "", "| side | s/step | completion tokens/step | completion tokens/s | "
                  "peak RSS GiB | load s |", "|---|---|---|---|---|---|"]
        for code in s["order"]:
            side = SIDES[code]
            if side in rnd:
                r = rnd[side]
                lines.append(f"| {code} {side} | {r['step_s']:.1f} | {r['tokens_per_step']:.0f} | "
                             f"{r['tokens_per_s']:.1f} | {r.get('peak_mem_bytes', 0) / 2**30:.2f} | {r['load_s']:.1f} |")
        lines.append("")
    if result["ratios"]:
        pairs = ", ".join(f"{x:.2f}" for x in result["ratios"])
        lines += [f"Harness / TRL completion tokens/s per pair: {pairs}; **mean {result['mean_ratio']:.2f}x**", ""]
    for side, label in (("harness", "Harness"), ("trl", "TRL")):
        splits = [rnd[side]["split"] for rnd in result["rounds"] if side in rnd]
        if not splits:
            continue
        keys = [k for k in splits[0] if k != "time/step_s"]
        mean = {k: sum(sp.get(k, 0.0) for sp in splits) / len(splits) for k in keys}
        step = sum(sp.get("time/step_s", 0.0) for sp in splits) / len(splits)
        parts = ", ".join(f"{k[5:-2]} {max(v, 0.0):.1f} s" for k, v in mean.items())
        lines += [f"{label} step-time split (mean of timed steps, all rounds): step {step:.1f} s = {parts}", ""]
    if "B" in s["order"]:
        nd = "; ".join(f"`{k}={v}` ({why})" for k, v, why in result["trl_non_defaults"])
        lines += [f"TRL settings away from `GRPOConfig` defaults: {nd}. Left at TRL defaults: `loss_type=\"dapo\"`, "
                  "`scale_rewards=\"group\"`, `num_iterations=1`, `epsilon=0.2`, `top_k=0`, `top_p=1.0`, `beta=0.0` "
                  "(= the harness's settings here). Not settable in TRL: its std epsilon (1e-4, harness 1e-6); TRL's "
                  f"micro-batches of {trl_micro_batch(s)} are in sampling order, the harness's length-sorted.", ""]
    return lines


def _worker_main(args) -> None:
    settings = json.loads(Path(args.settings_file).read_text())
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    # both sides get the allocator settings `harness.run` applies (a process setting, not part of
    # either trainer's algorithm), so the A/B compares the trainers, not glibc's defaults
    malloc = tune_malloc()
    out = harness_worker(settings) if args.worker == "harness" else trl_worker(settings, args.workdir)
    out["malloc"] = malloc
    Path(args.result_file).write_text(json.dumps(out))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    d = DEFAULTS
    ap.add_argument("--rounds", type=int, default=d["rounds"], help="A B pairs (default %(default)s)")
    ap.add_argument("--warmup", type=int, default=d["warmup"], help="untimed steps per process")
    ap.add_argument("--steps", type=int, default=d["steps"], help="timed steps per process")
    ap.add_argument("--order", default=d["order"], help="sides per round: AB, BA, A (harness only)")
    ap.add_argument("--model", default=None, help="model folder, or 'tiny' (default: the embedded SmolLM2-135M)")
    ap.add_argument("--advantage", default=d["advantage"], help="harness estimator (TRL: grpo only)")
    ap.add_argument("--prompts", type=int, default=d["prompts"], help="P prompts per step")
    ap.add_argument("--group-size", type=int, default=d["group_size"], help="G completions per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=d["max_new_tokens"])
    ap.add_argument("--temperature", type=float, default=d["temperature"])
    ap.add_argument("--top-p", type=float, default=d["top_p"])
    ap.add_argument("--beta", type=float, default=d["beta"])
    ap.add_argument("--epsilon", type=float, default=d["epsilon"])
    ap.add_argument("--lr", type=float, default=d["lr"])
    ap.add_argument("--max-grad-norm", type=float, default=d["max_grad_norm"])
    ap.add_argument("--micro-batch-size", type=int, default=d["micro_batch_size"], help="both sides: the harness's train.micro_batch_size, TRL's per_device_train_batch_size")
    ap.add_argument("--threads", type=int, default=d["threads"], help="torch threads, both sides")
    ap.add_argument("--seed", type=int, default=d["seed"])
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="extra Hydra override of the harness config, repeatable (harness-only knobs, "
                         "e.g. train.share_prefix=false)")
    ap.add_argument("--out", default="results/trl_compare.json", help="raw data (JSON)")
    ap.add_argument("--worker", choices=["harness", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--settings-file", help=argparse.SUPPRESS)
    ap.add_argument("--result-file", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker_main(args)
        return
    settings = {k: getattr(args, k) for k in DEFAULTS if k not in ("task", "overrides")}
    settings["overrides"] = tuple(args.override)
    try:
        result = run_comparison(**settings)
    except TRLUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print("\n".join(markdown(result)))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    print(f"raw data: {out} (total wall time {result['wall_s']:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
