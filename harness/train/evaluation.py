"""Evaluation: greedy pass@1 on the fixed eval set, optional k samples for mean@k / pass@k."""

from __future__ import annotations

import torch

from harness import progress
from harness.algo import maj_at_k, pass_at_k
from harness.rollout import SamplingParams

BY_OUTCOME = ("completion_len_correct_mean", "completion_len_incorrect_mean")


def completion_len_by_outcome(lengths, correct, prefix: str) -> dict:  # cpu: host values
    """Mean completion length of the correct and of the incorrect completions.

    Args:
        lengths: ``[N]`` completion lengths in tokens, up to and including EOS (the rollout's
            ``completion_mask`` summed over tokens).
        correct: ``[N]`` verdicts (bool / 0-1), the same rows.
        prefix: ``"train"`` or ``"eval"``.
    Returns:
        ``{prefix}/completion_len_correct_mean`` and ``{prefix}/completion_len_incorrect_mean``
        (tokens, float); a key is left out when no completion has that outcome (never logged as
        0). Weighted by the accuracy ``a`` they recombine to the overall mean:
        ``a * correct_mean + (1 - a) * incorrect_mean = mean(lengths)``.
    Raises:
        ValueError: ``lengths`` and ``correct`` differ in size.
    """
    lengths = torch.as_tensor(lengths, dtype=torch.float64).flatten()
    correct = torch.as_tensor(correct).flatten().to(torch.bool)
    if lengths.shape != correct.shape:
        raise ValueError(f"lengths {tuple(lengths.shape)} and correct {tuple(correct.shape)} differ in size")
    out = {}
    for name, rows in zip(BY_OUTCOME, (correct, ~correct)):
        if bool(rows.any()):
            out[f"{prefix}/{name}"] = float(lengths[rows].mean())
    return out


def sampled_ks(n: int) -> list[int]:
    """The k of the grouped pass@k / maj@k logged from n samples per problem: the powers of 2 from
    2 below n, and n (k = 1 is ``eval/mean_at_k``). E.g. n = 6: [2, 4, 6]; n = 1: [1]."""
    return [*(2**i for i in range(1, n.bit_length()) if 2**i < n), n]


def evaluate(task, backend, tokenizer, problems, *, max_new_tokens: int, num_samples: int = 0,
             temperature: float = 1.0, batch_size: int = 64, log_samples: int = 8, seed: int | None = None,
             first_index: int = 0, correct_out: list | None = None, lengths_out: list | None = None):
    """Score the policy on ``problems``.

    Args:
        task: the :class:`harness.tasks.Task` (prompt + verifier).
        backend: a rollout backend (``generate``).
        problems: the fixed eval problems.
        max_new_tokens: generation budget (tokens).
        num_samples: n > 0 also samples n completions per problem at ``temperature`` and
            reports mean@n, unbiased pass@k (Chen et al. 2021, eq. 1) and maj@k
            (:func:`harness.algo.maj_at_k`) for k = n and for each power of 2 below n
            (:func:`sampled_ks`).
        batch_size: prompts per generate call.
        log_samples: number of (prompt, completion, reward) rows returned for the artifact table.
        seed: seeds the k samples (row ``i * k + j`` of the whole eval set), so they do not depend
            on ``batch_size``; None uses torch's global generator.
        first_index: index of ``problems[0]`` in the whole eval set (a data-parallel rank's share),
            so a problem's samples are seeded by its global index.
        correct_out: when a list, the greedy verdict of each problem (1 / 0, in order) is appended
            to it (per-problem results for intervals over eval problems, :mod:`analysis.ablation`).
        lengths_out: when a list, each greedy completion's length in tokens (up to and including
            EOS) is appended to it, in order.
    Returns:
        (metrics dict with ``eval/accuracy``, ``eval/format_rate``, ``eval/completion_len_mean``,
        ``eval/completion_len_correct_mean`` / ``..._incorrect_mean`` (greedy completions; each
        left out when no completion has that outcome, :func:`completion_len_by_outcome`)[, ``eval/mean_at_k``,
        ``eval/pass_at_k``, ``eval/maj_at_k`` (k = n), ``eval/pass_at_<k>`` and ``eval/maj_at_<k>``
        for each k of :func:`sampled_ks`, ``eval/num_samples``], list of sample rows).
    """
    prompts = [task.prompt(p, tokenizer) for p in problems]
    golds = [p.gold for p in problems]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, purpose="eval")
    texts, lengths = [], []
    with progress.bar(len(prompts), "problems") as bar:
        for s in range(0, len(prompts), batch_size):
            out = backend.generate(prompts[s : s + batch_size], 1, greedy)
            texts += out.texts
            lengths += out.completion_mask.sum(1).tolist()
            bar.update(len(out.texts))
    verdicts = task.score(texts, golds)
    if correct_out is not None:
        correct_out.extend(int(bool(v.correct)) for v in verdicts)
    if lengths_out is not None:
        lengths_out.extend(int(x) for x in lengths)
    n = max(len(problems), 1)
    metrics = {
        "eval/accuracy": sum(v.correct for v in verdicts) / n,
        "eval/format_rate": sum(v.formatted for v in verdicts) / n,
        "eval/completion_len_mean": sum(lengths) / n,
        **completion_len_by_outcome(lengths, [bool(v.correct) for v in verdicts], "eval"),
    }
    rows = [
        {"problem_id": p.id, "prompt": p.question, "completion": t, "gold": p.gold,
         "extracted": v.extracted, "correct": v.correct}
        for p, t, v in list(zip(problems, texts, verdicts))[:log_samples]
    ]
    if num_samples > 0:
        params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, purpose="eval")
        per_prompt = max(1, batch_size // num_samples)
        correct, answers = [], []
        for s in range(0, len(prompts), per_prompt):
            if seed is not None:
                params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed,
                                        row_offset=(first_index + s) * num_samples, purpose="eval")
            out = backend.generate(prompts[s : s + per_prompt], num_samples, params)
            gs = [g for g in golds[s : s + per_prompt] for _ in range(num_samples)]
            for v in task.score(out.texts, gs):
                correct.append(v.correct)
                answers.append(v.extracted)
        # cpu: the verifier's verdicts, host values
        c = torch.tensor(correct, dtype=torch.float32).view(len(problems), num_samples)
        metrics["eval/mean_at_k"] = float(c.mean())
        per = [(answers[i * num_samples : (i + 1) * num_samples], correct[i * num_samples : (i + 1) * num_samples])
               for i in range(len(problems))]
        for k in sampled_ks(num_samples):
            metrics[f"eval/pass_at_{k}"] = sum(pass_at_k(num_samples, int(x), k) for x in c.sum(1)) / n
            metrics[f"eval/maj_at_{k}"] = sum(maj_at_k(a, v, k) for a, v in per) / n
        metrics["eval/pass_at_k"] = metrics[f"eval/pass_at_{num_samples}"]
        metrics["eval/maj_at_k"] = metrics[f"eval/maj_at_{num_samples}"]
        metrics["eval/num_samples"] = num_samples
    return metrics, rows
