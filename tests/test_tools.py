"""Multi-turn rollouts with tools (issue 32): the tools and their bounds, the episode rollout's
token-in/token-out sequence, the loss mask on observation tokens, and training with a tool on.

The hand-checked episode uses a scripted backend (its turns are fixed token ids), so every id of
the training sequence is known in advance; the ``hf`` backend's episodes are checked against the
ids it returned turn by turn. The tiny random model never writes ``<calc>``, so the runs here
close a call on any token containing ``e`` (``tools.call_open='' tools.call_close=e``): most of
its turns then end in a call, the calculator refuses the text (an error observation) and the
episode goes on, which exercises every branch.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from harness.rollout import SamplingParams, build_backend
from harness.rollout.base import Sample, end_of_turn
from harness.rollout.episode import EpisodeRollout, episode_metrics
from harness.tools import TOOLS, Observation, ToolConfig, ToolRunner, build_tool
from harness.tools.calculator import CalculatorConfig
from tests.conftest import compose, tiny_llama

PROMPTS = ["<|im_start|>user\nWhat is 12*7?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n"]
ANY_E = ["tools.call_open=", "tools.call_close=e"]  # module docstring: calls the tiny model makes


# ------------------------------------------------------------------------------ tools
def test_calculator_values_and_hostile_inputs():
    calc = build_tool(CalculatorConfig())
    assert calc.observe("12*7") == Observation("84", False)
    assert calc.observe("(1234 + 5678) * 3") == Observation("20736", False)
    assert calc.observe("10/4") == Observation("2.5", False)
    assert calc.observe("2**10") == Observation("1024", False)
    t0 = time.perf_counter()
    for bad in ("9**9**9**9", "9^9^9^9", "2^5000", "1" * 61, "(" * 300 + "1" + ")" * 300, "__import__('os')", "",
                "1/0", "1+" * 99 + "1" * 100):
        o = calc.observe(bad)
        assert o.error and o.text.startswith("error: ") and len(o.text) <= 127, (bad[:20], o)
    assert time.perf_counter() - t0 < 2.0  # all refused at once, none ran into the time budget
    # the printed result is bounded too: 2^190 has 58 digits, 2^200 has 61
    assert not calc.observe("2^190").error and calc.observe("2^200").text == "error: result longer than 60 digits"
    assert build_tool(CalculatorConfig(max_digits=3)).observe("999+1").error


def test_runner_bounds_raising_hanging_and_huge_tools():
    def raises(_):
        raise RuntimeError("boom " + "x" * 1000)

    def hangs(_):
        time.sleep(5)
        return "late"

    p = ToolConfig(timeout_s=0.2, max_output_chars=50)
    assert ToolRunner(raises, p).observe("1") == Observation(("error: boom " + "x" * 1000)[:127], True)
    t0 = time.perf_counter()
    runner = ToolRunner(hangs, p)
    assert runner.observe("1") == Observation("error: timed out after 0.2 s", True)
    assert time.perf_counter() - t0 < 1.0
    runner.tool = lambda s: s  # a fresh worker serves the next call
    assert runner.observe("ok") == Observation("ok", False)
    assert ToolRunner(lambda s: "y" * 51, p).observe("1") == Observation("error: output longer than 50 characters", True)
    assert ToolRunner(lambda s: s, p).observe("z" * 201).error  # max_input_chars=200


@pytest.fixture
def collection(tmp_path):
    path = tmp_path / "docs.jsonl"
    docs = ["Paris is the capital of France.", "The Nile is the longest river in Africa.",
            "Mount Everest is the highest mountain on Earth.", "France borders Spain and Italy."]
    path.write_text("\n".join(json.dumps({"text": d}) for d in docs) + "\n")
    return path


_SEARCH_CHECKS = """
import json, sys
from harness.tools import build_tool
from harness.tools.search import SearchConfig
search = build_tool(SearchConfig(path=sys.argv[1], top_k=2, passage_chars=20))
out = {q: [search.observe(q).text, search.observe(q).error] for q in
       ["capital of France", "", "the of and", "zebra", "France " * 100]}
try:
    build_tool(SearchConfig(path=sys.argv[1] + ".missing"))
except ValueError as e:
    out["missing"] = str(e)
print(json.dumps(out))
"""


def test_search_returns_bounded_top_k_and_survives_hostile_queries(collection):
    """Run in a subprocess: bm25s loads numba, which would break a later vLLM engine start in this
    process (harness/tools/search.py says why)."""
    proc = subprocess.run([sys.executable, "-c", _SEARCH_CHECKS, str(collection)], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # BM25: the first document holds both "capital" and "France", the last only "France"; 20 characters each
    assert out["capital of France"] == ["[1] Paris is the capital\n[2] France borders Spain", False]
    assert out[""] == ["no results", False]
    assert out["the of and"] == ["no results", False]  # stop words only
    assert out["zebra"] == ["no results", False]
    assert out["France " * 100] == ["error: input longer than 200 characters", True]
    assert "tools.path=" in out["missing"]


def test_tools_group_lists_the_registered_tools():
    assert TOOLS.names() == ["calculator", "none", "search"]
    assert build_tool(compose("task=arith").tools) is None
    cfg = compose("task=arith", "tools=calculator")
    assert cfg.tools.name == "calculator" and cfg.tools.call_close == "</calc>" and cfg.rollout.max_turns == 4


# ------------------------------------------------------------------------ the episode
class ScriptedBackend:
    """``sample_ids`` returns fixed turns (``script[turn]`` for every row) and records its inputs."""

    def __init__(self, tokenizer, script):
        self.tok, self.script, self.calls = tokenizer, script, []
        self.eos_ids = {tokenizer.eos_token_id}

    def sample_ids(self, rows, params, max_new, stop, row_index):
        turn = len(self.calls)
        self.calls.append((rows, max_new, stop, row_index, params.seed))
        out = []
        for m in max_new:
            ids = self.script[turn]
            n, why = end_of_turn(ids, self.eos_ids, stop, self.tok, m)
            out.append(Sample(ids[:n], [-0.5] * n, why))
        return out

    def sync_weights(self, model):
        pass


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_hand_checked_episode_is_sampled_ids_plus_observation_ids(tokenizer):
    tok = tokenizer
    t1 = _ids(tok, "12 * 7 = <calc>12*7</calc>")
    t2 = _ids(tok, "\n#### 84") + [tok.eos_token_id]
    obs = _ids(tok, "<result>84</result>")  # the observation text tokenized alone
    backend = ScriptedBackend(tok, [t1, t2])
    ep = EpisodeRollout(backend, tok, build_tool(CalculatorConfig()), max_turns=4)
    b = ep.generate(PROMPTS[:1], 2, SamplingParams(temperature=1.0, max_new_tokens=64, seed=5, row_offset=6))
    n = len(t1) + len(obs) + len(t2)
    for r in range(2):
        assert b.completion_ids[r, :n].tolist() == t1 + obs + t2
        assert b.completion_mask[r].tolist() == [1] * n
        assert b.observation_mask[r].tolist() == [0] * len(t1) + [1] * len(obs) + [0] * len(t2)
        assert b.loss_mask[r].tolist() == [1] * len(t1) + [0] * len(obs) + [1] * len(t2)
        assert b.sampler_logprobs[r].tolist() == [-0.5] * len(t1) + [0.0] * len(obs) + [-0.5] * len(t2)
        assert b.texts[r] == "12 * 7 = <calc>12*7</calc><result>84</result>\n#### 84"
    assert not b.truncated.any()
    assert {k: v.tolist() for k, v in b.episode.items()} == {"turns": [2, 2], "tool_calls": [1, 1], "tool_errors": [0, 0]}
    # token in: turn 2 continued exactly prompt ids + turn 1's ids + the observation's ids
    prompt = _ids(tok, PROMPTS[0])
    (rows1, max1, stop1, idx1, seed1), (rows2, max2, _, idx2, seed2) = backend.calls
    assert rows1 == [prompt, prompt] and max1 == [64, 64] and stop1 == "</calc>" and idx1 == [6, 7]
    assert rows2 == [prompt + t1 + obs] * 2 and max2 == [64 - len(t1) - len(obs)] * 2 and idx2 == [6, 7]
    assert seed1 == 5 and seed2 != 5  # each turn draws from its own seed
    assert torch.equal(b.prompt_ids, tok([PROMPTS[0]] * 2, return_tensors="pt", add_special_tokens=False)["input_ids"])


def test_max_turns_and_the_budget_bound_the_episode(tokenizer):
    tok = tokenizer
    call = _ids(tok, "<calc>1+1</calc>")
    obs = _ids(tok, "<result>2</result>")
    # the model calls every turn: max_turns turns, a call after each but the last
    b = EpisodeRollout(ScriptedBackend(tok, [call] * 9), tok, build_tool(CalculatorConfig()), max_turns=3).generate(
        PROMPTS[:1], 1, SamplingParams(temperature=0.0, max_new_tokens=200))
    assert b.completion_ids[0, : int(b.completion_mask.sum())].tolist() == call + obs + call + obs + call
    assert b.episode["turns"].tolist() == [3] and b.episode["tool_calls"].tolist() == [2]
    assert b.truncated.tolist() == [True] and b.sampler_logprobs is None  # greedy: no sampler log-probs
    # one budget for model and observation tokens: the second observation is cut to what is left
    budget = 2 * len(call) + len(obs) + 2
    b = EpisodeRollout(ScriptedBackend(tok, [call] * 9), tok, build_tool(CalculatorConfig()), max_turns=9).generate(
        PROMPTS[:1], 1, SamplingParams(temperature=0.0, max_new_tokens=budget))
    assert int(b.completion_mask.sum()) == budget
    assert b.completion_ids[0].tolist() == call + obs + call + obs[:2]
    assert b.observation_mask[0].tolist() == [0] * len(call) + [1] * len(obs) + [0] * len(call) + [1, 1]
    assert b.episode["turns"].tolist() == [2]
    # a turn closing a call without opening one gets an error observation, counted
    b = EpisodeRollout(ScriptedBackend(tok, [_ids(tok, "oops</calc>"), [tok.eos_token_id]]), tok,
                       build_tool(CalculatorConfig()), max_turns=4).generate(
        PROMPTS[:1], 1, SamplingParams(temperature=0.0, max_new_tokens=64))
    assert "<result>error: no <calc> before </calc></result>" in b.texts[0]
    assert b.episode["tool_errors"].tolist() == [1] and b.truncated.tolist() == [False]


def test_episode_metrics_by_hand():
    ep = {"turns": torch.tensor([1, 3, 2, 1]), "tool_calls": torch.tensor([0, 2, 1, 0]),
          "tool_errors": torch.tensor([0, 1, 0, 0]), "observation_tokens": torch.tensor([0, 10, 6, 0])}
    m = episode_metrics(ep, torch.tensor([True, True, False, False]))
    assert m == {"rollout/turns_mean": 7 / 4, "rollout/tool_calls_mean": 3 / 4, "rollout/tool_errors": 1.0,
                 "rollout/observation_tokens_mean": 16 / 4, "rollout/tool_call_rate": 0.5,
                 "rollout/accuracy_with_tool": 0.5, "rollout/accuracy_without_tool": 0.5}


class RecordingIds:
    """Wraps a backend and records every turn it returned."""

    def __init__(self, inner):
        self.inner, self.turns, self.eos_ids = inner, [], inner.eos_ids

    def sample_ids(self, rows, params, max_new, stop, row_index):
        out = self.inner.sample_ids(rows, params, max_new, stop, row_index)
        self.turns.append(dict(zip(row_index, out)))
        return out

    def sync_weights(self, model):
        pass


def _hf_episode(tokenizer, model, tool, **kw):
    rec = RecordingIds(build_backend("hf", model, tokenizer, progress=False, **kw))
    return rec, EpisodeRollout(rec, tokenizer, tool, max_turns=3)


def test_hf_episode_trains_exactly_the_sampled_ids_plus_observations(tokenizer):
    """The ``hf`` backend, sampling: each row's completion is the concatenation of the ids the
    backend returned turn by turn and the observations' ids; the rows do not depend on the
    batch size (``rollout.batch_size``), the ids on nothing decoded."""
    tool = build_tool(CalculatorConfig(call_open="", call_close="e"))
    model = tiny_llama(tokenizer)
    params = SamplingParams(temperature=1.0, max_new_tokens=24, seed=11)
    rec, ep = _hf_episode(tokenizer, model, tool)
    b = ep.generate(PROMPTS, 2, params)
    assert b.episode["tool_calls"].sum() >= 3 and b.episode["tool_errors"].sum() >= 1  # the branches ran
    for r in range(4):
        expected, obs = [], []
        for t, turn in enumerate(rec.turns):  # one sample_ids call per turn
            if r in turn:
                expected += turn[r].ids
                obs += [0] * len(turn[r].ids)
                if turn[r].stop == "stop" and t < 2 and len(expected) < 24:  # max_turns=3: no call after the last
                    text = tokenizer.decode(turn[r].ids)
                    o = _ids(tokenizer, tool.wrap(tool.observe(text[: text.find("e")])))[: 24 - len(expected)]
                    expected += o
                    obs += [1] * len(o)
        n = int(b.completion_mask[r].sum())
        assert b.completion_ids[r, :n].tolist() == expected and n <= 24
        assert b.observation_mask[r, :n].tolist() == obs
        assert int(b.episode["turns"][r]) <= 3
    _, ep1 = _hf_episode(tokenizer, model, tool, batch_size=1)
    b1 = ep1.generate(PROMPTS, 2, params)
    assert torch.equal(b1.completion_ids, b.completion_ids) and torch.equal(b1.observation_mask, b.observation_mask)


def test_gradient_on_observation_tokens_is_exactly_zero(tokenizer, monkeypatch):
    """float64: d loss / d log-prob and d loss / d entropy at every observation token are exactly
    0 (GRPO + k3 KL in the loss + an entropy bonus + token-level IS correction), and not 0 at the
    model's tokens; the logits at a position reach the loss only through those two."""
    import harness.train.update as update
    from harness.algo.algorithm import build_algorithm
    from harness.train.update import TrainBatch, policy_pass

    tool = build_tool(CalculatorConfig(call_open="", call_close="e"))
    model = tiny_llama(tokenizer, dtype=torch.float64)
    _, ep = _hf_episode(tokenizer, model, tool)
    b = ep.generate(PROMPTS, 2, SamplingParams(temperature=1.0, max_new_tokens=16, seed=3))
    assert b.observation_mask.sum() > 0
    cfg = compose("model=tiny", "task=arith", "tools=calculator", "beta=0.1", "kl.form=k3", "entropy_coef=0.01",
                  "rollout_correction=token_truncate", "model.dtype=float64")
    algo = build_algorithm(cfg)
    B, T = b.completion_ids.shape
    adv = torch.linspace(-1, 1, B, dtype=torch.float64)[:, None].expand(B, T).clone()
    ref = torch.full((B, T), -3.0, dtype=torch.float64)
    tb = TrainBatch(b.prompt_ids, b.prompt_mask, b.completion_ids, b.loss_mask, adv, None, ref, None, None,
                    sampler_logprobs=b.sampler_logprobs.double(), attention_mask=b.completion_mask)
    kept, order = [], []
    real_forward, real_micro = update.logprob_forward, update.micro_batches

    def forward(policy):
        fn = real_forward(policy)

        def wrapped(*a, **k):
            logp, ent = fn(*a, **k)
            logp.retain_grad()
            ent.retain_grad()
            kept.append((logp, ent))
            return logp, ent
        return wrapped

    def micro(*a, **k):
        for idx, mb in real_micro(*a, **k):
            order.append(idx)
            yield idx, mb

    monkeypatch.setattr(update, "logprob_forward", forward)
    monkeypatch.setattr(update, "micro_batches", micro)
    policy_pass(model, tb, algo, micro_batch_size=2, beta=0.1, entropy_coef=0.01)
    assert sorted(int(r) for idx in order for r in idx) == list(range(B))
    n_obs = 0
    for idx, (logp, ent) in zip(order, kept):
        w = logp.shape[1]
        for i, r in enumerate(idx.tolist()):
            o, lm = b.observation_mask[r, :w].bool(), b.loss_mask[r, :w].bool()
            assert int(o.sum()) == int(b.observation_mask[r].sum())  # the trimmed width keeps them all
            assert torch.equal(logp.grad[i][o], torch.zeros(int(o.sum()), dtype=torch.float64))
            assert torch.equal(ent.grad[i][o], torch.zeros(int(o.sum()), dtype=torch.float64))
            assert bool((logp.grad[i][lm] != 0).all())  # the model's tokens do get a gradient
            n_obs += int(o.sum())
    assert n_obs == int(b.observation_mask.sum())


# ------------------------------------------------------------- the algorithm's view
def test_estimators_see_the_model_tokens_packed_and_the_reward_sits_on_the_last_model_token():
    from harness.algo.estimators import AdvantageContext, Estimator
    from harness.algo.token_estimators import TOKEN_ESTIMATORS
    from harness.train.rewards import shape_rewards

    # rows: model tokens 1, observation 0, right padding 0
    mask = torch.tensor([[1, 1, 0, 0, 1, 0], [1, 0, 0, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0]])
    kl = type("KL", (), {"placement": "loss"})()  # shape_rewards reads only the placement without a reference
    scores, token_rewards = shape_rewards(torch.tensor([1.0, 0.0, 1.0, 0.0]), mask, None, None, kl)
    assert token_rewards.tolist() == [[0, 0, 0, 0, 1, 0], [0] * 6, [0, 0, 1, 0, 0, 0], [0] * 6]  # last model token
    spec = TOKEN_ESTIMATORS.spec("reinforce_pp")
    params = spec.build({"gamma": 0.5})
    est = Estimator(spec, params)  # the trainer's call: algo.estimator(ctx)
    ctx = AdvantageContext(scores=scores.view(2, 2).double(), token_rewards=token_rewards.double(), mask=mask)
    out = est(ctx)
    # by hand: returns-to-go over model tokens only, gamma 0.5: row 0 (3 model tokens, reward 1 on
    # the last) -> 0.25, 0.5, 1; row 2 (3 tokens) the same; rows 1 and 3 (4 tokens) all 0. Whitened over the 14
    # model tokens, in row order:
    flat = torch.tensor([0.25, 0.5, 1.0, 0, 0, 0, 0, 0.25, 0.5, 1.0, 0, 0, 0, 0], dtype=torch.float64)
    assert flat.numel() == int(mask.sum())
    white = (flat - flat.mean()) / flat.std()
    expect = torch.zeros(4, 6, dtype=torch.float64)
    expect[mask.bool()] = white
    assert torch.allclose(out.advantages, expect, atol=1e-6)  # reinforce_pp's eps in the std
    assert bool((out.advantages[mask == 0] == 0).all())
    # a right-padded mask is the registered function's plain call (a float64 context: no cast)
    plain = AdvantageContext(scores=ctx.scores, token_rewards=ctx.token_rewards, mask=(mask.cumprod(1)))
    assert torch.equal(est(plain).advantages, spec.fn(plain, params).advantages)


_SEARCH_PARAMS = """
import json, sys, torch
from harness.model.models import EMBEDDED_NAME, load_tokenizer
from harness.rollout import SamplingParams
from harness.rollout.episode import EpisodeRollout
from harness.tools import build_tool
from harness.tools.search import SearchConfig
from tests.test_tools import ScriptedBackend, _ids
tok = load_tokenizer(EMBEDDED_NAME)
path, other = sys.argv[1], sys.argv[2]
turn = _ids(tok, "<search>capital France</search>")
def episode(**kw):
    ep = EpisodeRollout(ScriptedBackend(tok, [turn, _ids(tok, "[[x]]") + [tok.eos_token_id]] * 2), tok,
                        build_tool(SearchConfig(**{"path": path, **kw})), max_turns=2)
    return ep.generate(["<|im_start|>user\\nq<|im_end|>\\n<|im_start|>assistant\\n"], 1,
                       SamplingParams(temperature=0.0, max_new_tokens=120)).texts[0]
base = episode()
changed = {"call_open": dict(call_open="France"), "call_close": dict(call_close="[[x]]"),
           "result_open": dict(result_open="<r>"), "result_close": dict(result_close="</r>"),
           "max_input_chars": dict(max_input_chars=3), "max_output_chars": dict(max_output_chars=5),
           "path": dict(path=other), "text_key": dict(path=other, text_key="body"),
           "top_k": dict(top_k=1), "passage_chars": dict(passage_chars=5),
           "format": dict(format="chat_template")}  # the scripted turn has no EOS: under chat_template no call
out = {"base": base, **{k: episode(**kw) for k, kw in changed.items()}}
import time
from harness.tools import search
call = search.Search.__call__
search.Search.__call__ = lambda self, q: (time.sleep(0.5), call(self, q))[1]  # a slow collection
out["slow"], out["timeout_s"] = episode(), episode(timeout_s=0.1)
print(json.dumps(out))
"""


def check_search_params(tmp_path):
    """Each ``tools=search`` key changes the episode's text (a scripted turn searching "capital
    France"); run in a subprocess (bm25s loads numba, see harness/tools/search.py)."""
    path, other = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in [
        "Paris is the capital of France.", "France borders Spain.", "The Nile is long."]) + "\n")
    other.write_text("\n".join(json.dumps({"text": t, "body": b}) for t, b in [
        ("France has a capital city.", "Capital letters."), ("Rome.", "France and its capital.")]) + "\n")
    proc = subprocess.run([sys.executable, "-c", _SEARCH_PARAMS, str(path), str(other)], capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    base = out.pop("base")
    assert out.pop("slow") == base  # 0.5 s within the default 2 s
    assert base.startswith("<search>capital France</search><result>[1] Paris is the capital of France.\n[2] France"), base
    for k, text in out.items():
        assert text != base, f"tools.{k} changed nothing"
    assert out["timeout_s"].count("error: timed out") == 1 and out["text_key"] != out["path"]


def test_search_params_each_change_the_episode(tmp_path):
    check_search_params(tmp_path)


@pytest.mark.slow
def test_sigkill_then_resume_with_a_tool_matches_uninterrupted_run(tmp_path):
    """tests/test_resume.py's check (float64, 1e-10) with episode rollouts on: a run killed after a
    checkpoint and rerun ends with the uninterrupted run's history, tool metrics included."""
    import os
    import signal

    from tests import test_resume

    extra = ["tools=calculator", *ANY_E, "rollout.max_new_tokens=16"]
    keys = [*test_resume.DETERMINISTIC, "rollout/tool_calls_mean", "rollout/observation_tokens_mean"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    subprocess.run(test_resume._cmd(tmp_path, "a", "float64") + extra, cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=600)
    proc = subprocess.Popen(test_resume._cmd(tmp_path, "b", "float64") + extra, cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if "step_000002.pt" in line:
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run ended before step 2"
    resumed = subprocess.run(test_resume._cmd(tmp_path, "b", "float64") + extra, cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    from mlflow.tracking import MlflowClient

    hist = {}
    for name in ("a", "b"):
        client = MlflowClient(f"sqlite:///{tmp_path}/{name}/mlflow.db")
        run = client.search_runs([client.get_experiment_by_name("grpo-harness").experiment_id])[0]
        hist[name] = {k: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)) for k in keys}
    assert min(v for _, v in hist["a"]["rollout/tool_calls_mean"]) > 0
    for k in keys:
        assert [s for s, _ in hist["b"][k]] == [s for s, _ in hist["a"][k]], k
        assert [v for _, v in hist["b"][k]] == pytest.approx([v for _, v in hist["a"][k]], rel=1e-10, abs=1e-12), k
