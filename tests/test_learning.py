"""The update moves the policy the right way: completions with a higher advantage gain
log-probability relative to those with a lower one (sign conventions through the whole path:
rollout -> rewards -> advantages -> policy_pass -> AdamW)."""

import pytest
import torch

from harness.algo import build_algorithm, compute_advantages
from harness.model.logprobs import token_logprobs
from harness.rollout import SamplingParams, build_backend
from harness.train.update import TrainBatch, policy_pass
from tests.conftest import compose, tiny_llama


@pytest.mark.parametrize("estimator,agg", [("grpo", "token-mean"), ("rloo", "seq-mean-token-mean"),
                                           ("mean_only", "seq-mean-token-sum-norm")])
def test_update_raises_logprob_of_high_advantage_completions(tokenizer, estimator, agg):
    torch.manual_seed(0)
    model = tiny_llama(tokenizer)
    b = build_backend("hf", model, tokenizer, progress=False).generate(["Write something"] * 4, 8,
                                                                     SamplingParams(1.0, 1.0, 8))
    reward = torch.tensor([t.count("e") / max(len(t), 1) for t in b.texts])  # any dense reward
    adv = compute_advantages(reward.view(4, 8), estimator).view(-1, 1) * b.completion_mask
    s = build_algorithm(compose("policy_loss.epsilon=0.2", "beta=0.0", f"loss_agg={agg}", "rollout.max_new_tokens=8",
                                "rollout.temperature=1.0", "train.share_prefix=false"))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    args = (b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask)
    with torch.no_grad():
        before, _ = token_logprobs(model, *args)
    for _ in range(3):
        opt.zero_grad()
        policy_pass(model, TrainBatch(*args[:3], b.completion_mask, adv), s, micro_batch_size=8)
        opt.step()
    with torch.no_grad():
        after, _ = token_logprobs(model, *args)
    gain = ((after - before) * b.completion_mask).sum(1)
    corr = torch.corrcoef(torch.stack([adv[:, 0], gain]))[0, 1]
    assert corr > 0.5, float(corr)
    # and the opposite sign of the advantages moves it the other way
    assert ((gain * adv[:, 0]) > 0).float().mean() > 0.7
