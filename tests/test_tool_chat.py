"""The chat template's tool-call format (issue 32 item 1, ``tools.format=chat_template``): hermes
``<tool_call>`` JSON in a turn that ends at EOS, the observation rendered by the tokenizer's own
chat template as a text delta, tokenized alone and appended (token-in/token-out), the schema in
the prompt, bad calls as counted error observations, and ``tools.format=tags`` unchanged.

The hand-checked episodes use :class:`tests.test_tools.ScriptedBackend` (fixed turns); the ``hf``
backend's test forces the first turn's call (the tiny random model never writes one) and lets the
model sample the turn after the observation.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from harness.rollout import SamplingParams, build_backend
from harness.rollout.base import Sample
from harness.rollout.episode import EpisodeRollout
from harness.tasks import build_task
from harness.tools import Observation, build_tool
from harness.tools.calculator import CalculatorConfig
from harness.tools.formats import ChatTemplateFormat, build_format, hermes_call
from harness.launch.validate import ConfigError, validate
from tests.conftest import compose, tiny_llama
from tests.test_tools import PROMPTS, ScriptedBackend, _ids

# the shape of Qwen2.5-Instruct's template (hermes tool calls): the schemas in the system message,
# a tool message rendered as a user turn wrapping the output in <tool_response> (consecutive tool
# messages share one turn); written for this test, assistant tool_calls fields left out
QWEN_STYLE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- else %}{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}{%- endif %}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CHAT = CalculatorConfig(format="chat_template")
CALL_12x7 = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>'
SMOL_84 = "\n<|im_start|>tool\n84<|im_end|>\n<|im_start|>assistant\n"  # SmolLM2's template, by hand


@pytest.fixture
def qwen_tokenizer(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = QWEN_STYLE
    return tok


# ------------------------------------------------------------------- the render delta
def test_render_delta_of_smollm2s_template(tokenizer):
    """SmolLM2: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, then the generation
    prompt; after the turn's EOS come the newline, the tool message and ``<|im_start|>assistant\\n``."""
    fmt = build_format(build_tool(CHAT), tokenizer)
    assert fmt.stop is None  # a turn ends at EOS
    assert fmt.observation([Observation("84", False)]) == SMOL_84
    assert fmt.observation([Observation("84", False), Observation("error: x", True)]) == (
        "\n<|im_start|>tool\n84<|im_end|>\n<|im_start|>tool\nerror: x<|im_end|>\n<|im_start|>assistant\n")
    # tokenized alone, the delta's special tokens are single ids: EOS first after the newline
    ids = _ids(tokenizer, SMOL_84)
    assert ids[0] == _ids(tokenizer, "\n")[0] and ids.count(tokenizer.eos_token_id) == 1


def test_render_delta_of_a_qwen_style_template(qwen_tokenizer):
    """Qwen2.5's shape: the tool output in ``<tool_response>`` inside a user turn; two tool
    messages share that turn."""
    fmt = build_format(build_tool(CHAT), qwen_tokenizer)
    assert fmt.observation([Observation("84", False)]) == (
        "\n<|im_start|>user\n<tool_response>\n84\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert fmt.observation([Observation("84", False), Observation("error: x", True)]) == (
        "\n<|im_start|>user\n<tool_response>\n84\n</tool_response>\n<tool_response>\nerror: x\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n")


def test_the_prompt_carries_the_schema_and_the_shots_show_chat_calls(qwen_tokenizer, tokenizer):
    cfg = compose("task=arith", "tools=calculator", "tools.format=chat_template", "task.num_shots=1")
    tool = build_tool(cfg.tools)
    task = build_task(cfg.task)
    task.use_tool(tool)
    schema = tool.schema()
    assert task.tool_schemas == [schema] and schema["function"]["name"] == "calculator"
    prompt = task.prompt(task.eval[0], qwen_tokenizer)
    assert "<tools>\n" + json.dumps(schema) + "\n</tools>" in prompt  # the template's tojson of the schema
    # the worked example: an assistant call, the tool message, the answer (SmolLM2 renders no schema)
    shot = task.shots[0]
    lhs = shot.answer.split(" = ")[0]
    assert shot.turns == ({"role": "assistant", "content": hermes_call(schema, lhs)},
                          {"role": "tool", "name": "calculator", "content": shot.answer.split("\n")[0].split(" = ")[1]},
                          {"role": "assistant", "content": shot.answer})
    smol = task.prompt(task.eval[0], tokenizer)
    assert (f"<|im_start|>assistant\n<tool_call>\n{json.dumps({'name': 'calculator', 'arguments': {'expression': lhs}})}"
            f"\n</tool_call><|im_end|>\n<|im_start|>tool\n") in smol


def test_format_tags_is_unchanged(tokenizer):
    """The default is ``tags``: no schema in the prompt (the same text as a render without
    ``tools``), the shots show ``<calc>`` calls, the turn stops at ``call_close``."""
    cfg = compose("task=arith", "tools=calculator")
    assert cfg.tools.format == "tags"
    tool = build_tool(cfg.tools)
    task = build_task(cfg.task)
    task.use_tool(tool)
    assert task.tool_schemas is None and all(s.turns == () for s in task.shots)
    assert "<calc>" in task.shots[0].answer
    assert task.prompt(task.eval[0], tokenizer) == tokenizer.apply_chat_template(
        task.messages(task.eval[0]), tokenize=False, add_generation_prompt=True)
    assert build_format(tool, tokenizer).stop == "</calc>"


def test_config_refuses_an_unknown_format_and_the_unread_tags():
    with pytest.raises(ConfigError, match=r"tools.format='xml' is not valid; expected one of \['chat_template', 'tags'\]"):
        validate(compose("model=tiny", "task=arith", "tools=calculator", "tools.format=xml"))
    with pytest.raises(ConfigError, match=r"tools.result_open=R is set, but tools.format=chat_template"):
        validate(compose("model=tiny", "task=arith", "tools=calculator", "tools.format=chat_template",
                         "tools.result_open=R"))
    validate(compose("model=tiny", "task=arith", "tools=calculator", "tools.format=chat_template"))


# ------------------------------------------------------------------ the episode
def test_hand_checked_chat_episode(tokenizer):
    """Turn 1 calls and ends at EOS (trained), the observation is the template's delta tokenized
    alone (mask 1, sampler log-prob 0), turn 2 continues exactly prompt + turn 1 + observation."""
    tok = tokenizer
    t1 = _ids(tok, CALL_12x7) + [tok.eos_token_id]
    t2 = _ids(tok, "12*7 = 84\n#### 84") + [tok.eos_token_id]
    obs = _ids(tok, SMOL_84)
    backend = ScriptedBackend(tok, [t1, t2])
    b = EpisodeRollout(backend, tok, build_tool(CHAT), max_turns=4).generate(
        PROMPTS[:1], 2, SamplingParams(temperature=1.0, max_new_tokens=128, seed=5, row_offset=6))
    n = len(t1) + len(obs) + len(t2)
    for r in range(2):
        assert b.completion_ids[r, :n].tolist() == t1 + obs + t2
        assert b.observation_mask[r].tolist() == [0] * len(t1) + [1] * len(obs) + [0] * len(t2)
        assert b.loss_mask[r].tolist() == [1] * len(t1) + [0] * len(obs) + [1] * len(t2)
        assert b.sampler_logprobs[r].tolist() == [-0.5] * len(t1) + [0.0] * len(obs) + [-0.5] * len(t2)
    assert b.loss_mask[0, len(t1) - 1] == 1 and b.completion_ids[0, len(t1) - 1] == tok.eos_token_id  # the model's EOS
    assert not b.truncated.any()
    assert {k: v.tolist() for k, v in b.episode.items()} == {"turns": [2, 2], "tool_calls": [1, 1], "tool_errors": [0, 0]}
    prompt = _ids(tok, PROMPTS[0])
    (rows1, _, stop1, _, _), (rows2, max2, stop2, _, _) = backend.calls
    assert rows1 == [prompt] * 2 and stop1 is None and stop2 is None
    assert rows2 == [prompt + t1 + obs] * 2 and max2 == [128 - len(t1) - len(obs)] * 2


def test_observation_tokens_get_exactly_zero_gradient(tokenizer, monkeypatch):
    """float64, the scripted chat episode through the policy loss (GRPO-style advantages, k3 KL,
    entropy bonus): d loss / d log-prob is exactly 0 at every observation token, not at the others."""
    import harness.train.update as update
    from harness.algo.algorithm import build_algorithm
    from harness.train.update import TrainBatch, policy_pass

    tok = tokenizer
    t1 = _ids(tok, CALL_12x7) + [tok.eos_token_id]
    t2 = _ids(tok, "#### 84") + [tok.eos_token_id]
    b = EpisodeRollout(ScriptedBackend(tok, [t1, t2]), tok, build_tool(CHAT), max_turns=2).generate(
        PROMPTS[:1], 2, SamplingParams(temperature=1.0, max_new_tokens=128, seed=1))
    cfg = compose("model=tiny", "task=arith", "tools=calculator", "tools.format=chat_template", "beta=0.1",
                  "kl.form=k3", "entropy_coef=0.01", "model.dtype=float64")
    B, T = b.completion_ids.shape
    adv = torch.tensor([[1.0], [-0.5]], dtype=torch.float64).expand(B, T).clone()
    tb = TrainBatch(b.prompt_ids, b.prompt_mask, b.completion_ids, b.loss_mask, adv, None,
                    torch.full((B, T), -3.0, dtype=torch.float64), None, None,
                    sampler_logprobs=b.sampler_logprobs.double(), attention_mask=b.completion_mask)
    kept, real_forward = [], update.logprob_forward

    def forward(policy):
        fn = real_forward(policy)

        def wrapped(*a, **k):
            logp, ent = fn(*a, **k)
            logp.retain_grad()
            kept.append(logp)
            return logp, ent
        return wrapped

    monkeypatch.setattr(update, "logprob_forward", forward)
    policy_pass(tiny_llama(tok, dtype=torch.float64), tb, build_algorithm(cfg), micro_batch_size=B, beta=0.1,
                entropy_coef=0.01)
    (logp,) = kept
    o, lm = b.observation_mask.bool(), b.loss_mask.bool()
    assert int(o.sum()) == 2 * len(_ids(tok, SMOL_84))
    assert torch.equal(logp.grad[o], torch.zeros(int(o.sum()), dtype=torch.float64))
    assert bool((logp.grad[lm] != 0).all())


BAD = {  # a turn's call text -> its error observation
    '<tool_call>{"name": "calculator", "arguments": }</tool_call>': "error: tool call is not JSON (Expecting value)",
    '<tool_call>{"name": "calc", "arguments": {"expression": "1+1"}}</tool_call>':
        "error: unknown tool 'calc'; expected 'calculator'",
    '<tool_call>{"name": "calculator", "arguments": {"expr": "1+1"}}</tool_call>':
        "error: missing argument 'expression'",
    '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1", "x": 1}}</tool_call>':
        "error: unexpected arguments ['x']",
    '<tool_call>{"name": "calculator", "arguments": {"expression": 2}}</tool_call>':
        "error: argument 'expression' must be a string",
    '<tool_call>["calculator", "1+1"]</tool_call>': 'error: expected {"name": ..., "arguments": {...}}',
    '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}': "error: <tool_call> without </tool_call>",
    '<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>':
        "error: not a bounded arithmetic expression",
}


@pytest.mark.parametrize("text", list(BAD), ids=range(len(BAD)))
def test_bad_calls_are_counted_error_observations(tokenizer, text):
    tok = tokenizer
    t1 = _ids(tok, text) + [tok.eos_token_id]
    b = EpisodeRollout(ScriptedBackend(tok, [t1, [tok.eos_token_id]]), tok, build_tool(CHAT), max_turns=2).generate(
        PROMPTS[:1], 1, SamplingParams(temperature=0.0, max_new_tokens=128))
    obs = _ids(tok, f"\n<|im_start|>tool\n{BAD[text]}<|im_end|>\n<|im_start|>assistant\n")
    assert b.completion_ids[0, : int(b.completion_mask.sum())].tolist() == t1 + obs + [tok.eos_token_id]
    assert {k: v.tolist() for k, v in b.episode.items()} == {"turns": [2], "tool_calls": [1], "tool_errors": [1]}


def test_two_calls_in_a_turn_and_the_episodes_ends(tokenizer):
    """Hermes parallel calls: one tool message each, in order; a turn without a call, or one cut by
    the budget, ends the episode; a call in the last turn is left unanswered (truncated)."""
    tok = tokenizer
    fmt = ChatTemplateFormat(build_tool(CHAT), tok)
    two = _ids(tok, CALL_12x7 + "\n" + CALL_12x7.replace("12*7", "x")) + [tok.eos_token_id]
    assert fmt.calls(two, "eos") == ["12*7", "x"]  # the calculator refuses "x" when run
    assert fmt.calls(two, "length") is None and fmt.calls(_ids(tok, "#### 1") + [2], "eos") is None
    b = EpisodeRollout(ScriptedBackend(tok, [two, [tok.eos_token_id]]), tok, build_tool(CHAT), max_turns=2).generate(
        PROMPTS[:1], 1, SamplingParams(temperature=0.0, max_new_tokens=128))
    obs = _ids(tok, "\n<|im_start|>tool\n84<|im_end|>\n<|im_start|>tool\nerror: not a bounded arithmetic expression"
                    "<|im_end|>\n<|im_start|>assistant\n")
    assert b.completion_ids[0, : int(b.completion_mask.sum())].tolist() == two + obs + [tok.eos_token_id]
    assert b.episode["tool_calls"].tolist() == [2] and b.episode["tool_errors"].tolist() == [1]
    assert b.truncated.tolist() == [False]
    one = _ids(tok, CALL_12x7) + [tok.eos_token_id]
    b = EpisodeRollout(ScriptedBackend(tok, [one] * 3), tok, build_tool(CHAT), max_turns=1).generate(
        PROMPTS[:1], 1, SamplingParams(temperature=0.0, max_new_tokens=128))
    assert b.completion_ids[0].tolist() == one and b.truncated.tolist() == [True]
    assert b.episode["tool_calls"].tolist() == [0]
    b = EpisodeRollout(ScriptedBackend(tok, [one] * 3), tok, build_tool(CHAT), max_turns=3).generate(
        PROMPTS[:1], 1, SamplingParams(temperature=0.0, max_new_tokens=len(one) + 3))
    assert b.completion_ids[0].tolist() == one + _ids(tok, SMOL_84)[:3] and b.truncated.tolist() == [True]


class ForcedFirstTurn:
    """The hf backend, but turn 0 returns ``first`` (a call the tiny model never writes); later
    turns are sampled by the model. Records every call."""

    def __init__(self, inner, first):
        self.inner, self.first, self.calls, self.eos_ids = inner, first, [], inner.eos_ids

    def sample_ids(self, rows, params, max_new, stop, row_index):
        out = ([Sample(list(self.first), [-1.0] * len(self.first), "eos") for _ in rows] if not self.calls
               else self.inner.sample_ids(rows, params, max_new, stop, row_index))
        self.calls.append((rows, stop, out))
        return out

    def sync_weights(self, model):
        pass


def test_hf_backend_continues_a_chat_episode_token_in_token_out(tokenizer):
    """After the forced call and its observation the ``hf`` backend samples from exactly prompt +
    call + observation ids, with no stop string (EOS or budget only), and the episode is the
    concatenation of what it returned."""
    tok = tokenizer
    first = _ids(tok, CALL_12x7) + [tok.eos_token_id]
    obs = _ids(tok, SMOL_84)
    hf = build_backend("hf", tiny_llama(tok), tok, progress=False)
    rec = ForcedFirstTurn(hf, first)
    b = EpisodeRollout(rec, tok, build_tool(CHAT), max_turns=2).generate(
        PROMPTS, 2, SamplingParams(temperature=1.0, max_new_tokens=64, seed=3))
    rows, stop, out = rec.calls[1]
    assert stop is None and len(rec.calls) == 2
    for r in range(4):
        assert rows[r] == _ids(tok, PROMPTS[r // 2]) + first + obs
        n = int(b.completion_mask[r].sum())
        assert b.completion_ids[r, :n].tolist() == first + obs + out[r].ids
        assert out[r].stop in ("eos", "length") and len(first) + len(obs) + len(out[r].ids) <= 64
        assert b.observation_mask[r, :n].tolist() == [0] * len(first) + [1] * len(obs) + [0] * len(out[r].ids)
