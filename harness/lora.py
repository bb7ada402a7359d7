"""What the optimizer trains: the whole policy (``lora=none``) or LoRA adapters (``lora=peft``).

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", arXiv:2106.09685)
replaces each target linear ``y = W x`` by ``y = W x + (alpha / r) * B A dropout(x)`` with
``A: [r, in]`` (Kaiming-uniform), ``B: [out, r]`` (zeros, so the adapted model starts as the base
model) and ``W`` frozen. The layers are peft's (``peft.get_peft_model``); they are injected into
the loaded ``*ForCausalLM`` in place, so the policy stays the same module type (its
``get_decoder`` / ``get_output_embeddings``, which :mod:`harness.logprobs` calls, are unchanged).

The option is a registered class with its params dataclass (``lora=<name>``, :data:`ADAPTERS`);
it answers the trainer's questions without the trainer naming a variant:

* :meth:`FullFineTuning.apply`: the model to train (after loading);
* :meth:`FullFineTuning.reference`: the KL reference: a frozen copy of the policy for full
  fine-tuning, the policy itself with its adapters off (peft's ``disable_adapter()``) for LoRA:
  no second copy of the weights;
* :meth:`FullFineTuning.trainable_state` / :meth:`FullFineTuning.load_trainable_state`: what a
  checkpoint holds (the adapters only, for LoRA);
* :func:`base_state_dict`: the weights in the base model's names, adapters merged or not (weight
  sync into vLLM, the final weights, the provenance digest).

Option name ``peft``: it names the implementation the option runs (peft's LoRA layers), as the
rollout backends are named ``hf`` / ``vllm``; another adapter implementation would be another
option beside it.
"""

from __future__ import annotations

import contextlib
import copy
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator, List

import torch

from harness.registry import Registry

ADAPTERS: Registry = Registry("lora")

ADAPTER_NAME = "default"  # peft's name for a model's single adapter


def trainable_parameters(model: torch.nn.Module) -> List[torch.nn.Parameter]:
    """The parameters the optimizer steps (``requires_grad``), in ``model.parameters()`` order."""
    return [p for p in model.parameters() if p.requires_grad]


def trainable_fraction(model: torch.nn.Module) -> float:
    """``perf/trainable_param_frac``: trainable elements / all elements of ``model`` (1.0 for full
    fine-tuning; for LoRA the base weights count in the denominator)."""
    total = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for p in trainable_parameters(model)) / max(total, 1)


def _lora_layers(model: torch.nn.Module):
    """``(name, peft LoRA layer)`` pairs of ``model`` (none for a model without adapters)."""
    if "peft" not in sys.modules:  # never imported: no module can be a peft layer (and no 5 s import)
        return []
    from peft.tuners.tuners_utils import BaseTunerLayer  # lazy: importing peft takes ~5 s; only lora=peft needs it

    return [(n, m) for n, m in model.named_modules() if isinstance(m, BaseTunerLayer)]


def base_state_dict(model: torch.nn.Module, merged: bool = True) -> dict:
    """``model``'s state dict in the base model's names (``...q_proj.weight``), without mutating it.

    For a model with peft LoRA layers, the adapter tensors are dropped and each wrapped layer's
    ``base_layer.weight`` is renamed to ``weight``; with ``merged`` it becomes
    ``W + scaling * B @ A`` (peft's ``get_delta_weight``, which already holds the scaling and the
    fan-in/fan-out transpose). A model without adapters: its own ``state_dict()``.

    Returns: ``{name: tensor}`` detached (merged weights are new tensors; the others are the
        module's own storage).
    """
    layers = dict(_lora_layers(model))
    sd = model.state_dict()
    if not layers:
        return sd
    out = {}
    for k, v in sd.items():
        if ".lora_" in k:
            continue
        out[k.replace(".base_layer.", ".")] = v.detach()
    if merged:
        with torch.no_grad():
            for name, layer in layers.items():
                if ADAPTER_NAME in getattr(layer, "lora_A", {}):
                    key = f"{name}.weight"
                    out[key] = out[key] + layer.get_delta_weight(ADAPTER_NAME).to(out[key].dtype)
    return out


@dataclass
class NoLoraConfig:
    """``lora=none``: full fine-tuning; every parameter of the policy trains."""

    name: str = "none"


@ADAPTERS.register("none", params=NoLoraConfig)
class FullFineTuning:
    """Every weight trains; the reference is a frozen copy; checkpoints hold the whole policy."""

    def __init__(self, params: Any = None):
        self.params = params

    def apply(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model to train: ``model`` itself."""
        return model

    def reference(self, policy: torch.nn.Module) -> torch.nn.Module:
        """A frozen deep copy of ``policy`` (eval mode, no gradients): the KL reference's weights."""
        return copy.deepcopy(policy).eval().requires_grad_(False)

    def reference_mode(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """The context the reference's forwards run in (nothing to switch here)."""
        return contextlib.nullcontext()

    def trainable_state(self, model: torch.nn.Module) -> dict:
        """What a checkpoint holds of ``model``: its whole state dict."""
        return model.state_dict()

    def load_trainable_state(self, model: torch.nn.Module, state: dict) -> None:
        """Load :meth:`trainable_state` (strict)."""
        model.load_state_dict(state)


@dataclass
class LoraConfig:
    """``lora=peft``: LoRA adapters (peft) on ``target_modules``; the base weights are frozen.

    Defaults follow verl (``lora_alpha: 16``, ``target_modules: all-linear``, which on a Llama-style
    model is these seven projections, the LM head excluded) and peft's ``LoraConfig`` (``r=8``,
    ``lora_dropout=0.0``).
    """

    name: str = "peft"
    r: int = 8  # rank of B A (peft r, verl lora_rank)
    alpha: float = 16.0  # the update is scaled by alpha / r (peft lora_alpha)
    dropout: float = 0.0  # dropout on the adapter's input in training forwards (peft lora_dropout)
    target_modules: list = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                                          "gate_proj", "up_proj", "down_proj"])


@ADAPTERS.register("peft", params=LoraConfig)
class PeftLora(FullFineTuning):
    """peft LoRA layers injected into the policy; the reference is the policy with adapters off."""

    def apply(self, model: torch.nn.Module) -> torch.nn.Module:
        """Inject LoRA layers into ``model`` in place (peft ``get_peft_model``) and return ``model``:
        only the adapters require gradients. ``A`` is drawn from torch's global RNG (seeded run:
        the same adapters every time); ``B`` is zero.

        Raises:
            ValueError: a ``target_modules`` entry matching no module of ``model`` (peft's message).
        """
        import peft  # lazy: importing peft takes ~5 s (measured here) and only lora=peft needs it

        p = self.params
        config = peft.LoraConfig(r=int(p.r), lora_alpha=float(p.alpha), lora_dropout=float(p.dropout),
                                 target_modules=list(p.target_modules), bias="none")
        wrapper = peft.get_peft_model(model, config, adapter_name=ADAPTER_NAME)
        # the PeftModel is kept beside the module (a deep copy, e.g. the critic's body, copies it
        # with its own module): reference_mode uses its disable_adapter()
        model.__dict__["_harness_peft"] = wrapper
        if getattr(model, "is_gradient_checkpointing", False):
            model.enable_input_require_grads()  # frozen embeddings: checkpointed blocks need an input grad
        return model

    def reference(self, policy: torch.nn.Module) -> torch.nn.Module:
        """The policy itself: its forwards in :meth:`reference_mode` are the base model's."""
        return policy

    @contextlib.contextmanager
    def reference_mode(self, model: torch.nn.Module) -> Iterator[None]:
        """Within the block, ``model``'s adapters are off (peft ``disable_adapter()``): its
        forwards are exactly the base model's (each wrapped layer returns ``base_layer(x)``).
        ``model`` None (no reference: nothing declared a need for one): nothing to switch."""
        if model is None:
            yield
            return
        with model.__dict__["_harness_peft"].disable_adapter():
            yield

    def trainable_state(self, model: torch.nn.Module) -> dict:
        """The adapter tensors only (``requires_grad`` parameters, by name)."""
        return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}

    def load_trainable_state(self, model: torch.nn.Module, state: dict) -> None:
        """Load the adapter tensors of :meth:`trainable_state`.

        Raises:
            RuntimeError: the names differ from ``model``'s trainable parameters (another
                ``lora.target_modules``, or a full fine-tuning checkpoint).
        """
        want = {n for n, p in model.named_parameters() if p.requires_grad}
        if set(state) != want:
            raise RuntimeError(f"checkpoint holds {len(state)} tensors, the adapters are {len(want)} "
                               f"(e.g. missing {sorted(want - set(state))[:2]}, unexpected "
                               f"{sorted(set(state) - want)[:2]}): not this run's lora.* config")
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert not unexpected, unexpected


def build_adapters(node) -> FullFineTuning:
    """The ``lora`` option for ``node`` (the ``lora`` config node, a mapping or None = ``none``)."""
    name = "none" if node is None else node.get("name", "none")
    entry = ADAPTERS.spec(name)
    return entry.fn(entry.build(node))
