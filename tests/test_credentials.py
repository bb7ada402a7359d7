"""harness.launch.credentials: passwords in URLs and secret environment values never reach a record."""

from __future__ import annotations

import logging

import pytest

from harness.launch import credentials as cr


def test_url_passwords_are_masked_and_remembered():
    url = "postgresql://harness:Pw-7f3kQz91@db.example:5432/optuna"
    assert cr.redact(url) == "postgresql://harness:***@db.example:5432/optuna"
    assert cr.url_password(url) == "Pw-7f3kQz91"
    # in running text, several URLs, quoted, and the bare password once a URL named it
    text = (f"--storage '{url}' tracking.uri=http://bob:hunter22@127.0.0.1:5000 then Pw-7f3kQz91 alone")
    out = cr.redact(text)
    assert "Pw-7f3kQz91" not in out and "hunter22" not in out
    assert out == ("--storage 'postgresql://harness:***@db.example:5432/optuna' "
                   "tracking.uri=http://bob:***@127.0.0.1:5000 then *** alone")
    # as Hydra's launcher prints an override (colons escaped)
    assert cr.redact(r"tracking.uri=postgresql\://harness\:Esc-pw-123@127.0.0.1\:5432/mlflow") == \
        r"tracking.uri=postgresql\://harness\:***@127.0.0.1\:5432/mlflow"
    # URL-encoded passwords: both spellings are masked
    assert cr.redact("mysql://u:p%40ss-word@h/db") == "mysql://u:***@h/db"
    assert "p@ss-word" not in cr.redact("p@ss-word")


def test_urls_without_a_password_are_unchanged():
    for s in ("sqlite:////tmp/x/mlflow.db", "http://127.0.0.1:5000/api", "postgresql://harness@h:5432/db",
              "ratio 3:4 at step 12", "file:///a:b/c"):
        assert cr.redact(s) == s
        assert cr.url_password(s) is None


def test_secret_environment_values_are_masked(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "tok-9c1b2a")
    monkeypatch.setenv("PGPASSWORD", "abc")  # under 4 characters: masking it would garble text
    assert cr.redact("user admin with tok-9c1b2a; abc") == "user admin with ***; abc"
    nested = {"a": ["x tok-9c1b2a", ("tok-9c1b2a",)], "tok-9c1b2a": 3, "n": 1.5}
    assert cr.redact_obj(nested) == {"a": ["x ***", ("***",)], "***": 3, "n": 1.5}


def test_log_records_are_redacted(caplog):
    cr.install()
    log = logging.getLogger("harness.test_credentials")
    with caplog.at_level(logging.INFO):
        log.info("storage %s", "postgresql://u:SeCrEt-555@h/db")
        log.warning("plain message %d", 7)
    assert caplog.messages == ["storage postgresql://u:***@h/db", "plain message 7"]
    assert "SeCrEt-555" not in caplog.text


def test_warn_inline_points_to_the_engines_own_credentials():
    with pytest.warns(UserWarning, match=r"storage carries a password.*postgresql://u:\*\*\*@h/db.*PGPASSWORD"):
        cr.warn_inline("storage", "postgresql://u:inline-pw-1@h/db")
    with pytest.warns(UserWarning, match="MLFLOW_TRACKING_PASSWORD"):
        cr.warn_inline("tracking.uri", "http://u:inline-pw-2@h:5000")


def test_scrub_file(tmp_path):
    f = tmp_path / "overrides.yaml"
    f.write_text("- tracking.uri=postgresql://u:file-secret-9@h/db\n- seed=0\n")
    assert cr.scrub_file(f)
    assert f.read_text() == "- tracking.uri=postgresql://u:***@h/db\n- seed=0\n"
    assert not cr.scrub_file(f)
