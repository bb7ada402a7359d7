"""Structured configs (Hydra ConfigStore) for every knob of a run.

Each yaml group in ``conf/`` names one of the schemas stored here, so a misspelt key fails
at startup with Hydra's "Key 'x' not in 'Config'" error. Field names follow the field's
terms: group_size, epsilon (clip), beta (KL coefficient), KL form k1/k2/k3, loss_agg
(verl's ``loss_agg_mode`` names), GAE gamma/lam.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

# ---------------------------------------------------------------------------- model


@dataclass
class ModelConfig:
    """Policy model. ``name_or_path``: HF hub id, local folder, or ``embedded:smollm2-135m-instruct``."""

    name_or_path: str = "embedded:smollm2-135m-instruct"
    dtype: str = "float32"  # float32 | bfloat16 | float16
    gradient_checkpointing: bool = False
    # Tiny random Llama built from this dict instead of loading weights (tests, smoke runs).
    tiny_config: Optional[dict] = None


# ----------------------------------------------------------------------------- task


@dataclass
class TaskConfig:
    """Fields every task has. ``eval_size`` problems are drawn once with ``eval_seed``."""

    name: str = MISSING
    eval_size: int = 50
    eval_seed: int = 1234
    train_size: Optional[int] = None  # cap on training problems (None = all)
    num_shots: int = 2  # worked examples prepended as chat turns (0 = zero-shot)
    system_prompt: Optional[str] = None
    instruction: str = "{question}"
    format_reward: float = 0.0  # weight of the answer-format reward component
    strict: bool = False  # malformed rows: error naming file:line (True) or skip + count (False)


@dataclass
class GSM8KTaskConfig(TaskConfig):
    name: str = "gsm8k"
    data_dir: Optional[str] = None  # folder with train.jsonl/test.jsonl; None = HF hub openai/gsm8k
    hub_id: str = "openai/gsm8k"
    hub_config: str = "main"


@dataclass
class MathTaskConfig(TaskConfig):
    name: str = "math"
    data_dir: Optional[str] = None  # folder with train.jsonl/math500_test.jsonl; None = HF hub
    hub_train_id: str = "EleutherAI/hendrycks_math"
    hub_eval_id: str = "HuggingFaceH4/MATH-500"
    levels: Optional[list] = None  # e.g. [1, 2]
    subjects: Optional[list] = None  # e.g. [Algebra, Prealgebra]
    verify_timeout_s: float = 5.0
    verify_workers: int = 2


@dataclass
class ArithTaskConfig(TaskConfig):
    name: str = "arith"
    digits: int = 2  # operand digits
    num_ops: int = 1  # operations per problem
    operators: list = field(default_factory=lambda: ["+", "-"])
    distractors: int = 0  # irrelevant sentences with numbers
    test_size: int = 200
    seed: int = 0


# --------------------------------------------------------------------------- rollout


@dataclass
class RolloutConfig:
    """Sampling for training rollouts. ``batch_size``: sequences per ``generate`` call (0 = all)."""

    backend: str = "hf"
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 128
    batch_size: int = 0
    progress: bool = True
    share_prefix: bool = True  # prefill each distinct prompt once, copy its KV cache to the group


# ------------------------------------------------------------------------ algorithm


@dataclass
class AdvantageConfig:
    """Estimator name plus its keyword parameters (passed to the registered function)."""

    name: str = MISSING


@dataclass
class GRPOAdvantageConfig(AdvantageConfig):
    name: str = "grpo"
    eps: float = 1e-6
    scale: str = "group"  # group | batch | none
    unbiased: bool = True


@dataclass
class MeanOnlyAdvantageConfig(AdvantageConfig):
    name: str = "mean_only"


@dataclass
class RLOOAdvantageConfig(AdvantageConfig):
    name: str = "rloo"


@dataclass
class ReinforceAdvantageConfig(AdvantageConfig):
    name: str = "reinforce"
    baseline: str = "batch_mean"  # none | batch_mean | ema
    ema_decay: float = 0.9


@dataclass
class ReinforcePPAdvantageConfig(AdvantageConfig):
    name: str = "reinforce_pp"
    gamma: float = 1.0


@dataclass
class PPOAdvantageConfig(AdvantageConfig):
    """PPO with a learned critic and GAE. gamma=1.0: rewards are episodic and undiscounted
    (the outcome reward sits on the last token); lam=0.95 trades bias for variance as in
    the GAE paper and verl/OpenRLHF defaults."""

    name: str = "ppo"
    gamma: float = 1.0
    lam: float = 0.95
    whiten: bool = True
    vf_coef: float = 0.5
    critic_lr: float = 1e-5
    value_clip: float = 0.2
    critic_warmup_steps: int = 0
    critic_init: str = "policy"  # policy (copy the policy's weights) | random


@dataclass
class ProcessAdvantageConfig(AdvantageConfig):
    name: str = "process"
    eps: float = 1e-6


@dataclass
class KLConfig:
    """KL(pi || pi_ref) estimator (Schulman 2020: k1, k2, k3) and where it enters."""

    form: str = "k3"
    placement: str = "loss"  # loss | reward | none
    ref_refresh_steps: int = 0  # copy the policy into the reference every N steps (0 = never)


@dataclass
class OverlongConfig:
    """DAPO overlong handling (Yu et al. 2025, sec 3.4)."""

    mask_truncated: bool = False  # exclude truncated completions from the loss
    buffer: int = 0  # soft punishment over the last `buffer` tokens (0 = off)
    penalty: float = 1.0


@dataclass
class TrainConfig:
    steps: int = 20
    prompts_per_step: int = 4  # P; the batch is P * group_size completions
    micro_batch_size: int = 8  # completions per forward/backward
    lr: float = 1e-6
    weight_decay: float = 0.0
    adam_betas: list = field(default_factory=lambda: [0.9, 0.99])
    max_grad_norm: float = 1.0
    lr_schedule: str = "constant"  # constant | linear | cosine
    warmup_steps: int = 0
    dynamic_sampling: bool = False  # DAPO: drop groups with equal rewards, resample
    dynamic_sampling_max_rounds: int = 3
    logprob_chunk: int = 64  # tokens per lm_head chunk (memory: chunk x vocab floats)
    share_prefix: bool = True  # training forwards run each group's prompt once (exact; fewer tokens)
    max_bad_steps: int = 5  # consecutive non-finite steps before stopping
    threads: int = 0  # torch intra-op threads (0 = leave default)


@dataclass
class EvalConfig:
    every: int = 10  # steps between evals (0 = only before and after)
    size: Optional[int] = None  # override task.eval_size
    batch_size: int = 64
    max_new_tokens: Optional[int] = None  # None = rollout.max_new_tokens
    num_samples: int = 0  # k samples per problem for mean@k / pass@k (0 = greedy only)
    temperature: float = 1.0
    log_samples: int = 8  # completions per eval written to the MLflow table


@dataclass
class TrackingConfig:
    uri: Optional[str] = None  # None: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db
    experiment: str = "grpo-harness"
    run_name: Optional[str] = None
    sweep: Optional[str] = None  # tag shared by the jobs of one sweep


@dataclass
class CheckpointConfig:
    dir: Optional[str] = None  # None = <hydra output dir>/checkpoints
    every: int = 0  # steps between checkpoints (0 = only at the end)
    keep: int = 2


@dataclass
class Config:
    """A whole run. Top-level keys are the ablation knobs named in the papers."""

    task: Any = MISSING
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    advantage: Any = MISSING
    seed: int = 0
    group_size: int = 8  # G: completions per prompt
    epsilon: float = 0.2  # PPO clip range (low side; also high unless epsilon_high)
    epsilon_high: Optional[float] = None  # DAPO clip-higher
    dual_clip: Optional[float] = None  # dual-clip constant c > 1 (Ye et al. 2020)
    ratio_level: str = "token"  # token | sequence (GSPO)
    beta: float = 0.04  # KL coefficient
    kl: KLConfig = field(default_factory=KLConfig)
    loss_agg: str = "token-mean"
    loss_agg_constant: Optional[float] = None  # seq-mean-token-sum-norm divisor (None = max_new_tokens)
    entropy_coef: float = 0.0
    mu: int = 1  # policy iterations per rollout batch
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    resume: Optional[str] = None  # checkpoint folder, or "auto" = the run's own latest
    output_dir: Optional[str] = None  # None = Hydra's job output dir


def register_configs() -> None:
    """Store every schema so ``conf/`` yaml files can extend them via their defaults list."""
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    for name, node in {
        "gsm8k": GSM8KTaskConfig,
        "math": MathTaskConfig,
        "arith": ArithTaskConfig,
    }.items():
        cs.store(group="task", name=f"{name}_schema", node=node)
    for name, node in {
        "grpo": GRPOAdvantageConfig,
        "mean_only": MeanOnlyAdvantageConfig,
        "rloo": RLOOAdvantageConfig,
        "reinforce": ReinforceAdvantageConfig,
        "reinforce_pp": ReinforcePPAdvantageConfig,
        "ppo": PPOAdvantageConfig,
        "process": ProcessAdvantageConfig,
    }.items():
        cs.store(group="advantage", name=f"{name}_schema", node=node)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="rollout", name="rollout_schema", node=RolloutConfig)
