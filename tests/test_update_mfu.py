"""The FLOP counts of benchmarks/update_mfu.py, checked by hand on a 2-layer tiny Llama (H=32,
intermediate 64, 4 heads of 8, 2 KV heads: q/o 32x32, k/v 16x32, gate/up 64x32, down 32x64)."""

from types import SimpleNamespace

import torch

from benchmarks.update_mfu import group_tokens, shape_gemms, update_flops
from tests.conftest import tiny_llama


def _batch(prompt_lens, completion_lens, Tp=6, Tc=5):
    B = len(prompt_lens)
    pm = torch.zeros(B, Tp, dtype=torch.long)
    cm = torch.zeros(B, Tc, dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompt_lens, completion_lens)):
        pm[i, Tp - p:] = 1  # left-padded prompts
        cm[i, :c] = 1
    return SimpleNamespace(prompt_mask=pm, completion_mask=cm)  # all that the counts read


def test_group_tokens_and_flop_counts_match_hand_values(tokenizer):
    model = tiny_llama(tokenizer)
    V = model.config.vocab_size
    # 2 groups of G=2: prompts 4 and 6 tokens, completions (3, 5) and (2, 1)
    batch = _batch([4, 4, 6, 6], [3, 5, 2, 1])
    groups = group_tokens(batch, 2)
    assert groups == [(4 + 3 + 5, 8), (6 + 2 + 1, 3)]
    per_token_body = 2 * (32 * 32) + 2 * (16 * 32) + 2 * (64 * 32) + 32 * 64  # q,o + k,v + gate,up + down
    n_body = 2 * per_token_body + 2 * 2 * 32 + 32  # 2 layers of linears and 2 RMSNorms each, the final norm
    flops, tokens = update_flops(model, batch, 2)
    assert tokens == 12 + 9
    ctx = (4 * 4 / 2 + 3 * 4 + 9 / 2 + 5 * 4 + 25 / 2) + (6 * 6 / 2 + 2 * 6 + 4 / 2 + 1 * 6 + 1 / 2)
    assert flops == 6 * n_body * 21 + 6 * V * 32 * (8 + 3) + 12 * 2 * 32 * ctx
    gemm_flops, secs = shape_gemms(model, groups)
    assert secs > 0
    assert gemm_flops == 6.0 * 2 * per_token_body * 21 + 6.0 * V * 32 * 11


def test_micro_batch_tokens_merge_whole_groups():
    from benchmarks.update_mfu import micro_batch_tokens

    groups = [(12, 8), (9, 3), (10, 4)]
    assert micro_batch_tokens(groups, 2, 2) == groups
    assert micro_batch_tokens(groups, 2, 4) == [(21, 11), (10, 4)]
    assert micro_batch_tokens(groups, 2, 8) == [(31, 15)]
