"""What a job prints at its end: the summary of a trained job, or the report of one already finished."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from mlflow.entities import Metric

from harness import progress
from harness.launch import credentials
from harness.launch.job import ALLOWED_TO_DIFFER
from harness.model.lora import ADAPTER_CONFIG
from harness.train import checkpoint as ckpt


def report_finished(cfg, tracker, state: dict, plan: dict, ckpt_dir: Path, on_eval=None) -> float:
    """Say that the job is already done and how to go on; returns its final eval accuracy.

    The run is reopened only when it was not closed FINISHED (a kill in the shutdown window,
    after the final checkpoint): the checkpoint's unsent metrics are sent unless the run holds
    them, and the run is closed FINISHED. ``on_eval`` (a sweep's objective) is called once with
    the final eval's metrics as the run records them.
    """
    run_id = plan["run_id"]
    head = "this job is already finished; nothing was trained or logged"
    if plan["status"] != "FINISHED":
        tracker.start(run_id=run_id)
        tracker.extend([Metric(k, v, ts, st) for k, v, ts, st in state.get("pending_metrics") or []])
        tracker.set_tags({"harness.closed_by_rerun": "the final checkpoint was written; the run was not closed"})
        tracker.end("FINISHED")
        head = (f"this job is already finished; nothing was trained (its MLflow run was still {plan['status']} "
                "after the final checkpoint: the metrics that checkpoint held and the run lacked were sent, and "
                "the run is now closed FINISHED)")
    else:
        tracker.run_id = run_id
    run = tracker.client.get_run(run_id)
    metrics, tags = run.data.metrics, run.data.tags
    if on_eval is not None:
        on_eval(int(plan["step"]), {k: v for k, v in metrics.items() if k.startswith("eval/")})
    nan = float("nan")
    lines = [
        f"== grpo-harness: {head} ==",
        f"MLflow run    : {run_id} (FINISHED, {tracker.uri})",
        f"steps         : {plan['step']} (train.steps={cfg.train.steps}); final checkpoint {plan['path']}"
        f" (checkpoint.keep_final={state.get('keep_final', 'full')})",
        f"eval accuracy : {metrics.get('eval/accuracy', nan):.3f}   format rate {metrics.get('eval/format_rate', nan):.3f}"
        f"   train reward (last step) {metrics.get('train/reward_mean', nan):.3f}",
        f"outputs       : {tags.get('output_dir', '?')}",
        f"checkpoints   : {ckpt_dir}",
        *final_weights_line(ckpt_dir),
        "To go on:",
        "  start again  : the same command with resume=never (the checkpoints and run.json move to "
        f"{ckpt_dir}/superseded/<time>/; a new MLflow run), or another checkpoint.dir",
    ]
    if cfg.train.lr_schedule == "constant" and not ckpt.has_model_states(state):
        lines.append(f"  train longer : not from this folder: checkpoint.keep_final={state.get('keep_final')} kept no "
                     "optimizer state; run the job with resume=never checkpoint.keep_final=full to be able to")
    elif cfg.train.lr_schedule == "constant":
        lines.append(f"  train longer : train.steps=<more than {plan['step']}> continues from the final checkpoint "
                     "in the same MLflow run")
    else:
        lines.append(f"  train longer : with train.lr_schedule={cfg.train.lr_schedule} the lr of every step depends "
                     "on train.steps, so another train.steps is another job (its own folder and run)")
    lines.append(f"  the same job : only {', '.join(ALLOWED_TO_DIFFER)} may differ; any other change is another job")
    print(progress.prefixed(credentials.redact("\n".join(lines))), flush=True)
    return float(metrics.get("eval/accuracy", nan))


def venv_command(name: str) -> str:
    """How to call ``name`` (``python``, ``mlflow``) of this interpreter's environment from a fresh
    shell: its path (relative to the working directory when under it, e.g. ``.venv/bin/mlflow``),
    or the bare name when it is what the shell's PATH finds anyway or the environment lacks it."""
    exe = Path(sys.executable)
    path = exe if name == "python" else exe.parent / name
    if not path.exists() or shutil.which(name) == str(path):
        return name
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def next_commands(uri: str) -> list[str]:
    """The summary's last lines: how to look at this run, and how to compare it with others, as
    commands that work in a new shell from any folder (the virtual environment's own ``mlflow`` and
    ``harness-report``, the installed :mod:`analysis.report`; ``python -m analysis.report``, which
    needs the repository root, only where the environment lacks the script, e.g. a source tree on
    ``PYTHONPATH``)."""
    where = f"--tracking-uri {uri}"
    installed = (Path(sys.executable).parent / "harness-report").exists()
    report = venv_command("harness-report") if installed else f"{venv_command('python')} -m analysis.report"
    return [f"look at it    : {venv_command('mlflow')} ui --backend-store-uri {uri}   (then open http://127.0.0.1:5000)",
            f"compare runs  : {report} {where} [--sweep ID --a estimator=grpo --b estimator=rloo]   (-> reports/)"]


def final_weights_line(ckpt_dir: Path) -> list[str]:
    """The summary line naming a finished run's final weights folder (none when it was not kept)."""
    final = Path(ckpt_dir) / ckpt.FINAL_WEIGHTS
    if not final.is_dir():
        return []
    if (final / ADAPTER_CONFIG).is_file():
        return [f"final weights : {final}   (a peft adapter folder: lora=peft lora.adapter_path={final} starts a run "
                "from it on its base model; peft.PeftModel.from_pretrained(base, folder) loads it)"]
    return [f"final weights : {final}   (a model folder: model.name_or_path={final} loads it)"]


def summarize(history: dict, tracker, output_dir: Path, ckpt_dir: Path) -> float:
    """Print before/after accuracy, reward trend and where the outputs are; return final accuracy."""
    steps = sorted(history)
    evals = [(s, history[s]) for s in steps if "eval/accuracy" in history[s]]
    first, last = evals[0][1] if evals else {}, evals[-1][1] if evals else {}
    rewards = [history[s]["train/reward_mean"] for s in steps if "train/reward_mean" in history[s]]
    half = max(1, len(rewards) // 2)
    lines = [
        "== grpo-harness summary ==",
        f"eval accuracy : {first.get('eval/accuracy', float('nan')):.3f} -> {last.get('eval/accuracy', float('nan')):.3f}",
        f"format rate   : {first.get('eval/format_rate', float('nan')):.3f} -> {last.get('eval/format_rate', float('nan')):.3f}",
    ]
    if rewards:
        lines.append(f"train reward  : first half mean {sum(rewards[:half]) / half:.3f}, "
                     f"second half mean {sum(rewards[half:]) / max(1, len(rewards) - half):.3f}")
    lines += [f"MLflow run    : {tracker.run_id} ({tracker.uri})", f"outputs       : {output_dir}",
              f"checkpoints   : {ckpt_dir}", *final_weights_line(ckpt_dir), *next_commands(tracker.uri)]
    print(progress.prefixed(credentials.redact("\n".join(lines))), flush=True)
    return float(last.get("eval/accuracy", float("nan")))
