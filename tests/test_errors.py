"""Bad input: every user-facing error names the input and what was expected."""

import subprocess
import sys

import pytest

from harness.launch.validate import ConfigError, validate
from tests.conftest import QUICK, compose


def _cli(*args, env=None, unset=()):
    import os
    import tempfile

    e = {k: v for k, v in dict(os.environ, **(env or {})).items() if k not in unset}
    with tempfile.TemporaryDirectory() as cwd:  # nothing lands in the repository
        return subprocess.run([sys.executable, "-m", "harness.run", *args], cwd=cwd, capture_output=True,
                              text=True, timeout=300, env=e)


def test_group_size_one_with_group_estimator_is_a_startup_error():
    with pytest.raises(ConfigError, match="group_size=1 with advantage=grpo"):
        validate(compose(*QUICK, "group_size=1"))


@pytest.mark.parametrize("override,needle", [
    ("kl.form=k9", "kl.form='k9' is not valid; expected one of"),
    ("kl.placement=advantage", "kl.placement="),
    ("kl.clamp=0", "kl.clamp=0"),
    ("kl.importance_correct=true kl.placement=reward", "kl.importance_correct=true with kl.placement=reward"),
    ("kl.importance_correct=true kl.form=k3+", "kl.importance_correct=true with kl.form=k3+"),
    ("advantage.scale=global", "advantage.scale must be one of"),
    ("advantage=reinforce advantage.baseline=median", "advantage.baseline must be one of"),
    ("rollout.top_p=1.5", "rollout.top_p=1.5: expected in (0, 1]"),
    ("rollout.top_p=0", "rollout.top_p=0.0: expected in (0, 1]"),
    ("rollout.top_k=-1", "rollout.top_k=-1: expected an integer >= 0"),
    ("policy_loss.dual_clip=1.0", "policy_loss.dual_clip must be None or > 1"),
    ("policy_loss.delta=1.0", "policy_loss.delta must be None or > 1"),
    ("rollout.temperature=0", "rollout.temperature=0"),
    ("policy_loss.epsilon=-1", "policy_loss.epsilon must be >= 0"),
    # eval.size takes the first N of task.eval_size problems: more would be cut to task.eval_size silently
    ("task=arith task.eval_size=100 eval.size=250", "eval.size=250: expected 1 <= eval.size <= task.eval_size=100"),
])
def test_invalid_values_name_the_key(override, needle):
    with pytest.raises(ConfigError) as e:
        validate(compose(*QUICK, *override.split()))
    assert needle in str(e.value)


def test_unknown_loss_aggregation_lists_the_options():
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException) as e:
        compose(*QUICK, "loss_agg=mean")
    assert "loss_agg/mean" in str(e.value) and "seq-mean-token-sum-norm" in str(e.value)


def test_a_key_of_another_variant_is_refused_at_composition():
    """A parameter the chosen estimator does not declare fails at startup, naming the key."""
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as e:
        compose(*QUICK, "advantage=rloo", "advantage.lam=0.9")
    assert "lam" in str(e.value.__cause__ or e.value)


def test_unknown_estimator_lists_valid_names_without_traceback():
    r = _cli("advantage=nope", "model=tiny")
    assert r.returncode != 0
    assert "grpo" in r.stderr and "rloo" in r.stderr and "nope" in r.stderr


def test_typo_in_key_fails_at_startup():
    r = _cli("model=tiny", "train.stepz=3")
    assert r.returncode != 0 and "stepz" in r.stderr


def test_missing_data_folder_names_path_and_how_to_set_it(run_dir):
    r = _cli("model=tiny", "task=gsm8k", "task.data_dir=/nonexistent/gsm8k",
             f"tracking.uri=sqlite:///{run_dir}/m.db")
    assert r.returncode == 2
    assert "/nonexistent/gsm8k" in r.stderr and "HARNESS_GSM8K_DIR" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.fixture
def failing_hub():
    """A stand-in for the Hugging Face hub (``HF_ENDPOINT``) that answers every request with 503 and
    records the paths asked for: ``(endpoint, paths)``."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    paths = []

    class Unavailable(BaseHTTPRequestHandler):
        def do_GET(self):
            paths.append(self.path)
            self.send_error(503)

        do_HEAD = do_GET

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Unavailable)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", paths
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("offline", [False, True], ids=["hub-unavailable", "offline-no-cache"])
def test_no_data_folder_and_no_hub_is_one_error_naming_both_fixes_before_the_model(tmp_path, failing_hub, offline):
    """``make run`` in a clone alone (no data folder) with no hub: one error naming the folder's variable
    and the hub dataset, after one request to the hub (``datasets`` alone retries for about 25 s a file
    and ends in a traceback), before the embedded model is converted (its cache stays empty)."""
    endpoint, asked = failing_hub
    cache = tmp_path / "model-cache"
    r = _cli(env={"HF_ENDPOINT": endpoint, "HF_HUB_OFFLINE": "1" if offline else "0", "HARNESS_CACHE": str(cache),
                  "HF_HOME": str(tmp_path / "hf"), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/m.db"},
             unset=("HARNESS_GSM8K_DIR",))  # the defaults: task=gsm8k, the embedded model
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    error = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and error[0].startswith(
        "error: no data for task=gsm8k: no local folder is set (task.data_dir, $HARNESS_GSM8K_DIR) and the Hugging "
        "Face hub cannot serve 'openai/gsm8k' (")
    assert ("Either point HARNESS_GSM8K_DIR=<folder> or task.data_dir=<folder> at a folder holding train.jsonl and "
            "test.jsonl, or make the hub dataset 'openai/gsm8k' reachable (") in error[0]
    assert ("offline mode (HF_HUB_OFFLINE=1), no copy in the cache" in error[0]) == offline
    # asked once (huggingface_hub may ask the endpoint other things of its own, e.g. /api/agent-harnesses)
    assert [p.split("?")[0] for p in asked if "gsm8k" in p] == ([] if offline else ["/api/datasets/openai/gsm8k"])
    assert not cache.exists() or not any(cache.iterdir())


def test_malformed_jsonl_names_file_and_line(tmp_path):
    from harness.tasks.data import DataError, load_jsonl

    bad = tmp_path / "train.jsonl"
    bad.write_text('{"question": "q", "answer": "#### 1"}\n{"question": oops}\n')
    with pytest.raises(DataError, match=r"train.jsonl:2: malformed JSON"):
        load_jsonl(bad)


def test_missing_fields_are_skipped_and_counted_or_strict_error(tmp_path):
    from harness.tasks.data import DataError, require_fields

    rows = [{"question": "a", "answer": "1"}, {"question": "b", "answer": ""}, {"question": "c"}]
    kept, lines, skipped = require_fields(rows, ("question", "answer"), "x.jsonl", strict=False)
    assert [r["question"] for r in kept] == ["a"] and lines == [1] and skipped == 2
    with pytest.raises(DataError, match=r"x.jsonl:2: missing or empty field"):
        require_fields(rows, ("question", "answer"), "x.jsonl", strict=True)


def test_bad_model_path_is_a_clear_error(run_dir):
    r = _cli("model.name_or_path=./no/such/model", "task=arith", f"tracking.uri=sqlite:///{run_dir}/m.db")
    assert r.returncode == 2 and "model.name_or_path='./no/such/model'" in r.stderr


def _closed_port() -> int:
    """A loopback port nothing listens on (bound and released: no fixed port the host may use)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_tracking_server_fails_before_compute(run_dir):
    url = f"http://127.0.0.1:{_closed_port()}"
    r = _cli("model=tiny", "task=arith", f"tracking.uri={url}",
             env={"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "3"})
    assert r.returncode == 2
    assert f"tracking store '{url}' is not usable" in r.stderr
    assert "step 1" not in r.stdout + r.stderr


def test_bad_storage_path_for_sqlite(run_dir):
    missing = run_dir / "missing" / "m.db"
    r = _cli("model=tiny", "task=arith", f"tracking.uri=sqlite:///{missing}")
    assert r.returncode == 2 and f"{missing.parent}' does not exist" in r.stderr
    assert not missing.parent.exists()


def test_eval_set_larger_than_the_test_set_is_refused():
    """task.eval_size above the test set's size would silently evaluate fewer problems."""
    from harness.tasks import build_task
    from harness.tasks.data import DataError

    with pytest.raises(DataError, match=r"task.eval_size=250: the arith test set has only 200 problems.*task.test_size"):
        build_task(compose(*QUICK, "task=arith", "task.test_size=200", "task.eval_size=250").task)
    task = build_task(compose(*QUICK, "task=arith", "task.test_size=250", "task.eval_size=250").task)
    assert len(task.eval) == 250
    assert len(build_task(compose(*QUICK, "task=arith", "task.test_size=30", "task.eval_size=null").task).eval) == 30


def test_math_filters_that_select_nothing():
    from harness.tasks import build_task

    with pytest.raises(ValueError, match="task.levels"):
        build_task(compose(*QUICK, "task=math", "task.levels=[9]").task)


def test_jobs_of_different_configs_sharing_one_checkpoint_dir_are_refused(run_dir):
    """A multirun whose jobs share one checkpoint.dir: the second config's job must neither adopt
    the first's MLflow run (run.json) nor resume its weights; the error names the folder and both
    config keys, and resume=<file> still continues from it on purpose."""
    import json

    from harness.launch.job import config_key
    from harness.launch.validate import ConfigError
    from tests.conftest import QUICK, compose, run_job

    ck = run_dir / "shared-ck"
    _, first, _ = run_job(f"checkpoint.dir={ck}", "seed=0", "checkpoint.keep_final=full")  # resumed from below
    key0, key1 = config_key(compose(*QUICK, "seed=0")), config_key(compose(*QUICK, "seed=1"))
    assert key0 != key1 and json.loads((ck / "run.json").read_text())["config_key"] == key0
    with pytest.raises(ConfigError, match=f"checkpoint.dir={ck} holds the run of another config "
                                          f"\\(config key {key0}; this job's is {key1}\\)"):
        run_job(f"checkpoint.dir={ck}", "seed=1")
    # the same config again: the job is finished, so it is reported and no run is created
    _, again, _ = run_job(f"checkpoint.dir={ck}", "seed=0")
    assert again.info.run_id == first.info.run_id
    # killed before its first checkpoint: only run.json is there, and it is not adopted either
    lone = run_dir / "lone-ck"
    lone.mkdir()
    (lone / "run.json").write_text(json.dumps({"token": "t", "run_id": first.info.run_id, "config_key": key0}))
    with pytest.raises(ConfigError, match="holds the run of another config"):
        run_job(f"checkpoint.dir={lone}", "seed=1")
    # on purpose: resume=<file> continues from the other config's (finished) checkpoint, one step further
    _, resumed, history = run_job(f"checkpoint.dir={ck}", "seed=1", "train.steps=3",
                                  f"resume={sorted(ck.glob('step_*.pt'))[-1]}")
    assert resumed.info.run_id == first.info.run_id and [s for s, _ in history("train/loss")] == [1, 2, 3]


@pytest.mark.parametrize("overrides,warned", [
    ("policy_loss.epsilon=0.1", "policy_loss.epsilon=0.1 changes nothing in this run"),
    ("policy_loss.epsilon_high=0.28 policy_loss.dual_clip=3.0",
     "policy_loss.dual_clip=3.0, policy_loss.epsilon_high=0.28 change nothing in this run"),
    ("policy_loss=sapo policy_loss.tau_neg=2.0", "policy_loss.tau_neg=2.0 changes nothing in this run"),
    ("policy_loss.epsilon=0.1 mu=2", None),  # the second pass's ratios are not 1
    ("policy_loss.epsilon=0.1 rollout.staleness=1", None),  # nor a stale batch's
    ("policy_loss.epsilon=0.2", None),  # the default: nothing set
    ("policy_loss=clip_cov policy_loss.clip_cov_lb=0.5", None),  # acts through the covariance
])
def test_a_ratio_param_set_at_mu_1_on_policy_warns_that_it_changes_nothing(overrides, warned, caplog):
    """At mu=1 without staleness every ratio pi/pi_old is 1: startup warns, naming the key and how
    to make it act, for a policy-loss param that acts only through that ratio and was set away from
    its default; the run still starts (TRL and verl accept the same)."""
    with caplog.at_level("WARNING", logger="harness.launch.validate"):
        validate(compose(*QUICK, *overrides.split()))
    said = [r.getMessage() for r in caplog.records if "nothing in this run" in r.getMessage()]
    if warned is None:
        assert said == []
    else:
        assert len(said) == 1 and said[0].startswith(warned) and "set mu>=2 or rollout.staleness>=1" in said[0]
