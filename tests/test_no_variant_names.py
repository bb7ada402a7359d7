"""No variant is named outside the registries: the trainer, the run entry point and the
validation compute what a variant *declares* (``needs``, params, prescribed aggregation).

Every registered name (estimators, policy losses, aggregations, KL forms and controllers, group
filters, tasks, rollout backends) is looked for in comparisons (``== "name"``, ``!= "name"``,
``in ("name", ...)``) in every module of ``harness/`` outside ``harness/algo/`` (where the
variants themselves live) and ``harness/verifiers/`` (its own registry of verifier kinds).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "harness"


def _registered_names() -> set[str]:
    from harness.algo import (GROUP_FILTERS, KL_CONTROLLERS, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES,
                              TOKEN_ESTIMATORS)
    from harness.rollout import BACKENDS
    from harness.tasks import TASKS

    names = set(BACKENDS) | set(TASKS)
    for reg in (TOKEN_ESTIMATORS, POLICY_LOSSES, LOSS_AGGREGATIONS, KL_ESTIMATORS, KL_CONTROLLERS, GROUP_FILTERS):
        names |= set(reg.names())
    return names - {"none"}  # also the word for "off" (kl.placement=none, pruner none)


def test_no_comparison_against_a_variant_name_outside_the_registries():
    names = _registered_names()
    alternatives = "|".join(sorted(map(re.escape, names), key=len, reverse=True))
    pattern = re.compile(rf"""(==|!=)\s*["']({alternatives})["']|\bin\s*[\(\[\{{][^)\]}}]*["']({alternatives})["']""")
    hits = []
    for path in sorted(ROOT.rglob("*.py")):
        if {"algo", "verifiers"} & set(path.relative_to(ROOT).parts):  # the variants; verifier kinds
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if pattern.search(code):
                hits.append(f"{path.relative_to(ROOT.parent)}:{lineno}: {line.strip()}")
    assert not hits, "variant names compared outside the registries:\n" + "\n".join(hits)


def test_the_scan_finds_what_it_looks_for(tmp_path):
    """The pattern catches the forms it forbids (so the test above can fail)."""
    names = _registered_names()
    alternatives = "|".join(sorted(map(re.escape, names), key=len, reverse=True))
    pattern = re.compile(rf"""(==|!=)\s*["']({alternatives})["']|\bin\s*[\(\[\{{][^)\]}}]*["']({alternatives})["']""")
    for bad in ('if cfg.advantage.name == "ppo":', "x != 'process'", 'if name in ("grpo", "rloo"):',
                'if cfg.policy_loss.name in {"gspo"}:'):
        assert pattern.search(bad), bad
    assert not pattern.search('if "values" in spec.needs:')
