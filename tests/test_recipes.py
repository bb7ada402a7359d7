"""Named presets in conf/recipe/: each composes, validates, and sets what its header promises.

Composition goes through Hydra's compose API with the real conf/ folder, so these tests also
check the recipe mechanics: ``recipe: null`` after ``_self_`` in conf/config.yaml (a recipe
overrides the primary config), ``override /advantage`` inside a recipe, and command-line
overrides winning over a recipe.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from harness.launch.config import register_configs
from harness.launch.validate import validate

CONF_DIR = str((Path(__file__).resolve().parent.parent / "conf").resolve())
RECIPES = sorted(p.stem for p in (Path(CONF_DIR) / "recipe").glob("*.yaml"))

register_configs()


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=list(overrides))


# Every value a recipe promises (dotted keys). Keys absent here are left to the primary config.
_COMMON = {
    "mu": 1,
    "entropy_coef": 0.0,
    "kl.form": "k3",
    "kl.placement": "loss",
    "rollout.temperature": 1.0,
    "rollout.top_p": 1.0,
}

EXPECTED = {
    "trl_grpo": {
        **_COMMON,
        "advantage.name": "grpo", "advantage.scale": "group", "advantage.eps": 1e-4,
        "advantage.unbiased": True,
        "group_size": 8, "policy_loss.name": "ppo_clip", "policy_loss.epsilon": 0.2,
        "policy_loss.epsilon_high": None, "policy_loss.dual_clip": None, "beta": 0.0,
        "loss_agg.name": "token-mean", "overlong.mask_truncated": False, "overlong.buffer": 0,
        "group_filter.name": "none", "train.lr": 1e-6, "train.lr_schedule": "linear",
        "train.adam_betas": [0.9, 0.999], "train.weight_decay": 0.0, "train.max_grad_norm": 1.0,
    },
    "dr_grpo": {
        **_COMMON,
        "advantage.name": "mean_only",
        "group_size": 8, "policy_loss.name": "ppo_clip", "policy_loss.epsilon": 0.2,
        "policy_loss.epsilon_high": None, "policy_loss.dual_clip": None, "beta": 0.0,
        "loss_agg.name": "seq-mean-token-sum-norm", "loss_agg.constant": None, "loss_agg.divide_by_seqs": True,
        "overlong.mask_truncated": False, "overlong.buffer": 0,
        "group_filter.name": "none", "train.lr": 1e-6, "train.lr_schedule": "constant",
    },
    "dapo": {
        **_COMMON,
        "advantage.name": "grpo", "advantage.scale": "group",
        "group_size": 16, "policy_loss.name": "ppo_clip", "policy_loss.epsilon": 0.2,
        "policy_loss.epsilon_high": 0.28, "policy_loss.dual_clip": None, "beta": 0.0,
        "loss_agg.name": "token-mean", "overlong.mask_truncated": False, "overlong.buffer": 26,
        "overlong.penalty": 1.0, "group_filter.name": "dapo", "train.lr": 1e-6,
        "train.lr_schedule": "constant",
    },
    "verl_grpo": {
        **_COMMON,
        "advantage.name": "grpo", "advantage.scale": "group", "advantage.eps": 1e-6,
        "advantage.unbiased": True,
        "group_size": 5, "policy_loss.name": "ppo_clip", "policy_loss.epsilon": 0.2,
        "policy_loss.epsilon_high": None, "policy_loss.dual_clip": 3.0, "beta": 0.001, "kl.clamp": 10.0,
        "loss_agg.name": "token-mean", "overlong.mask_truncated": False, "overlong.buffer": 0,
        "group_filter.name": "none", "train.lr": 1e-6, "train.lr_schedule": "constant",
        "train.weight_decay": 0.01,
    },
    "openrlhf_group_norm": {
        **_COMMON,
        "advantage.name": "grpo", "advantage.scale": "group", "advantage.eps": 1e-9,
        "advantage.unbiased": True,
        "group_size": 8, "policy_loss.name": "ppo_clip", "policy_loss.epsilon": 0.2,
        "policy_loss.epsilon_high": None, "policy_loss.dual_clip": None, "beta": 0.001, "kl.clamp": 10.0,
        "loss_agg.name": "token-mean", "overlong.mask_truncated": False, "overlong.buffer": 0,
        "group_filter.name": "none", "train.lr": 1e-6, "train.lr_schedule": "cosine",
        "train.adam_betas": [0.9, 0.95], "train.weight_decay": 0.0, "train.max_grad_norm": 1.0,
    },
    "gspo": {
        **_COMMON,
        "advantage.name": "grpo", "advantage.scale": "group", "policy_loss.name": "gspo",
        "policy_loss.epsilon": 3e-4, "policy_loss.epsilon_high": 4e-4, "beta": 0.0,
        "loss_agg.name": "seq-mean-token-mean", "overlong.mask_truncated": False, "overlong.buffer": 0,
        "group_filter.name": "none",
    },
    "luspo": {
        **_COMMON,
        "advantage.name": "grpo", "advantage.scale": "group", "policy_loss.name": "gspo",
        "policy_loss.epsilon": 2e-3, "policy_loss.epsilon_high": 2.5e-3, "beta": 0.0,
        "loss_agg.name": "seq-mean-token-sum", "overlong.mask_truncated": False, "overlong.buffer": 0,
        "group_filter.name": "none",
    },
    "gpg": {
        **_COMMON,
        "advantage.name": "gpg", "advantage.alpha": "groups", "advantage.scale": "none",
        "group_size": 8, "policy_loss.name": "pg", "beta": 0.0,
        "loss_agg.name": "token-mean", "overlong.mask_truncated": False, "overlong.buffer": 0,
        "group_filter.name": "none", "train.lr": 1e-6, "train.lr_schedule": "constant",
        "train.adam_betas": [0.9, 0.999], "train.weight_decay": 0.0, "train.max_grad_norm": 1.0,
    },
    "cs336_grpo": {
        **_COMMON,
        "advantage.name": "grpo", "advantage.scale": "group", "advantage.eps": 1e-6,
        "group_size": 8, "policy_loss.name": "ppo_clip", "policy_loss.epsilon": 0.2,
        "policy_loss.epsilon_high": None, "policy_loss.dual_clip": None, "beta": 0.0,
        "loss_agg.name": "seq-mean-token-mean", "overlong.mask_truncated": False, "overlong.buffer": 0,
        "group_filter.name": "none", "train.lr": 1e-5, "train.lr_schedule": "constant",
        "train.adam_betas": [0.9, 0.95], "train.weight_decay": 0.0, "train.max_grad_norm": 1.0,
    },
}


@pytest.fixture(scope="module")
def composed():
    """Each recipe composed once (compose is the slow part)."""
    return {name: _compose(f"recipe={name}") for name in RECIPES}


def test_every_recipe_file_has_expectations_and_package_header():
    assert RECIPES, "conf/recipe/ is empty"
    assert set(RECIPES) == set(EXPECTED), "add the new recipe's promised values to EXPECTED"
    for name in RECIPES:
        first = (Path(CONF_DIR) / "recipe" / f"{name}.yaml").read_text().splitlines()[0]
        assert first.strip() == "# @package _global_", f"{name}.yaml must start with '# @package _global_'"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recipe_sets_promised_values(composed, name):
    cfg = composed[name]
    for key, want in EXPECTED[name].items():
        got = OmegaConf.select(cfg, key)
        if isinstance(got, float) or isinstance(want, float):
            assert got == pytest.approx(want), f"recipe={name}: {key}={got!r}, expected {want!r}"
        elif OmegaConf.is_list(got):
            assert list(got) == pytest.approx(want), f"recipe={name}: {key}={list(got)!r}, expected {want!r}"
        else:
            assert got == want, f"recipe={name}: {key}={got!r}, expected {want!r}"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recipe_passes_validation(composed, name):
    validate(composed[name])


def test_recipe_overrides_primary_config():
    base = _compose()
    assert base.beta == pytest.approx(0.04) and base.advantage.name == "grpo"
    cfg = _compose("recipe=dr_grpo")
    assert cfg.beta == 0.0  # primary config says 0.04; the recipe (after _self_) wins
    assert cfg.advantage.name == "mean_only"  # override /advantage inside the recipe


def test_command_line_wins_over_recipe():
    cfg = _compose("recipe=dapo", "policy_loss.epsilon_high=0.3", "group_filter=none", "overlong.buffer=8")
    assert cfg.policy_loss.epsilon_high == pytest.approx(0.3)
    assert cfg.group_filter.name == "none"
    assert cfg.overlong.buffer == 8
    assert cfg.policy_loss.epsilon == pytest.approx(0.2)  # untouched recipe values stay
    validate(cfg)


def test_command_line_advantage_group_wins_over_recipe_override():
    cfg = _compose("recipe=dr_grpo", "advantage=grpo")
    assert cfg.advantage.name == "grpo"
    assert cfg.loss_agg.name == "seq-mean-token-sum-norm"


def test_recipe_with_advantage_params_pins_the_estimator():
    # trl_grpo sets advantage.eps / scale / unbiased, which mean_only's schema does not have:
    # documented limitation (a recipe that sets estimator params pins its estimator).
    with pytest.raises(ConfigCompositionException, match="eps"):
        _compose("recipe=trl_grpo", "advantage=mean_only")
    cfg = _compose("recipe=trl_grpo", "advantage.eps=0.01")
    assert cfg.advantage.eps == pytest.approx(0.01)
