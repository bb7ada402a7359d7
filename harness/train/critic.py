"""The PPO critic as one component: value model, optimizer, value loss, warm-up, checkpoint state
and metrics (configured under ``critic.*``).

It is built when the advantage estimator declares that it needs values
(``needs=("values",)``, e.g. ``advantage=ppo``), as CleanRL keeps ``Agent.critic`` beside its
value loss. The trainer calls :meth:`Critic.values` before the advantages and
:meth:`Critic.update` in each optimisation pass; nothing else in the trainer knows about it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Optional

import torch

from harness.algo import aggregate_loss, explained_variance, value_loss
from harness.train.distributed import world
from harness.model.logprobs import completion_hidden
from harness.model.lora import trainable_parameters
from harness.model.precision import autocast, compute_dtype, upcast
from harness.train.update import batched_forward, global_normalizers, micro_batches


@dataclass
class CriticConfig:
    """``critic.*``: used when the estimator needs values (``advantage=ppo``)."""

    lr: float = 1e-5  # the critic's own AdamW (betas train.adam_betas, torch's weight decay 0.01)
    vf_coef: float = 0.5  # weight of the value loss
    value_clip: Optional[float] = 0.2  # v_clip = v_old + clip(v - v_old, -c, c); null = unclipped
    warmup_steps: int = 0  # the first N steps update only the critic (policy and lr schedule frozen)
    init: str = "policy"  # policy: a copy of the policy's weights; random: the architecture re-initialised


class ValueModel(torch.nn.Module):
    """A causal LM body with a scalar value head.

    ``values[b, t]`` is V(state before completion token t), read from the same hidden state
    that predicts token t. The head starts at zero, so the first values are 0.
    """

    def __init__(self, lm, share_prefix: bool = False):
        super().__init__()
        self.lm = lm
        self.share_prefix = share_prefix
        # fp32 (a float64 body: float64, so model.dtype=float64 trains the critic in double too)
        self.value_head = torch.nn.Linear(lm.config.hidden_size, 1, dtype=compute_dtype(lm))
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    def forward(self, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
        """``[B, Tp]`` left-padded prompts, ``[B, Tc]`` completions -> ``values [B, Tc]`` float32
        (float64 for a float64 model)."""
        h = completion_hidden(self.lm, prompt_ids, prompt_mask, completion_ids, completion_mask,
                              share_prefix=self.share_prefix)
        return upcast(self.value_head(h).squeeze(-1))


class Critic:
    """Value model + optimizer + value loss + warm-up + state.

    Args:
        settings: its ``critic.*`` node (:class:`CriticConfig`: lr, vf_coef, value_clip,
            warmup_steps).
        model: the :class:`ValueModel` (``train.share_prefix`` is its ``share_prefix``).
        betas, max_grad_norm, precision: ``train.adam_betas``, ``train.max_grad_norm`` and
            ``train.precision``, which apply to it as to the policy.
    """

    def __init__(self, settings: CriticConfig, model: ValueModel, *, betas, max_grad_norm: float, precision: str):
        self.settings, self.model = settings, model.train()
        self.max_grad_norm, self.precision = max_grad_norm, precision
        # lora=peft: the body's adapters and the value head (the body's base weights are frozen)
        self.opt = torch.optim.AdamW(trainable_parameters(model), lr=settings.lr, betas=tuple(betas))

    @classmethod
    def build(cls, cfg, policy, fresh_policy) -> "Critic":
        """A critic whose body copies ``policy`` (``critic.init=policy``) or is ``fresh_policy()``
        re-initialised (``critic.init=random``).

        Raises:
            ValueError: ``critic.init`` is neither.
        """
        if cfg.critic.init not in ("policy", "random"):
            raise ValueError(f"critic.init={cfg.critic.init!r}: expected 'policy' or 'random'")
        if cfg.critic.init == "policy":
            body = copy.deepcopy(policy)
        else:
            body = fresh_policy()
            body.apply(body._init_weights)
        device = next(policy.parameters()).device  # the value head joins the body's device
        model = ValueModel(body, share_prefix=cfg.train.share_prefix).to(device)
        return cls(cfg.critic, model, betas=cfg.train.adam_betas, max_grad_norm=cfg.train.max_grad_norm,
                   precision=cfg.train.precision)

    def in_warmup(self, step: int) -> bool:
        """True while only the critic trains (the first ``critic.warmup_steps`` steps)."""
        return step < self.settings.warmup_steps

    @torch.no_grad()
    def values(self, prompt_ids, prompt_mask, completion_ids, completion_mask, micro_batch_size: int):
        """``[B, Tc]`` values of the rollout batch, without gradients."""
        dev = next(self.model.parameters()).device
        with autocast(self.precision, dev.type):
            return batched_forward(self.model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                   micro_batch_size, self.model.share_prefix, device=dev)

    def update(self, batch, micro_batch_size: int) -> dict:
        """One optimizer step on the clipped value loss (token-mean over the whole batch).

        ``batch``: a :class:`harness.train.update.TrainBatch` with ``old_values`` and ``returns``.
        Returns ``value_loss`` (times ``vf_coef``), ``vf_clip_frac`` and ``explained_variance``
        (of the returns by the values the advantages used, as CleanRL logs it).

        Data-parallel: ``batch`` is this rank's rows; the token count is the global batch's, the
        gradients are summed over ranks before clipping and the statistics are global.
        """
        c = self.settings
        norm = global_normalizers(batch.loss_mask)
        self.opt.zero_grad(set_to_none=True)
        sums = {"value_loss": 0.0, "vf_clip_frac": 0.0}
        dev = next(self.model.parameters()).device
        for _, mb in micro_batches(batch, micro_batch_size, self.model.share_prefix):
            mb = mb.to(dev)  # the batch stays on CPU; each micro-batch visits the critic's device
            mask = mb.loss_mask.float()
            with autocast(self.precision, dev.type):
                v = self.model(mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.present_mask)
            per_token, stats = value_loss(v, mb.old_values, mb.returns, mask, clip_range=c.value_clip)
            loss = c.vf_coef * aggregate_loss(per_token, mask, "token-mean", num_tokens=norm["num_tokens"])
            loss.backward()
            sums["value_loss"] += float(loss.detach())
            sums["vf_clip_frac"] += float(stats["vf_clip_frac"]) * float(mask.sum()) / norm["num_tokens"]
        w = world()
        w.all_reduce_grads(self.model.parameters())
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.opt.step()
        sums = w.sum_dict(sums)
        sums["explained_variance"] = explained_variance(w.gather_rows(batch.old_values), w.gather_rows(batch.returns),
                                                        w.gather_rows(batch.loss_mask))
        return sums

    def state_dict(self) -> dict:
        return {"model": {n: t for n, t in self.model.state_dict().items() if n in self._saved()},
                "optimizer": self.opt.state_dict()}

    def _saved(self) -> set:
        """Names of the state the checkpoint holds: everything, or with a LoRA body (frozen base
        weights) the trainable tensors only (adapters and value head)."""
        trainable = {n for n, p in self.model.named_parameters() if p.requires_grad}
        if len(trainable) == len(list(self.model.parameters())):
            return set(self.model.state_dict())
        return trainable

    def load_state_dict(self, state: dict) -> None:
        saved = self._saved()
        missing = saved - set(state["model"])
        if missing:
            raise RuntimeError(f"critic checkpoint lacks {sorted(missing)[:2]}...: not this run's lora.* config")
        self.model.load_state_dict(state["model"], strict=saved == set(self.model.state_dict()))
        self.opt.load_state_dict(state["optimizer"])
