"""Tasks: data loading, gold extraction, seeded eval subsets, the arith generator, prompts, rewards."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.tasks import build_task
from harness.tasks.arith import make_problem
from harness import progress
from harness.tasks.data import DataError, hf_datasets, load_jsonl
from harness.tasks.gsm8k import gold_from_answer
from tests.conftest import DATA, QUICK, compose, full_data


def test_gsm8k_gold_is_text_after_last_marker():
    assert gold_from_answer("He has 3 + 4 = <<3+4=7>>7.\n#### 7") == "7"
    assert gold_from_answer("a #### 1\nb #### 1,250") == "1250"


def _lines(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def test_gsm8k_local_files_and_fixed_seeded_eval_subset():
    cfg = compose(*QUICK, "task=gsm8k", "task.eval_size=20", "task.eval_seed=7").task
    a, b = build_task(cfg), build_task(cfg)
    assert a.sources["train"]["source"] == str(DATA / "gsm8k" / "train.jsonl")  # the fixtures, never the hub
    assert len(a.train) == _lines(DATA / "gsm8k" / "train.jsonl") == 200 and len(a.eval) == 20
    assert [p.id for p in a.eval] == [p.id for p in b.eval]  # same seed, same subset
    other = build_task(compose(*QUICK, "task=gsm8k", "task.eval_size=20", "task.eval_seed=8").task)
    assert [p.id for p in other.eval] != [p.id for p in a.eval]
    first = a.train[0]
    assert first.question.startswith("Natalia sold clips") and first.gold == "72"


def test_train_stream_is_a_seeded_permutation_per_epoch():
    task = build_task(compose(*QUICK, "task=gsm8k", "task.train_size=5").task)
    epoch0 = [task.train_problem(i, seed=0).id for i in range(5)]
    assert sorted(epoch0) == sorted(p.id for p in task.train)  # each problem once per epoch
    assert [task.train_problem(i, seed=0).id for i in range(5)] == epoch0  # reproducible
    assert [task.train_problem(i, seed=1).id for i in range(5)] != epoch0


def test_math_task_reads_math500_and_filters():
    task = build_task(compose(*QUICK, "task=math", "task.levels=[1]", "task.subjects=[Algebra]",
                              "task.eval_size=null").task)
    assert task.eval and all(p.meta["level"] == 1 and p.meta["subject"] == "Algebra" for p in task.eval)
    assert all(p.id.startswith("test/algebra/") for p in task.eval)
    rows = [json.loads(line) for line in (DATA / "math" / "train.jsonl").read_text().splitlines()]
    kept = [r["problem"] for r in rows if r["level"] == 1 and r["subject"] == "Algebra"]
    assert [p.question for p in task.train] == kept and 0 < len(kept) < len(rows)


@pytest.mark.full_data
@pytest.mark.parametrize("task,sizes,skipped", [("gsm8k", (7473, 1319), 0), ("math", (7498, 500), 2)])
def test_whole_splits_load_with_their_published_sizes(task, sizes, skipped):
    """The whole data sets (where the caller named them) load with the published sizes: GSM8K
    7,473 / 1,319 (Cobbe et al. 2021), MATH-500's 500 (Lightman et al. 2023) and MATH's 7,500 train
    problems less the 2 whose solution boxes nothing (an empty ``answer``: skipped and counted)."""
    folder = full_data(task)
    loaded = build_task(compose(*QUICK, f"task={task}", f"task.data_dir={folder}", "task.eval_size=null").task)
    assert (len(loaded.train), len(loaded.eval), loaded.skipped_rows) == (*sizes, skipped)


def test_arith_problems_are_deterministic_and_correct():
    import random

    q, a, steps = make_problem(random.Random(3), digits=2, num_ops=3, operators=["+", "-", "*"], distractors=2)
    q2, a2, _ = make_problem(random.Random(3), digits=2, num_ops=3, operators=["+", "-", "*"], distractors=2)
    assert (q, a) == (q2, a2) and len(steps) == 3
    # replay the worked steps: each starts from the previous result, the last gives the answer
    value = None
    for s in steps:
        lhs, rhs = s.split(" = ")
        x, op, y = lhs.split()
        assert value is None or int(x) == value
        value = {"+": int(x) + int(y), "-": int(x) - int(y), "*": int(x) * int(y)}[op]
        assert value == int(rhs)
    assert value == a and a >= 0


def test_arith_task_prompt_uses_chat_template_and_shots(tokenizer):
    task = build_task(compose(*QUICK, "task.num_shots=2").task)
    p = task.eval[0]
    text = task.prompt(p, tokenizer)
    assert text.count("<|im_start|>user") == 3 and text.count("<|im_start|>assistant") == 3
    assert text.endswith("<|im_start|>assistant\n") and p.question in text
    assert task.train_problem(0, 0) == task.train_problem(0, 0) and task.train_problem(0, 0) != task.train_problem(1, 0)


def test_rewards_combine_correctness_format_and_overlong():
    from harness.train.rewards import compute_rewards, overlong_penalty

    task = build_task(compose(*QUICK).task)
    out = compute_rewards(task, ["so #### 12", "12", "#### 13"], ["12", "12", "12"], torch.tensor([5, 5, 10]),
                          format_weight=0.5, max_new_tokens=10, overlong_buffer=4, overlong_factor=1.0)
    assert out.correct.tolist() == [1.0, 1.0, 0.0]
    assert out.formatted.tolist() == [1.0, 0.0, 1.0]
    # length 10 of 10 with a buffer of 4: (10 - 6) / 4 = 1 -> penalty -1
    assert out.overlong.tolist() == [0.0, 0.0, -1.0]
    assert out.rewards.tolist() == [1.5, 1.0, -0.5]
    assert overlong_penalty(torch.tensor([7]), 10, 4, 0.5).tolist() == [-0.125]


def test_process_step_rewards_map_to_tokens(tokenizer):
    from harness.train.rewards import process_step_rewards

    task = build_task(compose(*QUICK).task)
    text = "12 + 5 = 17\n17 - 3 = 15\n#### 14"
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    mask = torch.ones_like(ids)
    steps = process_step_rewards(task, tokenizer, [text], ids, mask, torch.tensor([0.0]))[0]
    rewards = [r for _, r in steps]
    assert rewards[:2] == [1.0, 0.0]  # first step right, second wrong (17 - 3 = 14)
    assert steps[-1][0] == ids.shape[1] - 1  # the outcome sits on the last token
    first_end = tokenizer.decode(ids[0, : steps[0][0] + 1])
    assert first_end.rstrip().endswith("17")


def test_unparseable_numeric_gold_is_reported_once_per_problem(caplog):
    from harness.tasks.base import Problem, Task

    task = Task(compose(*QUICK).task)
    task.name = "gsm8k"
    with caplog.at_level("WARNING"):
        task.check_golds([Problem("a", "q", "12"), Problem("b", "q", "twelve"), Problem("c", "q", "1,250")])
    assert task.unparseable_golds == 1
    assert len([r for r in caplog.records if "problem b" in r.getMessage()]) == 1
    assert task.score(["#### twelve"], ["twelve"])[0].correct is False  # never rewarded 1


def test_without_datasets_loading_data_is_a_clear_error_and_the_rest_runs(monkeypatch, tmp_path):
    # the GPU bundle (benchmarks/gpu_bundle.py) leaves datasets out: its pyarrow is 55 MB
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ModuleNotFoundError
    with pytest.raises(DataError, match="needs the `datasets` package"):
        hf_datasets()
    f = tmp_path / "train.jsonl"
    f.write_text('{"question": "1+1", "answer": "#### 2"}\n')
    with pytest.raises(DataError, match="needs the `datasets` package"):  # not reported as a malformed line
        load_jsonl(f)
    progress.library_bars(False)  # transformers' and the hub's bars are still switched
    progress.library_bars(True)


def test_harness_run_imports_without_datasets_or_pyarrow():
    code = ("import sys; sys.modules['datasets'] = None; sys.modules['pyarrow'] = None; import harness.run; "
            "print(sorted(m for m in ('datasets', 'pyarrow') if sys.modules.get(m) is not None))")
    p = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "[]"
