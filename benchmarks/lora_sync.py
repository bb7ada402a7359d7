"""LoRA weight sync into vLLM: merged weights vs adapter-only (``rollout.lora_sync=merged|adapter``).

For each sync mode, one engine (:class:`harness.rollout.vllm.VLLMRollout`) is built from the same
LoRA policy (``lora=peft``); then, ``--steps`` times, the adapters are changed (every ``lora_B`` drawn
anew from a fixed seed, the same draws for both modes: a stand-in for an optimizer step) and

* the sync is timed (``sync_weights``: merged = ``W + (alpha / r) B A`` for every target through
  ``reload_weights``; adapter = the adapter tensors written and registered as a new
  ``LoRARequest`` version, loaded by ``add_lora``);
* one rollout of ``prompts x group_size`` sequences is timed (LoRA on in the engine costs decode
  time: vLLM applies ``B A x`` with its punica kernels at every token);
* the sampler's log-probs of that rollout are compared with the trainer's
  (:func:`harness.model.logprobs.token_logprobs` on the policy): the largest absolute difference over the
  completion tokens, which shows the synced version is the current one.

One JSON line per mode: medians over the steps (the first step's sync included; the warm-up is a
rollout before the first step).

    python -m benchmarks.lora_sync                       # embedded SmolLM2-135M, r=8, CPU
    python -m benchmarks.lora_sync --tiny --steps 2      # a quick check

:func:`measure` is also the LoRA section of ``benchmarks/gpu_rollout.py`` (bf16, Qwen2.5 shapes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from harness.runtime.provenance import cpu_model

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "What is {a} + {b}? Answer with the number."


def new_adapters(model: torch.nn.Module, seed: int, scale: float) -> None:
    """Draw every ``lora_B`` of ``model`` anew (``N(0, scale^2)``, generator seeded by ``seed``)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.copy_((torch.randn(p.shape, generator=g) * scale).to(p.device, p.dtype))


def measure(model, tok, prompts: list[str], group_size: int, params, steps: int, engine: dict,
            device: str = "cpu", modes=("merged", "adapter"), scale: float = 0.02, on_row=None) -> list[dict]:
    """Time merged vs adapter-only sync and the rollout after it (see the module doc).

    Args:
        model: a LoRA policy (``harness.model.lora.PeftLora(...).apply(model)``), on ``device``.
        prompts: chat-formatted prompt strings; ``group_size`` samples each.
        params: :class:`harness.rollout.SamplingParams` of the timed rollouts.
        engine: extra ``rollout`` keys for the engine (``kv_cache_gib``, ``max_model_len``, ...).
        scale: std of the drawn ``lora_B`` entries.
        on_row: called with each mode's dict as soon as it is measured (a run killed later keeps it).
    Returns: one dict per mode: ``sync_s`` (median and each step's), ``rollout_s`` (median),
        ``tokens_per_s`` (median), ``logprob_diff_max`` (largest over the steps), ``adapter_mib``
        (the adapter tensors, adapter mode) or ``merged_mib`` (the tensors sent, merged mode).
    """
    from harness.model.logprobs import token_logprobs
    from harness.model.lora import base_state_dict
    from harness.rollout import SamplingParams, build_backend
    from harness.rollout.vllm_lora import adapter_tensors

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows = []
    for mode in modes:
        new_adapters(model, 0, 0.0)  # B = 0: the engine starts from the base model in both modes
        backend = build_backend("vllm", model, tok, progress=False, lora_sync=mode, **engine)
        backend.generate(prompts[:2], 2, SamplingParams(temperature=1.0, max_new_tokens=8, seed=0))  # warm-up
        syncs, rollouts, rates, diffs = [], [], [], []
        for step in range(steps):
            new_adapters(model, 100 + step, scale)
            sync()
            t0 = time.perf_counter()
            backend.sync_weights(model)
            sync()
            syncs.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            batch = backend.generate(prompts, group_size, params)
            sync()
            rollouts.append(time.perf_counter() - t0)
            rates.append(int(batch.completion_mask.sum()) / rollouts[-1])
            with torch.no_grad():
                mine = token_logprobs(model, batch.prompt_ids.to(device), batch.prompt_mask.to(device),
                                      batch.completion_ids.to(device), batch.completion_mask.to(device),
                                      temperature=params.temperature, chunk=64)[0].float().cpu()
            m = batch.completion_mask.bool()
            diffs.append(float((batch.sampler_logprobs - mine)[m].abs().max()))
        sent = adapter_tensors(model) if mode == "adapter" else base_state_dict(model)
        rows.append({"lora_sync": mode, "sync_s": round(statistics.median(syncs), 4),
                     "sync_s_each": [round(s, 4) for s in syncs], "rollout_s": round(statistics.median(rollouts), 3),
                     "tokens_per_s": round(statistics.median(rates), 1), "logprob_diff_max": max(diffs),
                     f"{mode}_mib": round(sum(t.numel() * t.element_size() for t in sent.values()) / 2**20, 2),
                     "steps": steps, "sequences": len(prompts) * group_size, "new_tokens": params.max_new_tokens})
        backend.close()
        del backend
        if on_row is not None:
            on_row(rows[-1])
    new_adapters(model, 0, 0.0)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="a 2-layer random Llama instead of the embedded model")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", default=str(ROOT / "results" / "lora_sync.jsonl"))
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    from harness.model.lora import LoraConfig, PeftLora
    from harness.model.models import EMBEDDED_NAME, load_causal_lm, load_tokenizer
    from harness.rollout import SamplingParams

    tok = load_tokenizer(EMBEDDED_NAME)
    torch.manual_seed(0)
    if a.tiny:
        from transformers import LlamaConfig, LlamaForCausalLM

        model = LlamaForCausalLM(LlamaConfig(  # head size 64: one vLLM's CPU attention supports
            vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=1024, pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id, tie_word_embeddings=True))
    else:
        model = load_causal_lm(EMBEDDED_NAME)
    model = PeftLora(LoraConfig(r=a.rank)).apply(model.eval())
    prompts = [tok.apply_chat_template([{"role": "user", "content": QUESTION.format(a=17 + i, b=25 + 3 * i)}],
                                       tokenize=False, add_generation_prompt=True) for i in range(a.prompts)]
    params = SamplingParams(temperature=1.0, max_new_tokens=a.new_tokens, seed=0)
    meta = {"date": time.strftime("%Y-%m-%d"), "machine": f"{cpu_model()}, {torch.backends.cpu.get_cpu_capability()}, "
            f"{torch.get_num_threads()} threads", "model": "tiny" if a.tiny else EMBEDDED_NAME, "lora_r": a.rank,
            "dtype": "float32"}

    def write(r: dict) -> None:
        print(json.dumps({**meta, **r}), flush=True)
        with Path(a.out).open("a") as f:
            f.write(json.dumps({**meta, **r}) + "\n")

    measure(model, tok, prompts, a.group_size, params, a.steps, dict(kv_cache_gib=1, max_model_len=512), on_row=write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
