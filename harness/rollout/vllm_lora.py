"""Adapter-only weight sync into vLLM for ``lora=peft`` (``rollout=vllm rollout.lora_sync=adapter``).

The engine holds the frozen base weights and serves LoRA (``enable_lora``); after each update
:meth:`AdapterSync.sync` writes the policy's adapter tensors (peft's file layout:
``adapter_model.safetensors`` + ``adapter_config.json``) to a new folder and registers them as a
new adapter version, a :class:`vllm.lora.request.LoRARequest` with a fresh integer id (1, 2, ...),
which every later ``generate`` passes; the previous version is removed from the engine and from
disk. Only the adapters travel (``r (in + out)`` values per target, 1.8% of SmolLM2-135M at
``r=8``), not the merged weights.

The convention follows TRL's adapter-only sync (huggingface/trl PR #7017: a new adapter per
policy version, served by name) and vLLM's documented LoRA route (``LLM(..., enable_lora=True,
max_lora_rank=...)`` and ``generate(..., lora_request=...)``). vLLM 0.32 has no tensor-based
``LoRARequest`` (it reads the adapter from ``lora_path``), so the folder is the transport; a new
id per version (rather than ``load_inplace``) also keeps prefix-cache entries of one version away
from the next (vLLM keys cached blocks by the adapter).

vLLM computes ``y = W x + (alpha / r) B A x`` from the adapter config (``lora_alpha``, ``r``,
``use_rslora``) with ``A`` and ``B`` zero-padded to ``max_lora_rank``, one of vLLM's allowed ranks
(:data:`ENGINE_RANKS`): the same function as peft's layer in eval mode (no dropout).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from harness.model.lora import ADAPTER_NAME

ENGINE_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM 0.32 config/lora.py MaxLoRARanks


def engine_rank(r: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds rank ``r`` (vLLM pads with zeros).

    Raises:
        ValueError: ``r`` > 512, vLLM's largest LoRA rank.
    """
    for rank in ENGINE_RANKS:
        if r <= rank:
            return rank
    raise ValueError(f"lora.r={r}: vLLM serves LoRA ranks up to {ENGINE_RANKS[-1]}; "
                     "use rollout.lora_sync=merged")


def peft_wrapper(model: torch.nn.Module):
    """The peft ``PeftModel`` that :meth:`harness.model.lora.PeftLora.apply` keeps beside ``model``.

    Raises:
        ValueError: ``model`` has no peft adapters (``lora=none``).
    """
    wrapper = model.__dict__.get("_harness_peft")
    if wrapper is None:
        raise ValueError("rollout.lora_sync=adapter needs a policy with LoRA adapters (lora=peft)")
    return wrapper


def adapter_tensors(model: torch.nn.Module) -> dict:
    """``model``'s adapter tensors in peft's saved names (``base_model.model.<module>.lora_A.weight``,
    the layout ``peft.PeftModel.save_pretrained`` writes and vLLM's LoRA loader parses).

    Returns: ``{name: tensor}``, detached, contiguous (``lora_A``: ``[r, in]``, ``lora_B``: ``[out, r]``).
    """
    out = {}
    for n, p in model.named_parameters():
        if ".lora_" in n:
            out["base_model.model." + n.replace(f".{ADAPTER_NAME}.", ".")] = p.detach().contiguous()
    return out


class AdapterSync:
    """The adapter versions one vLLM engine serves.

    Args:
        model: the LoRA policy (its peft config gives the rank, alpha and targets).
        folder: where the adapter versions are written (``folder/adapter-v<k>``), e.g. the engine's
            temporary folder.
    Raises:
        ValueError: ``model`` has no adapters, or its rank exceeds vLLM's largest.
    """

    def __init__(self, model: torch.nn.Module, folder: str):
        self.config = peft_wrapper(model).peft_config[ADAPTER_NAME]
        self.max_rank = engine_rank(int(self.config.r))
        self.folder = Path(folder)
        self.version = 0
        self.request = None  # the LoRARequest every generate passes (None before the first sync)

    def engine_kwargs(self) -> dict:
        """The ``vllm.LLM`` arguments that enable LoRA: one adapter at a time (the current version)."""
        return dict(enable_lora=True, max_lora_rank=self.max_rank, max_loras=1)

    def sync(self, llm, model: torch.nn.Module):
        """Register ``model``'s current adapters in ``llm`` as version ``self.version + 1`` and drop
        the previous version; the adapter is loaded here (``add_lora``), so the load is timed with
        the sync, not with the next ``generate``.

        Returns: the new ``LoRARequest`` (also ``self.request``).
        """
        from safetensors.torch import save_file  # lazy: only adapter sync writes safetensors here
        from vllm.lora.request import LoRARequest  # lazy: vLLM is an optional dependency

        version = self.version + 1
        path = self.folder / f"adapter-v{version}"
        path.mkdir(parents=True, exist_ok=True)
        save_file(adapter_tensors(model), str(path / "adapter_model.safetensors"))
        self.config.save_pretrained(str(path))  # adapter_config.json: r, lora_alpha, target_modules
        request = LoRARequest(lora_name=f"policy-v{version}", lora_int_id=version, lora_path=str(path))
        llm.llm_engine.add_lora(request)
        old, self.request, self.version = self.request, request, version
        if old is not None:
            llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
        return request
