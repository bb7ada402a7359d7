"""What the optimizer trains: the whole policy (``lora=none``) or LoRA adapters (``lora=peft``).

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", arXiv:2106.09685)
replaces each target linear ``y = W x`` by ``y = W x + (alpha / r) * B A dropout(x)`` with
``A: [r, in]`` (Kaiming-uniform), ``B: [out, r]`` (zeros, so the adapted model starts as the base
model) and ``W`` frozen. The layers are peft's (``peft.get_peft_model``); they are injected into
the loaded ``*ForCausalLM`` in place, so the policy stays the same module type (its
``get_decoder`` / ``get_output_embeddings``, which :mod:`harness.model.logprobs` calls, are unchanged).

The option is a registered class with its params dataclass (``lora=<name>``, :data:`ADAPTERS`);
it answers the trainer's questions without the trainer naming a variant:

* :meth:`FullFineTuning.apply`: the model to train (after loading);
* :meth:`FullFineTuning.reference`: the KL reference: a frozen copy of the policy for full
  fine-tuning, the policy itself with its adapters off (peft's ``disable_adapter()``) for LoRA:
  no second copy of the weights;
* :meth:`FullFineTuning.trainable_state` / :meth:`FullFineTuning.load_trainable_state`: what a
  checkpoint holds (the adapters only, for LoRA);
* :meth:`FullFineTuning.save_final`: what a finished run keeps as ``<checkpoint dir>/final/``
  (``checkpoint.keep_final=weights``: the whole model, or for LoRA peft's adapter folder;
  ``merged``: for LoRA, the merged model);
* :func:`base_state_dict`: the weights in the base model's names, adapters merged or not (weight
  sync into vLLM, the merged final weights, the provenance digest).

A LoRA run can start from an adapter folder (``lora.adapter_path``, peft's
``PeftModel.from_pretrained(base, folder, is_trainable=True)``); the folder a harness run keeps
records the digest of the base weights it was trained on (:data:`BASE_RECORD`), and loading it
onto other base weights is refused.

Option name ``peft``: it names the implementation the option runs (peft's LoRA layers), as the
rollout backends are named ``hf`` / ``vllm``; another adapter implementation would be another
option beside it.
"""

from __future__ import annotations

import contextlib
import copy
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, List, Optional

import torch

from harness.model.digest import tensors_sha256
from harness.registry import Registry

ADAPTERS: Registry = Registry("lora")

ADAPTER_NAME = "default"  # peft's name for a model's single adapter
ADAPTER_CONFIG = "adapter_config.json"  # peft's config file of an adapter folder
BASE_RECORD = "base_weights.json"
"""The file of a kept adapter folder that names the base weights it was trained on:
``{"model": model.name_or_path, "dtype": ..., "sha256": base_weights_sha256(...)}``."""


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


def base_weights_sha256(model: torch.nn.Module, dtype: Optional[torch.dtype] = None) -> str:
    """sha256 (:func:`harness.model.digest.tensors_sha256`) of ``model``'s base weights (unmerged, the base
    model's names), floating tensors cast to ``dtype`` first (None: as they are). Casting makes a
    float32 base and its float64 or bfloat16 load comparable: the cast of the loaded weights equals
    the weights loaded in that dtype (both round to nearest)."""
    sd = base_state_dict(model, merged=False)
    if dtype is not None:
        sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}
    return tensors_sha256(sd)


def read_adapter_config(folder: str) -> dict:
    """The ``adapter_config.json`` of the adapter folder ``folder`` (``lora.adapter_path``).

    Raises:
        ValueError: no such folder, no ``adapter_config.json`` in it, or not valid JSON.
    """
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise ValueError(f"lora.adapter_path={folder!r}: no such folder; expected a peft adapter folder "
                         f"({ADAPTER_CONFIG} and adapter_model.safetensors, e.g. a lora=peft run's <checkpoint dir>/final)")
    if not (path / ADAPTER_CONFIG).is_file():
        raise ValueError(f"lora.adapter_path={folder!r}: the folder has no {ADAPTER_CONFIG}; expected a peft adapter "
                         f"folder (a lora=peft run's <checkpoint dir>/final kept with checkpoint.keep_final=weights; "
                         f"a folder kept with keep_final=merged is a whole model: pass it as model.name_or_path)")
    try:
        return json.loads((path / ADAPTER_CONFIG).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"lora.adapter_path={folder!r}: {ADAPTER_CONFIG} is not valid JSON: {e}") from None


def check_base(folder: str, model: torch.nn.Module) -> None:
    """Refuse to load the adapter folder ``folder`` onto ``model`` (the base, before adapters)
    when its :data:`BASE_RECORD` names other base weights. A folder without the record (written by
    peft elsewhere) is checked by peft's load only: the module names and shapes must fit.

    Raises:
        ValueError: the digests differ (naming both base models).
    """
    record_file = Path(folder).expanduser() / BASE_RECORD
    if not record_file.is_file():
        return
    record = json.loads(record_file.read_text())
    got = base_weights_sha256(model, getattr(torch, record["dtype"]))
    if got != record["sha256"]:
        raise ValueError(f"lora.adapter_path={folder!r} was trained on the base {record['model']!r} (base weights "
                         f"sha256 {record['sha256'][:12]}... in {record['dtype']}); the base loaded from "
                         f"model.name_or_path has {got[:12]}...: another model, or another seed of a tiny random "
                         "model. Set model.name_or_path (and for model=tiny, seed) to the base the adapter was trained on")


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

    def save_final(self, folder: Path, model: torch.nn.Module, keep_final: str, state: Optional[dict] = None,
                   base_name: str = "") -> None:
        """Write the finished policy into the empty folder ``folder`` as a Hugging Face model folder
        (``model.safetensors``, ``config.json``) that ``model.name_or_path`` loads.

        Args:
            keep_final: ``weights`` (``merged`` is refused for full fine-tuning by :mod:`harness.launch.validate`).
            state: the whole state dict when already gathered (sharded policy); None: ``model``'s own.
            base_name: unused here (the adapter folder records it).
        """
        model.save_pretrained(folder, state_dict=state if state is not None else model.state_dict(),
                              safe_serialization=True)


@dataclass
class LoraConfig:
    """``lora=peft``: LoRA adapters (peft) on ``target_modules``; the base weights are frozen.

    Defaults follow verl (``lora_alpha: 16``, ``target_modules: all-linear``, which on a Llama-style
    model is these seven projections, the LM head excluded) and peft's ``LoraConfig`` (``r=8``,
    ``lora_dropout=0.0``).

    A finished run keeps peft's adapter folder (``checkpoint.keep_final=weights``, the default) or
    the merged model (``checkpoint.keep_final=merged``) in ``<checkpoint dir>/final/``;
    ``adapter_path`` starts a run from such an adapter folder (docs/lora.md, "What a finished run
    keeps").
    """

    name: str = "peft"
    # start from this peft adapter folder instead of fresh adapters (peft PeftModel.from_pretrained(base,
    # folder, is_trainable=True); verl lora_adapter_path); r, alpha, dropout and target_modules must equal its
    # adapter_config.json's; the base is model.name_or_path. None: fresh adapters (B = 0)
    adapter_path: Optional[str] = None
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
        the same adapters every time); ``B`` is zero. With ``lora.adapter_path``: the folder's
        adapters instead (:meth:`_load`).

        Raises:
            ValueError: a ``target_modules`` entry matching no module of ``model`` (peft's message);
                an adapter folder that cannot be loaded onto ``model`` (:meth:`_load`).
        """
        import peft  # lazy: importing peft takes ~5 s (measured here) and only lora=peft needs it

        p = self.params
        if p.adapter_path:
            wrapper = self._load(model, str(p.adapter_path))
        else:
            config = peft.LoraConfig(r=int(p.r), lora_alpha=float(p.alpha), lora_dropout=float(p.dropout),
                                     target_modules=list(p.target_modules), bias="none")
            wrapper = peft.get_peft_model(model, config, adapter_name=ADAPTER_NAME)
        # the PeftModel is kept beside the module (a deep copy, e.g. the critic's body, copies it
        # with its own module): reference_mode uses its disable_adapter()
        model.__dict__["_harness_peft"] = wrapper
        if getattr(model, "is_gradient_checkpointing", False):
            model.enable_input_require_grads()  # frozen embeddings: checkpointed blocks need an input grad
        return model

    @staticmethod
    def _load(model: torch.nn.Module, folder: str):
        """peft's ``PeftModel.from_pretrained(model, folder, is_trainable=True)``: the adapter
        folder's layers injected into ``model`` in place, its tensors loaded, trainable.

        Raises:
            ValueError: the folder's base record names other base weights (:func:`check_base`), or
                peft cannot load it onto ``model`` (module names or shapes differ).
        """
        import peft  # lazy: see apply

        read_adapter_config(folder)
        check_base(folder, model)
        try:
            return peft.PeftModel.from_pretrained(model, str(Path(folder).expanduser()), adapter_name=ADAPTER_NAME,
                                                  is_trainable=True)
        except (RuntimeError, ValueError, KeyError) as e:
            raise ValueError(f"lora.adapter_path={folder!r}: peft cannot load it onto the base from model.name_or_path "
                             f"(another architecture or size?): {e}") from e

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

    def save_final(self, folder: Path, model: torch.nn.Module, keep_final: str, state: Optional[dict] = None,
                   base_name: str = "") -> None:
        """Write the finished policy into the empty folder ``folder``.

        ``keep_final=weights``: peft's adapter folder (``PeftModel.save_pretrained``:
        ``adapter_config.json``, ``adapter_model.safetensors``, peft's ``README.md``) plus
        :data:`BASE_RECORD` (``base_name``: ``model.name_or_path``); ``peft.PeftModel.from_pretrained``
        or ``lora.adapter_path`` loads it onto the base. ``merged``: a Hugging Face model folder of the
        merged weights ``W + (alpha / r) B A`` in the base model's names (:func:`base_state_dict`),
        loadable without peft. ``state`` is unused (a LoRA policy is never sharded).
        """
        if keep_final == "merged":
            model.save_pretrained(folder, state_dict=base_state_dict(model), safe_serialization=True)
            return
        model.__dict__["_harness_peft"].save_pretrained(str(folder), safe_serialization=True)
        dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
        record = {"model": base_name, "dtype": str(dtype).removeprefix("torch."),
                  "sha256": base_weights_sha256(model)}
        (Path(folder) / BASE_RECORD).write_text(json.dumps(record, indent=1) + "\n")


def build_adapters(node) -> FullFineTuning:
    """The ``lora`` option for ``node`` (the ``lora`` config node, a mapping or None = ``none``)."""
    name = "none" if node is None else node.get("name", "none")
    entry = ADAPTERS.spec(name)
    return entry.fn(entry.build(node))
