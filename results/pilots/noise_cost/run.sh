#!/usr/bin/env bash
# The noise-cost pilots of design_card_grid_v2 (what they decide: COMMAND.md). Run from the
# repository root, alone on the machine: two one-thread jobs at a time, as a study runs.
set -euo pipefail
PY=${PY:-.venv/bin/python}
STORE="sqlite:///$PWD/results/pilots/noise_cost/mlflow.db"
BASE=(preset=arith_cpu task.test_size=250 task.eval_size=250 eval.size=250 eval.every=4 eval.batch_size=50
      checkpoint.every=0 rollout.progress=false train.threads=1 rollout=lean advantage=grpo group_size=4,8
      seed=200,201,202,203,204,205 "tracking.uri=$STORE"
      'checkpoint.dir=checkpoints/pilots/noise_cost/${tracking.sweep}/g${group_size}_s${seed}'
      eval.initial_cache=checkpoints/pilots/noise_cost/eval0 hydra/launcher=joblib hydra.launcher.n_jobs=2
      'hydra.sweep.subdir=${hydra.job.num}')
# design A: 4 prompts a step to 16 steps (its evals at 4, 8, 12 and 16 steps are the 4-, 8-, 12- and
# 16-step designs: train.lr_schedule=constant, so step k of a longer run is the k-step run)
"$PY" -m harness.run -m "${BASE[@]}" train.prompts_per_step=4 train.steps=16 tracking.sweep=noise_cost.p4
# design B: 8 prompts a step to 8 steps (evals at 4 and 8 steps)
"$PY" -m harness.run -m "${BASE[@]}" train.prompts_per_step=8 train.steps=8 tracking.sweep=noise_cost.p8
