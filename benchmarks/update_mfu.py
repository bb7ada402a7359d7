"""The update on a real GRPO batch against the machine's matmul ceiling (issue 28, item 2).

One `preset=arith_cpu`-shaped batch (4 arith 2-shot prompts x G=8, T=0.7, 48 new tokens, the
embedded SmolLM2-135M-Instruct, fp32) is sampled once; then the update (log-probs + backward +
AdamW step, micro-batches of 8, prefix sharing on as in the default) is timed, interleaved
A B A B ... with the bare-matmul ceiling measured in the same process between them:

* A = the fused LM head (:class:`harness.model.logprobs.LinearLogSoftmaxGather`, what the trainer runs);
* B = the unfused reference (plain autograd ops under activation checkpointing: what the trainer
  ran before issue 28), patched in for this benchmark only;

with ``--compile body``, C = the fused head with the decoder body compiled whole by
``torch.compile`` (inductor, ``dynamic=True``); with ``--compile mlp_norm``, only each layer's MLP
and its two RMSNorms (the pieces without the key/value cache). The compiled modules are switched
on and off in place between rounds, so A and C share the process, the weights and the batch; the
first compiled update (compile included) is reported on its own;

the fused head also at larger micro-batches (``--micro-batches 8 32``: a micro-batch of 8 rows is
one group, ~370 forward tokens with prefix sharing; 32 rows run the four groups as one forward).

FLOPs are counted from the work the update must do, not from padded slots: with prefix sharing
each group's prompt runs once, so the tokens are ``sum over groups of prompt length + all
completion tokens``; every token costs ``6 x N_body`` (forward 2, backward 4: the decoder's
linear layers), every completion token also ``6 x V x H`` (the LM head), and attention adds
``12 x L x H x context`` per token (QK^T and AV, forward and backward). Against the bare
``[2048, 2048] @ [2048, 2048]`` fp32 GFLOP/s of the same run, that is the update's share of the
matmul ceiling.

A second ceiling is closer to what this update can reach: the same run also times the update's
own GEMMs bare (:func:`shape_gemms`: every linear layer's forward ``X W^T`` and backward ``dY W``
and ``dY^T X`` at the real micro-batch token counts, and the LM head on the completion tokens,
with the model's own weights), so the report says how far the update is from the matmul rate at
its own shapes (H = 576 is small: those GEMMs run below the 2048^3 rate). Run the machine quiet:
`python -m benchmarks.update_mfu [--rounds 3]`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import date
from pathlib import Path

import torch
from torch.utils.checkpoint import checkpoint

from benchmarks.run_all import arith_prompts, matmul_gflops
from harness.model import logprobs
from harness.algo import build_algorithm
from harness.model.logprobs import backbone
from harness.model.models import EMBEDDED_NAME, load_causal_lm, load_tokenizer
from harness.runtime.provenance import cpu_label
from harness.rollout import SamplingParams, build_backend
from harness.launch.sweep import compose
from harness.train.update import TrainBatch, policy_pass


def _unfused(hidden, weight, bias, targets, temperature, with_entropy):
    return checkpoint(logprobs._chunk_logprobs, hidden, weight, bias, targets, temperature, with_entropy,
                      use_reentrant=False)


def update_flops(model, batch, G: int) -> tuple[float, int]:
    """(FLOPs of one update, tokens the forward must run) for ``batch`` with prefix sharing."""
    cfg = model.config
    H, L, V = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    n_body = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n and "lm_head" not in n)
    pm, cm = batch.prompt_mask, batch.completion_mask
    flops, tokens = 0.0, 0
    for g in range(pm.shape[0] // G):
        tp = int(pm[g * G].sum())
        tcs = cm[g * G:(g + 1) * G].sum(1).tolist()
        run = tp + sum(tcs)
        tokens += run
        flops += 6 * n_body * run + 6 * V * H * sum(tcs)
        # attention: each prompt token attends to ~its position, each completion token to tp + its position
        ctx = tp * tp / 2 + sum(tc * tp + tc * tc / 2 for tc in tcs)
        flops += 12 * L * H * ctx
    return flops, tokens


def group_tokens(batch, G: int) -> list[tuple[int, int]]:
    """``[(tokens the forward runs, completion tokens)]`` per group (one micro-batch of G rows
    with prefix sharing: the prompt once, then every completion)."""
    pm, cm = batch.prompt_mask, batch.completion_mask
    out = []
    for g in range(pm.shape[0] // G):
        tcs = int(cm[g * G:(g + 1) * G].sum())
        out.append((int(pm[g * G].sum()) + tcs, tcs))
    return out


def shape_gemms(model, groups: list[tuple[int, int]]) -> tuple[float, float]:
    """(FLOPs, seconds) of the update's GEMMs run bare at their real shapes: for each group
    ``(n, n_c)`` of :func:`group_tokens`, every body ``nn.Linear`` (weight ``[out, in]``) as
    forward ``[n, in] @ [in, out]`` and backward ``[n, out] @ [out, in]`` and
    ``[out, n] @ [n, in]`` (2 n in out FLOPs each), and the LM head likewise on ``n_c``
    completion tokens. Excludes attention's QK^T / AV (counted in :func:`update_flops`)."""
    lins = [m.weight.detach() for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and "lm_head" not in n]
    head = model.get_output_embeddings().weight.detach()
    flops, secs = 0.0, 0.0
    for n, n_c in groups:
        xs = {w.shape[1]: torch.randn(n, w.shape[1]) for w in lins}
        dys = {w.shape[0]: torch.randn(n, w.shape[0]) for w in lins}
        xh, dyh = torch.randn(n_c, head.shape[1]), torch.randn(n_c, head.shape[0])
        t = time.perf_counter()
        for w in lins:
            x, dy = xs[w.shape[1]], dys[w.shape[0]]
            x @ w.T, dy @ w, dy.T @ x
        xh @ head.T, dyh @ head, dyh.T @ xh
        secs += time.perf_counter() - t
        flops += sum(6.0 * n * w.shape[0] * w.shape[1] for w in lins) + 6.0 * n_c * head.shape[0] * head.shape[1]
    return flops, secs


def micro_batch_tokens(groups: list[tuple[int, int]], G: int, micro_batch: int) -> list[tuple[int, int]]:
    """:func:`group_tokens` merged into micro-batches of ``micro_batch`` rows (a multiple of G:
    whole groups, consecutive)."""
    k = max(1, micro_batch // G)
    return [(sum(n for n, _ in groups[i:i + k]), sum(c for _, c in groups[i:i + k])) for i in range(0, len(groups), k)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--micro-batches", type=int, nargs="+", default=[8, 32],
                    help="train.micro_batch_size values of the fused variant (multiples of G=8; the unfused runs at 8)")
    ap.add_argument("--compile", choices=["body", "mlp_norm"], default=None,
                    help="also time the fused head with these decoder modules under torch.compile "
                         "(body: minutes to compile on a CPU)")
    ap.add_argument("--out", type=Path, default=Path("results/update_mfu.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tok = load_causal_lm(EMBEDDED_NAME), load_tokenizer(EMBEDDED_NAME)
    P, G = 4, 8
    if any(mb % G for mb in args.micro_batches):
        ap.error(f"--micro-batches: multiples of G={G} expected, got {args.micro_batches}")
    prompts = arith_prompts(tok, P)
    torch.manual_seed(0)
    batch = build_backend("hf", model, tok, progress=False).generate(prompts, G, SamplingParams(0.7, 1.0, 48))
    B, Tc = batch.completion_ids.shape
    adv = torch.randn(B, 1, generator=torch.Generator().manual_seed(0)).expand(B, Tc) * batch.completion_mask
    tb = TrainBatch(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask, adv)
    algo = build_algorithm(compose(["policy_loss.epsilon=0.2", "beta=0.0", "loss_agg=token-mean",
                                    "rollout.temperature=0.7", "train.share_prefix=true"]))
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)  # lr 0: the weights stay put between rounds
    flops, tokens = update_flops(model, batch, G)
    fused_apply = logprobs.LinearLogSoftmaxGather.apply
    variants = {f"fused_mb{mb}": ("fused", mb) for mb in args.micro_batches} | {"unfused_mb8": ("unfused", 8)}
    if args.compile:
        variants["compiled_mb8"] = ("compiled", 8)
    groups = group_tokens(batch, G)
    body = backbone(model)
    compiled = []  # [(module, its compiled call)]
    compile_s = None
    if args.compile:
        mods = [body] if args.compile == "body" else [
            m for layer in body.layers for m in (layer.mlp, layer.input_layernorm, layer.post_attention_layernorm)]
        # in place (nn.Module.compile): the parameter names stay; toggled through the module's
        # compiled call so that the eager variants run the same weights in the same process
        for m in mods:
            m.compile(dynamic=True)
            compiled.append((m, m._compiled_call_impl))
            m._compiled_call_impl = None

    def update(variant: str) -> float:
        head, mb = variants[variant]
        logprobs.LinearLogSoftmaxGather.apply = _unfused if head == "unfused" else fused_apply
        for m, call in compiled:
            m._compiled_call_impl = call if head == "compiled" else None
        try:
            t = time.perf_counter()
            policy_pass(model, tb, algo, mb)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return time.perf_counter() - t
        finally:
            logprobs.LinearLogSoftmaxGather.apply = fused_apply
            for m, _ in compiled:
                m._compiled_call_impl = None

    if args.compile:  # the first compiled update compiles forward and backward (dynamo + inductor)
        compile_s = update("compiled_mb8")

    def ceiling(mb: int) -> float:
        f, s = shape_gemms(model, micro_batch_tokens(groups, G, mb))
        return f / s / 1e9

    for v in variants:  # warm-up
        update(v)
    mbs = sorted({mb for _, mb in variants.values()})
    for mb in mbs:
        ceiling(mb)
    rows = {"matmul": [], **{f"shape_gemms_mb{mb}": [] for mb in mbs}, **{v: [] for v in variants}}
    for _ in range(args.rounds):
        rows["matmul"].append(matmul_gflops())
        for mb in mbs:
            rows[f"shape_gemms_mb{mb}"].append(ceiling(mb))
        for v in variants:
            rows[v].append(update(v))
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    mm = med(rows["matmul"])
    res = {"machine": cpu_label(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "threads": args.threads, "date": date.today().isoformat(), "completion_tokens": int(batch.completion_mask.sum()),
           "forward_tokens": tokens, "update_gflop": flops / 1e9, "matmul_gflops_median": mm,
           "compile": args.compile, "compile_first_update_s": compile_s,
           **{f"shape_gemms_mb{mb}_gflops_median": med(rows[f"shape_gemms_mb{mb}"]) for mb in mbs}, "raw": rows}
    for v, (_, mb) in variants.items():
        s, sg = min(rows[v]), med(rows[f"shape_gemms_mb{mb}"])
        res[v] = {"micro_batch": mb, "best_s": s, "mean_s": sum(rows[v]) / len(rows[v]), "gflops": flops / s / 1e9,
                  "of_matmul": flops / s / 1e9 / mm, "of_shape_gemms": flops / s / 1e9 / sg}
    res["speedup_fused_mb8"] = res["unfused_mb8"]["best_s"] / res["fused_mb8"]["best_s"]
    if args.compile:
        res["speedup_compiled_mb8"] = res["fused_mb8"]["best_s"] / res["compiled_mb8"]["best_s"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "raw"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
