"""Rollout throughput on one GPU: ``rollout=vllm`` vs HF ``generate``, bf16, Qwen2.5 shapes.

For a GPU machine (the device tool), within ~5 minutes: for each model shape (Qwen2.5-0.5B and
1.5B-Instruct's config, random weights: no hub is reachable there) and the SmolLM2 tokenizer's
vocabulary, GSM8K-like prompts (16 prompts x G=8 = 128 sequences, up to 256 new tokens; with
random weights EOS comes about once per vocabulary-size tokens, so completions run to the limit
on both engines), it times
:class:`harness.rollout.vllm.VLLMRollout` (``gpu_memory_utilization``, CUDA graphs on) and
:class:`harness.rollout.hf.HFRollout` (transformers ``generate`` on the module), after a warm-up
call each, and appends one JSON line per (model, backend) to ``results/gpu_rollout.jsonl``.

    python -m benchmarks.gpu_rollout                      # on the GPU machine
    python -m benchmarks.gpu_rollout --device cpu --tiny  # a dry run of the script itself, here

Not measured: a full GRPO step on the GPU (the trainer keeps the policy on the CPU today).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {  # config.json of Qwen/Qwen2.5-{0.5B,1.5B}-Instruct, vocabulary left to the tokenizer
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, tie_word_embeddings=True),
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, tie_word_embeddings=True),
}
QUESTION = ("Natalia sold clips to {n} of her friends in April, and then she sold half as many clips in May. "
            "How many clips did Natalia sell altogether in April and May? Think step by step.")


def build(shape: str, tok, dtype, device):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), max_position_embeddings=4096, pad_token_id=tok.pad_token_id,
                      eos_token_id=tok.eos_token_id, **SHAPES[shape])
    model = Qwen2ForCausalLM(cfg).to(dtype=dtype, device=device).eval()
    model.generation_config.eos_token_id = tok.eos_token_id  # random weights: EOS is rare (~1/vocab a token)
    model.generation_config.pad_token_id = tok.pad_token_id
    return model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-1.5b"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="the tiny shape only (a dry run on CPU)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--out", default=str(ROOT / "results" / "gpu_rollout.jsonl"))
    a = ap.parse_args(argv)
    from harness.models import EMBEDDED_NAME, load_tokenizer
    from harness.rollout import SamplingParams, build_backend

    tok = load_tokenizer(EMBEDDED_NAME)
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    models = ["tiny"] if a.tiny else a.models
    prompts = [tok.apply_chat_template([{"role": "user", "content": QUESTION.format(n=40 + i)}], tokenize=False,
                                       add_generation_prompt=True) for i in range(a.prompts)]
    params = SamplingParams(temperature=1.0, max_new_tokens=a.new_tokens, seed=0)
    device_name = torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu"
    out = Path(a.out)
    for shape in models:
        model = build(shape, tok, dtype, a.device)
        for name in ("vllm", "hf"):
            kw = dict(gpu_memory_utilization=0.5, enforce_eager=False, max_model_len=2048, kv_cache_gib=2) \
                if name == "vllm" else {}
            backend = build_backend(name, model, tok, progress=False, **kw)
            backend.generate(prompts[:2], 2, SamplingParams(temperature=1.0, max_new_tokens=8, seed=0))  # warm-up
            if a.device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            batch = backend.generate(prompts, a.group_size, params)
            if a.device == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            tokens = int(batch.completion_mask.sum())
            row = {"date": time.strftime("%Y-%m-%d"), "device": device_name, "model_shape": shape,
                   "dtype": str(dtype).removeprefix("torch."), "backend": name,
                   "sequences": len(prompts) * a.group_size, "new_tokens": a.new_tokens, "completion_tokens": tokens,
                   "seconds": round(dt, 3), "tokens_per_s": round(tokens / dt, 1),
                   "peak_torch_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
                   if a.device == "cuda" else None}
            print(json.dumps(row), flush=True)
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            if name == "vllm":
                backend.close()
                del backend
                if a.device == "cuda":
                    torch.cuda.empty_cache()
        del model
    return 0


if __name__ == "__main__":
    sys.exit(main())
