"""Training-step time in fp32 vs bf16 on this CPU (the dtype choice behind ``model.dtype``).

One update (log-probs + backward, no optimizer step) of :func:`harness.train.update.policy_pass` on
16 x 384 random distinct tokens with the embedded SmolLM2-135M, three ways, in this order:

- ``fp32``: fp32 weights and compute (the default, ``model.dtype=float32``);
- ``autocast-bf16``: fp32 weights, matmuls in bf16 under ``torch.autocast("cpu")`` (not a
  harness option yet: measured to size the opportunity);
- ``bf16-weights``: weights loaded in bf16 (``model.dtype=bfloat16``; the optimizer then
  updates bf16 weights).

    python -m benchmarks.dtype_probe
"""

from __future__ import annotations

import time

import torch

from harness.algo import build_algorithm
from harness.model.models import EMBEDDED_NAME, load_causal_lm
from harness.launch.sweep import compose
from harness.train.update import TrainBatch, policy_pass


def main(argv=None) -> None:
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args(argv)
    B, Tp, Tc = 16, 256, 128
    g = torch.Generator().manual_seed(0)
    p_ids, c_ids = torch.randint(3, 40000, (B, Tp), generator=g), torch.randint(3, 40000, (B, Tc), generator=g)
    tb = TrainBatch(p_ids, torch.ones(B, Tp, dtype=torch.long), c_ids, torch.ones(B, Tc, dtype=torch.long),
                    torch.ones(B, Tc))
    s = build_algorithm(compose(["policy_loss.epsilon=0.2", "beta=0.0", "loss_agg=token-mean",
                                 "rollout.temperature=1.0", "train.logprob_chunk=64", "train.share_prefix=false"]))
    base = None
    for mode in ("fp32", "autocast-bf16", "bf16-weights"):
        model = load_causal_lm(EMBEDDED_NAME, "bfloat16" if mode == "bf16-weights" else "float32")
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast-bf16"):
            t = time.perf_counter()
            policy_pass(model, tb, s, 4)
            dt = time.perf_counter() - t
        base = base or dt
        print(f"{mode:14s} update on {B} x {Tp + Tc} tokens: {dt:5.1f} s ({base / dt:.2f}x fp32)", flush=True)


if __name__ == "__main__":
    main()
