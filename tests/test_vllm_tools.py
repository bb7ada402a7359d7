"""Episode rollouts with a tool on the vLLM backend (issue 32): at temperature 0 the ``vllm`` and
``hf`` backends give the same episode, token for token, observations included.

Needs vLLM (``make install-vllm``); skips without it, as tests/test_vllm.py does.
"""

from __future__ import annotations

import os

import pytest
import torch

try:
    import vllm  # noqa: F401

    HAVE_VLLM = True
except Exception as e:  # ImportError, or a broken install
    HAVE_VLLM, WHY = False, f"vLLM is not usable here ({type(e).__name__}: {str(e)[:200]}); make install-vllm"

if not HAVE_VLLM:
    if os.environ.get("HARNESS_REQUIRE_VLLM") == "1":
        raise RuntimeError(WHY)
    pytest.skip(WHY, allow_module_level=True)

from harness.rollout import SamplingParams, build_backend  # noqa: E402
from harness.rollout.episode import EpisodeRollout  # noqa: E402
from harness.tools import build_tool  # noqa: E402
from harness.tools.calculator import CalculatorConfig  # noqa: E402
from tests.test_vllm import PROMPTS, _tiny  # noqa: E402

pytestmark = [pytest.mark.timeout(900), pytest.mark.vllm]


def test_hf_and_vllm_give_the_same_episode_at_temperature_0(tokenizer):
    """The call closes on the text of a token the greedy model writes (found from the ``hf``
    backend's single-turn output), so the episodes hold calls and observations; both backends'
    episodes are then equal id for id, with the same observation mask and counts."""
    model = _tiny(tokenizer, eos=False)  # greedy: the EOS-raised model stops at once
    hf = build_backend("hf", model, tokenizer, progress=False)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24)
    first = hf.generate(PROMPTS, 1, greedy)
    stop = tokenizer.decode(first.completion_ids[-1, :1]).strip()  # measured: "oss", written over and over
    assert stop
    tool = build_tool(CalculatorConfig(call_open="", call_close=stop))
    eng = build_backend("vllm", model, tokenizer, progress=False, kv_cache_gib=1, max_model_len=512)
    try:
        a = EpisodeRollout(hf, tokenizer, tool, max_turns=3).generate(PROMPTS, 1, greedy)
        b = EpisodeRollout(eng, tokenizer, tool, max_turns=3).generate(PROMPTS, 1, greedy)
    finally:
        eng.close()
    assert int(a.episode["tool_calls"].sum()) >= 1 and int(a.observation_mask.sum()) > 0
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.completion_mask, b.completion_mask)
    assert torch.equal(a.observation_mask, b.observation_mask)
    assert {k: v.tolist() for k, v in a.episode.items()} == {k: v.tolist() for k, v in b.episode.items()}
    assert a.texts == b.texts and torch.equal(a.truncated, b.truncated)


def test_hf_and_vllm_give_the_same_chat_template_episode_at_temperature_0(tokenizer):
    """``tools.format=chat_template``: after a forced hermes call (turn 0, the tiny model never
    writes one) and the template's tool message, both backends continue from the same ids with
    no stop string (EOS or budget only) and give the same episode, id for id."""
    from harness.tools.formats import build_format
    from tests.test_tool_chat import CALL_12x7, CHAT, SMOL_84, ForcedFirstTurn
    from tests.test_tools import _ids

    model = _tiny(tokenizer, eos=False)
    tool = build_tool(CHAT)
    first = _ids(tokenizer, CALL_12x7) + [tokenizer.eos_token_id]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=64)
    hf = ForcedFirstTurn(build_backend("hf", model, tokenizer, progress=False), first)
    eng = build_backend("vllm", model, tokenizer, progress=False, kv_cache_gib=1, max_model_len=512)
    try:
        vl = ForcedFirstTurn(eng, first)
        a = EpisodeRollout(hf, tokenizer, tool, max_turns=2).generate(PROMPTS, 1, greedy)
        b = EpisodeRollout(vl, tokenizer, tool, max_turns=2).generate(PROMPTS, 1, greedy)
    finally:
        eng.close()
    assert build_format(tool, tokenizer).stop is None and hf.calls[1][1] is None and vl.calls[1][1] is None
    obs = _ids(tokenizer, SMOL_84)
    n = len(first) + len(obs)
    assert a.completion_ids[:, :n].tolist() == [first + obs] * len(PROMPTS)
    assert int(a.completion_mask.sum()) > n * len(PROMPTS)  # the model sampled after the observation
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.completion_mask, b.completion_mask)
    assert torch.equal(a.observation_mask, b.observation_mask) and a.texts == b.texts
    assert {k: v.tolist() for k, v in a.episode.items()} == {k: v.tolist() for k, v in b.episode.items()}
