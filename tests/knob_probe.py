"""A fixed-seed probe of the whole training path, for the knob-effect test.

``probe(*overrides)`` composes the config as ``python -m harness.run`` would, builds the real
task, tokenizer, tiny policy, critic and ``hf`` backend, and runs ``Trainer.fit`` for the
configured steps with an in-memory tracker. It records what a knob can change:

* ``rollout``: the token ids and masks of every training ``generate`` call, ``prompts`` their
  prompt strings; ``eval``: the prompts, completions and metrics of every evaluation;
* ``rewards``, ``scores``, ``advantages``: per step, from :class:`harness.train.trainer.StepRecord`;
* ``loss``, ``grad_norm``, ``metrics``: the logged step metrics (times excluded);
* ``weights``: the policy's parameters after the last step (in ``model.dtype``); ``opt_dtypes``
  the dtypes of AdamW's moments.

Two adjustments make a tiny random model exercise every branch, applied identically to both
sides of a comparison: the EOS token's output embedding (all zeros in a fresh model: it is the
padding index) is set to a fixed vector so completions end at varied lengths (some truncated,
some not), and the verifier's verdicts are replaced by a
deterministic function of the completion text (``reward="hash"``: dense 0/1 correctness and
format flags; ``reward="zero"``: all 0), because a random model never answers correctly. The
task knobs whose job *is* verification are tested against the real verifier in test_knobs.py.
"""

from __future__ import annotations

import hashlib
import math

import torch

from harness.verifiers import Verdict
from tests.conftest import compose

BASE = [
    "model=tiny", "task=arith", "train.steps=2", "train.prompts_per_step=2", "group_size=4",
    "rollout.max_new_tokens=6", "eval.size=2", "eval.every=1", "eval.batch_size=2", "checkpoint.every=0",
    "rollout.progress=false", "train.micro_batch_size=4", "train.lr=1e-3",
]
EOS_NORM, EOS_SEED = 6.5, 4  # measured: step lengths 3..6 of 6 tokens, 5 and 4 of 8 rows truncated


class MemoryTracker:
    """The subset of :class:`harness.launch.tracking.Tracker` the trainer calls, kept in memory."""

    run_id = "probe"

    def __init__(self):
        self.pending, self.metrics, self.tables, self.tags = [], {}, {}, {}

    def queue(self, metrics, step):
        self.metrics.setdefault(step, {}).update({k: float(v) for k, v in metrics.items() if v is not None})

    def log_metrics(self, metrics, step):
        self.queue(metrics, step)

    def flush(self):
        return True

    def heartbeat(self):
        pass

    def log_table(self, rows, name):
        self.tables[name] = rows

    def set_tags(self, tags):
        self.tags.update(tags)

    def log_text(self, text, name):
        pass

    def metric_history(self, key):
        return [(s, m[key]) for s, m in sorted(self.metrics.items()) if key in m]


class RecordingBackend:
    """Wraps the real backend and records every call (the sampling still runs)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def generate(self, prompts, num_samples, params):
        out = self.inner.generate(prompts, num_samples, params)
        self.calls.append({"prompts": list(prompts), "n": num_samples, "greedy": params.temperature == 0,
                           "temperature": params.temperature, "ids": out.completion_ids.clone(),
                           "mask": out.completion_mask.clone(), "texts": list(out.texts)})
        return out

    def sync_weights(self, model):
        self.inner.sync_weights(model)


def hash_verdicts(completions, golds):
    out = []
    for c, g in zip(completions, golds):
        h = int(hashlib.sha1(f"{c}|{g}".encode()).hexdigest(), 16)
        out.append(Verdict(correct=bool(h % 2), formatted=bool((h // 2) % 3 == 0), extracted=None, status="ok"))
    return out


def zero_verdicts(completions, golds):
    return [Verdict(correct=False, formatted=False, extracted=None, status="ok") for _ in completions]


def probe(*overrides, reward: str = "hash", eos: bool = True) -> dict:
    """Run the configured job and return the observations listed in the module docstring.

    Args:
        overrides: Hydra overrides on top of :data:`BASE`.
        reward: ``hash`` or ``zero`` verdicts, or a function ``(completions, golds) -> verdicts``.
        eos: set the EOS direction (varied lengths); without it greedy decoding runs to the cap.
    """
    from harness.launch.run import build_components, prepare
    from harness.train.trainer import Trainer

    threads = torch.get_num_threads()
    cfg = compose(*BASE, *overrides)
    try:
        prepare(cfg)
        task, tok, policy, critic, backend = build_components(cfg)
        head = policy.get_output_embeddings().weight
        d = torch.randn(head.shape[1], generator=torch.Generator().manual_seed(EOS_SEED))
        if eos:
            with torch.no_grad():
                head[tok.eos_token_id] = (d / d.norm() * EOS_NORM).to(head.dtype)
        task.score = reward if callable(reward) else hash_verdicts if reward == "hash" else zero_verdicts
        rec, records, tracker = RecordingBackend(backend), [], MemoryTracker()
        trainer = Trainer(cfg, task, tok, policy, rec, tracker, critic=critic, on_step=records.append)
        history = trainer.fit()
    finally:
        torch.set_num_threads(threads)
    is_train = [not c["greedy"] and c["n"] == cfg.group_size for c in rec.calls]
    train_calls = [c for c, t in zip(rec.calls, is_train) if t]
    eval_calls = [c for c, t in zip(rec.calls, is_train) if not t]
    clean = {s: {k: v for k, v in m.items() if not k.startswith(("time/", "perf/"))}
             for s, m in history.items()}
    return {
        "rollout": [(c["ids"], c["mask"]) for c in train_calls],
        "prompts": [c["prompts"] for c in train_calls],
        "eval": ([(p, t, c["temperature"]) for c in eval_calls
                  for p, t in zip([q for q in c["prompts"] for _ in range(c["n"])], c["texts"])],
                 {s: {k: v for k, v in m.items() if k.startswith("eval/")} for s, m in clean.items()}),
        "rewards": [r.rewards.rewards for r in records],
        "scores": [r.scores for r in records],
        "advantages": [r.advantages for r in records],
        "loss": [m.get("train/loss") for s, m in sorted(clean.items()) if s > 0],
        "grad_norm": [m.get("train/grad_norm") for s, m in sorted(clean.items()) if s > 0],
        "metrics": clean,
        "weights": torch.cat([p.detach().flatten() for p in policy.parameters()]),  # in model.dtype
        "opt_dtypes": {v.dtype for st in trainer.opt.state.values() for v in st.values()
                       if isinstance(v, torch.Tensor) and v.dim()},  # AdamW's moments
        "tags": dict(tracker.tags),
        "records": records,
        "cfg": cfg,
    }


def metric(obs: dict, key: str) -> list:
    """The sequence of ``key`` over the probe's steps (absent = None)."""
    return [m.get(key) for _, m in sorted(obs["metrics"].items())]


def same(a, b, rtol=1e-4, atol=1e-6) -> bool:
    """Structural equality with float tolerance (tensors, lists, tuples, dicts, numbers, strings)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
            return False
        if not a.is_floating_point():
            return bool(torch.equal(a, b))
        return bool(torch.allclose(a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], rtol, atol) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y, rtol, atol) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=rtol, abs_tol=atol)
    return a == b


def diff(a, b, path="", rtol=1e-4, atol=1e-6):
    """Where :func:`same` fails, for assertion messages: the first failing path and, for a tensor,
    the largest difference, its index, both values there, how many elements are out of tolerance
    and the tolerance itself."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                return f"{path}/{k}: present on one side only"
            d = diff(a[k], b[k], f"{path}/{k}", rtol, atol)
            if d:
                return d
        return ""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            d = diff(x, y, f"{path}[{i}]", rtol, atol)
            if d:
                return d
        return ""
    if same(a, b, rtol, atol):
        return ""
    tol = f"(rtol {rtol:g}, atol {atol:g})"
    if (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
            and a.is_floating_point() and a.numel()):
        x, y = a.double(), b.double()
        d = (x - y).abs().nan_to_num(nan=float("inf"))
        i = int(d.flatten().argmax())
        at = tuple(int(j) for j in torch.unravel_index(torch.tensor(i), a.shape))
        bad = int((d > atol + rtol * y.abs()).sum())
        return (f"{path}: max |d| {float(d.flatten()[i]):.3g} at {list(at)} ({float(x.flatten()[i])!r} vs "
                f"{float(y.flatten()[i])!r}); {bad} of {a.numel()} elements out of {tol}")
    if isinstance(a, float) and isinstance(b, float):
        return f"{path}: {a!r} != {b!r}, |d| {abs(a - b):.3g} {tol}"
    return f"{path}: {a!r} != {b!r} {tol}"[:600]


def adamw_noise_ok(a: torch.Tensor, b: torch.Tensor, lr: float, steps: int, rtol=2e-4, atol=2e-6,
                   max_frac=1e-5) -> str:
    """Float32 weights after ``steps`` AdamW steps that equal up to rounding noise: "" or why not.

    AdamW's step is ``lr * m / (sqrt(v) + eps)``: an element whose gradient is ~0 gets a step of up
    to ``lr`` of whichever sign float rounding gave it (measured: 2 of 1.6M weights off by 9e-5 at
    lr 1e-3 on an AMD Zen 4 CPU, none on an Intel Xeon). So float32 weights are checked as: at most
    ``max_frac`` of the elements outside (``rtol``, ``atol``), and none off by more than
    ``2 * lr * steps`` (the most two runs' AdamW steps can differ: |m / sqrt(v)| <= ~1 per step). A
    real difference in the update (a wrong normaliser, a lost micro-batch) moves most weights and
    fails; the exact claim itself is checked in float64 (``model.dtype=float64``) at ~1e-10.
    """
    d = (a.double() - b.double()).abs()
    bad = int((d > atol + rtol * b.double().abs()).sum())
    worst, bound = float(d.max()), 2 * lr * steps
    if bad > max_frac * a.numel() or worst > bound:
        return (f"{bad} of {a.numel()} weights out of (rtol {rtol:g}, atol {atol:g}) (allowed "
                f"{int(max_frac * a.numel())}), max |d| {worst:.3g} (allowed 2 * lr * steps = {bound:.3g})")
    return ""


def probe_components(cfg):
    """:func:`harness.launch.run.build_components` for ``cfg`` with the probe's set-up: the EOS row of the LM
    head set so that completions end at varied lengths (``EOS_NORM``, ``EOS_SEED``) and the task scored by
    :func:`hash_verdicts`. Returns ``(task, tokenizer, policy, critic, backend)``; the caller has run
    :func:`harness.launch.run.prepare` (it sets the thread count, which the caller restores)."""
    from harness.launch.run import build_components

    task, tok, policy, critic, backend = build_components(cfg)
    head = policy.get_output_embeddings().weight
    d = torch.randn(head.shape[1], generator=torch.Generator().manual_seed(EOS_SEED))
    with torch.no_grad():
        head[tok.eos_token_id] = (d / d.norm() * EOS_NORM).to(head.dtype)
    task.score = hash_verdicts
    return task, tok, policy, critic, backend
