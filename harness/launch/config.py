"""Structured configs (Hydra ConfigStore) for every knob of a run.

The run's own nodes are declared here; the options of each config group (``task``, ``rollout``,
``advantage``, ...) are the params dataclasses registered beside their tasks, backends and
variants, stored from the registries (:data:`GROUPS`). A misspelt key fails at startup with
Hydra's "Key 'x' not in 'Config'" error. Field names follow the field's
terms: group_size, epsilon (clip), beta (KL coefficient), KL form k1/k2/k3, loss_agg
(verl's ``loss_agg_mode`` names), GAE gamma/lam.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from harness.algo import (ADVANTAGE_TRANSFORMS, ENTROPY_CONTROLLERS, GROUP_FILTERS, LENGTH_PENALTIES, LOSS_AGGREGATIONS,
                          OFFPOLICY_OBJECTIVES, POLICY_LOSSES, ROLLOUT_CORRECTIONS, TOKEN_ESTIMATORS)
from harness.train.critic import CriticConfig  # the critic component's own node (critic.*)
from harness.model.lora import ADAPTERS
from harness.train.rewards import OUTCOME_REWARDS
from harness.rollout import BACKENDS, RolloutConfig
from harness.tasks import TASKS
from harness.tools import TOOLS

# ---------------------------------------------------------------------------- model


@dataclass
class ModelConfig:
    """Policy model. ``name_or_path``: HF hub id, local folder, or ``embedded:smollm2-135m-instruct``."""

    name_or_path: str = "embedded:smollm2-135m-instruct"
    dtype: str = "float32"  # float32 | bfloat16 | float16 | float64 (double end to end: exactness checks)
    # the attention kernels: sdpa (torch's fused kernel) | eager (two matmuls and a softmax in fp32: the same
    # maths; under bf16 on a CPU its forward + backward ran 1.6x faster, docs/benchmarks.md)
    attn_implementation: str = "sdpa"
    gradient_checkpointing: bool = False
    # where the policy, reference and critic train: auto = cuda:<LOCAL_RANK> when CUDA is available, else cpu
    device: str = "auto"
    # Tiny random Llama built from this dict instead of loading weights (tests, smoke runs).
    tiny_config: Optional[dict] = None


# The options of the ``task`` and ``rollout`` groups are the params dataclasses registered beside
# each task (harness/tasks/) and rollout backend (harness/rollout/); ``group_schemas`` reads them.


# ------------------------------------------------------------------------ algorithm
# The advantage estimators' and loss aggregations' params dataclasses live beside their functions
# (harness.algo) and are stored below as the options of the ``advantage`` and ``loss_agg`` groups.


@dataclass
class KLConfig:
    """KL(pi || pi_ref) estimator (Schulman 2020: k1, k2, k3) and where it enters."""

    form: str = "k3"
    controller: str = "fixed"  # fixed: beta throughout | adaptive: beta follows target (Ziegler et al. 2019)
    target: float = 0.1  # adaptive only: the per-token KL beta is steered to (verl kl_ctrl.target_kl)
    horizon: int = 10000  # adaptive only: samples over which beta may change by ~e^0.2 (verl kl_ctrl.horizon)
    # bound on the per-token estimate, [-clamp, clamp] (verl low_var_kl and OpenRLHF clamp to 10;
    # k3 also bounds log r to +-20 first); None = no clamp
    clamp: Optional[float] = None
    placement: str = "loss"  # loss | reward | none
    ref_refresh_steps: int = 0  # copy the policy into the reference every N steps (0 = never)
    # DeepSeek-V3.2's unbiased KL: the estimate times pi_theta / pi_old, gradient through the ratio
    # (TRL use_bias_correction_kl); k1 / k3 only, kl.placement=loss only
    importance_correct: bool = False


@dataclass
class OverlongConfig:
    """DAPO overlong handling (Yu et al. 2025, sec 3.4)."""

    mask_truncated: bool = False  # exclude truncated completions from the loss
    buffer: int = 0  # soft punishment over the last `buffer` tokens (0 = off)
    penalty: float = 1.0


@dataclass
class TrainConfig:
    steps: int = 8
    prompts_per_step: int = 4  # P; the batch is P * group_size completions
    micro_batch_size: int = 8  # completions per forward/backward
    lr: float = 1e-5
    weight_decay: float = 0.0
    adam_betas: list = field(default_factory=lambda: [0.9, 0.99])
    max_grad_norm: float = 1.0
    lr_schedule: str = "constant"  # constant | linear | cosine
    warmup_steps: int = 0
    logprob_chunk: int = 64  # tokens per lm_head chunk (memory: chunk x vocab floats)
    share_prefix: bool = True  # training forwards run each group's prompt once (exact; fewer tokens)
    max_bad_steps: int = 5  # consecutive non-finite steps before stopping
    threads: int = 0  # torch intra-op threads (0 = leave default)
    precision: str = "fp32"  # fp32 | bf16-autocast (fp32 master weights, bf16 matmuls) | auto (measured at startup)
    # none: every rank holds the whole policy | fsdp2: policy and reference sharded over torchrun's ranks
    sharding: str = "none"


@dataclass
class EvalConfig:
    every: int = 4  # steps between evals (0 = only before and after)
    size: Optional[int] = None  # evaluate only the first N of the task's eval set (None = all task.eval_size)
    batch_size: int = 48
    max_new_tokens: Optional[int] = None  # None = rollout.max_new_tokens
    num_samples: int = 0  # k samples per problem for mean@k / pass@k (0 = greedy only)
    temperature: float = 1.0
    log_samples: int = 8  # completions per eval written to the MLflow table
    # a folder: the step-0 eval is stored there and replayed by later runs from the same weights, prompts,
    # configs, code, versions and machine (harness.train.eval_cache; one process only). None = always generate.
    initial_cache: Optional[str] = None


@dataclass
class TrackingConfig:
    uri: Optional[str] = None  # None: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db
    experiment: str = "grpo-harness"
    run_name: Optional[str] = None  # None: <estimator>-G<group_size>-<task>-s<seed>
    sweep: Optional[str] = None  # tag shared by the jobs of one sweep
    system_metrics: bool = False  # sample CPU/memory/GPU use into system/* metrics (MLflow's monitor)
    system_metrics_interval_s: float = 10.0


@dataclass
class CheckpointConfig:
    dir: Optional[str] = None  # None = <hydra output dir>/checkpoints
    every: int = 4  # steps between checkpoints (0 = only at the end)
    keep: int = 1  # checkpoints kept on disk while the run goes on (0 = all)
    # what a finished run keeps besides its finished marker: weights (the final policy in <dir>/final/: the
    # model as safetensors, or with lora=peft peft's adapter folder) | merged (lora=peft only: the merged model
    # W + (alpha / r) B A in <dir>/final/, loadable without peft) | full (the final checkpoint with optimizer
    # state: needed to train longer) | none
    keep_final: str = "weights"


@dataclass
class Config:
    """A whole run. Top-level keys are the ablation knobs named in the papers."""

    task: Any = MISSING  # a TASKS params node: task=gsm8k, math, arith
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: Any = MISSING  # an ADAPTERS params node: lora=none (full fine-tuning) | peft (LoRA adapters)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    tools: Any = MISSING  # a TOOLS params node: tools=none (single-turn) | calculator | search (episode rollouts)
    advantage: Any = MISSING
    # an ADVANTAGE_TRANSFORMS params node: none | clip_below (advantages below a floor raised to it)
    advantage_transform: Any = MISSING
    seed: int = 0
    group_size: int = 8  # G: completions per prompt
    # an OUTCOME_REWARDS params node: the outcome reward of each completion: verifier (the task's verifier) |
    # random (Bernoulli(p), ignores the answer: a negative control)
    reward: Any = MISSING
    policy_loss: Any = MISSING  # a POLICY_LOSSES params node: policy_loss=ppo_clip, gspo, cispo, ...
    group_filter: Any = MISSING  # a GROUP_FILTERS params node: group_filter=none | dapo (dynamic sampling)
    length_penalty: Any = MISSING  # a LENGTH_PENALTIES params node: length_penalty=none | linear (prime-rl)
    # a ROLLOUT_CORRECTIONS params node: none | token_truncate | token_mask | sequence_truncate | sequence_mask
    rollout_correction: Any = MISSING
    # an OFFPOLICY_OBJECTIVES params node: the objective under stale rollouts (rollout.staleness):
    # behaviour (ratio against the sampling weights) | decoupled (AReaL: ratio against the proximal policy)
    offpolicy: Any = MISSING
    top_entropy_quantile: float = 1.0  # keep the policy loss on the top q of tokens by entropy (1 = all)
    beta: float = 0.04  # KL coefficient
    kl: KLConfig = field(default_factory=KLConfig)
    loss_agg: Any = MISSING  # a LOSS_AGGREGATIONS params node: loss_agg=token-mean, ...
    entropy_coef: float = 0.0
    entropy_control: Any = MISSING  # an ENTROPY_CONTROLLERS params node: fixed | adaptive (Skywork-OR1, TRL)
    mu: int = 1  # policy iterations per rollout batch
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)  # read only when the estimator needs values
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    # None: a finished job is reported, a killed one resumed; "auto": the same, but a checkpoint must exist;
    # "never": start the job again (old checkpoints moved to <checkpoint dir>/superseded/); a file/folder: resume it
    resume: Optional[str] = None
    output_dir: Optional[str] = None  # None = Hydra's job output dir


# config group -> the registry whose params dataclasses are its options
GROUPS = {"task": TASKS, "advantage": TOKEN_ESTIMATORS, "advantage_transform": ADVANTAGE_TRANSFORMS, "policy_loss": POLICY_LOSSES, "loss_agg": LOSS_AGGREGATIONS,
          "group_filter": GROUP_FILTERS, "rollout": BACKENDS, "rollout_correction": ROLLOUT_CORRECTIONS,
          "length_penalty": LENGTH_PENALTIES, "entropy_control": ENTROPY_CONTROLLERS,
          "offpolicy": OFFPOLICY_OBJECTIVES, "lora": ADAPTERS, "tools": TOOLS, "reward": OUTCOME_REWARDS}


def group_schemas() -> dict:
    """``{group: {option: dataclass}}`` for every config group whose options are schemas.

    Every option comes from a registry (:data:`GROUPS`), so a registered task, backend or
    variant is selectable (``task=<name>``, ``advantage=<name>``) without a yaml file.
    """
    return {group: dict(registry.schemas()) for group, registry in GROUPS.items()}


def register_configs() -> None:
    """Store every schema in Hydra's ConfigStore.

    ``config_schema`` is the root; each option of the groups in :data:`GROUPS` is stored under its
    own name, so ``advantage=rloo`` selects the RLOO params node directly (its defaults are the
    dataclass's). The model presets in ``conf/model/`` are merged into the root's ``model`` node
    (:class:`ModelConfig`), which checks their keys.
    """
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    for group, options in group_schemas().items():
        for name, node in options.items():
            cs.store(group=group, name=name, node=node)
