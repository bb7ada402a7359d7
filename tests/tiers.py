"""Test tiers (a pytest plugin loaded by ``tests/conftest.py``): markers by module, so that
``make test-fast`` is the edit loop and ``make test`` stays everything.

* ``distributed``: ``torchrun`` jobs (2 ranks, or 1 rank in a process group); ``servers``: PostgreSQL, an MLflow server,
  submitit, Ray; ``vllm``: vLLM's CPU build;
* ``slow``: everything that is not in :data:`FAST` (end-to-end jobs, the knob-effect test, kill
  and resume loops, sweeps, the embedded model);
* the fast tier (``-m "not slow and not distributed and not servers and not vllm"``): the RL
  maths, the property tests, config and docs checks, the verifiers, tracking and provenance
  helpers, and one tiny end-to-end run (:data:`FAST_TESTS`).

A new test module is slow until it is added to :data:`FAST`: the fast tier's time stays bounded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

FAST = {
    "test_algo_advantages.py", "test_algo_gae.py", "test_algo_kl.py", "test_algo_losses.py", "test_policy_losses.py",
    "test_properties.py", "test_recipe_golden.py", "test_verifiers_math_bank.py", "test_verifiers_gsm8k.py",
    "test_verifiers_steps.py", "test_verifiers_math.py", "test_verifiers_batch.py", "test_analysis_stats.py",
    "test_errors.py", "test_tasks.py", "test_health.py", "test_credentials.py", "test_update.py",
    "test_logprobs.py", "test_no_variant_names.py", "test_docs.py", "test_shared_prefix.py", "test_summary.py",
    "test_progress.py", "test_eval_metrics.py", "test_perf_metrics.py", "test_registry.py", "test_length_penalty.py", "test_entropy_control.py", "test_gdpo.py",
    "test_step_metrics.py", "test_update_mfu.py", "test_alloc.py", "test_float64_path.py",
    "test_device_hygiene.py", "test_peer_golden.py", "test_peer_golden_losses.py",
    "test_adv_transforms.py", "test_seedtest.py", "test_noise.py", "test_layers.py", "test_random_reward.py", "test_study_precision.py",
}
# single tests of slow modules that belong to the fast tier
FAST_TESTS = {
    # the lean decode against generate on the tiny model (the embedded model's comparisons stay slow)
    *(f"test_lean_rollout.py::{t}" for t in (
        "test_lean_gives_generates_tokens_in_float64", "test_eager_attention_takes_the_additive_mask",
        "test_finished_rows_leave_the_batch", "test_decode_attention_is_sdpas_in_float64",
        "test_bf16_copy_follows_the_weight_syncs_and_only_its_purpose", "test_bad_values_are_refused")),
    "test_pipeline.py::test_two_steps_log_params_metrics_tags_and_artifacts",  # the tiny end-to-end run
    "test_eval_cache.py::test_key_changes_with_what_the_eval_depends_on_and_not_with_where_it_is_kept",
    "test_eval_cache.py::test_store_then_load_and_a_damaged_file_is_a_miss",
    "test_eval_cache.py::test_process_age_counts_from_the_interpreter_start",
    "test_knobs.py::test_every_schema_key_is_classified",
    "test_keep_final.py::test_keep_final_takes_only_its_values",
    # the keep set of top-k / top-p by hand (the rest of the module samples and trains)
    "test_truncation.py::test_top_p_keeps_the_smallest_head_reaching_p",
    "test_truncation.py::test_top_k_keeps_ties_with_the_kth_value",
    "test_truncation.py::test_top_p_applies_to_the_top_k_renormalised_distribution",
    "test_truncation.py::test_temperature_comes_before_top_p",
    "test_truncation.py::test_tie_on_the_top_p_boundary_is_decided_by_the_stable_sort",
    "test_truncation.py::test_bad_filter_values_are_refused",
    "test_truncation.py::test_sampled_token_is_kept_even_outside_the_recomputed_set",
    "test_staleness.py::test_lagged_policy_walks_the_versions_and_restores_them",
    "test_staleness.py::test_decoupled_weight_by_hand",
    "test_staleness.py::test_decoupled_loss_by_hand",
    "test_staleness.py::test_refused",
    "test_overlap.py::test_upcoming_is_the_next_advance",
    "test_overlap.py::test_refused",
    "test_overlap.py::test_refused_with_vllm_sleep",
    # tools.format=chat_template by hand (scripted turns, no model) and the tool runner's daemon worker
    *(f"test_tool_chat.py::{t}" for t in (
        "test_render_delta_of_smollm2s_template", "test_render_delta_of_a_qwen_style_template",
        "test_format_tags_is_unchanged", "test_config_refuses_an_unknown_format_and_the_unread_tags",
        "test_hand_checked_chat_episode", "test_bad_calls_are_counted_error_observations",
        "test_two_calls_in_a_turn_and_the_episodes_ends")),
    "test_tool_exit.py::test_a_hung_call_leaves_no_thread_that_blocks_exit",
}
# tests of fast modules that run whole jobs or start the CLI (10-110 s each under load, measured)
SLOW_TESTS = {
    "test_properties.py::test_trainer_step_gives_the_float64_estimate_on_shaped_rewards",
    "test_errors.py::test_jobs_of_different_configs_sharing_one_checkpoint_dir_are_refused",
    "test_errors.py::test_bad_model_path_is_a_clear_error",
    "test_errors.py::test_missing_data_folder_names_path_and_how_to_set_it",
    "test_errors.py::test_unreachable_tracking_server_fails_before_compute",
    "test_errors.py::test_bad_storage_path_for_sqlite",
    "test_errors.py::test_typo_in_key_fails_at_startup",
    "test_errors.py::test_unknown_estimator_lists_valid_names_without_traceback",
    "test_shared_prefix.py::test_trainer_metrics_match_with_and_without_share_prefix",
    "test_health.py::test_a_truncated_run_warns_once_and_tags_the_mlflow_run",
    "test_progress.py::test_a_run_logs_the_step0_eval_each_step_split_and_phase_lines",
    "test_perf_metrics.py::test_rates_are_the_step_token_counts_over_the_phase_times",
    "test_perf_metrics.py::test_rollout_tokens_count_the_groups_a_filter_dropped",
}
BY_MODULE = {"test_distributed.py": "distributed", "test_distributed_kl.py": "distributed",
             "test_distributed_one_rank.py": "distributed",
             "test_cluster.py": "servers", "test_vllm.py": "vllm"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = Path(str(item.fspath)).name
        name = f"{module}::{item.originalname or item.name}"
        if module in BY_MODULE:
            item.add_marker(getattr(pytest.mark, BY_MODULE[module]))
        elif name in SLOW_TESTS or (module not in FAST and name not in FAST_TESTS):
            item.add_marker(pytest.mark.slow)
