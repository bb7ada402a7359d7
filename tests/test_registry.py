"""One registry style for every pluggable piece (issue 26, item 2): tasks, rollout backends, verifier
kinds and the algorithm variants all register in a :class:`harness.registry.Registry` with their
params dataclass beside them, and every config group's options come from a registry."""

from __future__ import annotations

import dataclasses
import sys
import textwrap

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from harness.launch.config import GROUPS, group_schemas, register_configs
from harness.registry import Entry, Registry, import_package_modules
from harness.rollout import BACKENDS, RolloutConfig
from harness.tasks import TASKS, TaskConfig
from harness.verifiers import VERIFIERS
from tests.conftest import CONF, compose


def test_every_group_and_the_verifier_kinds_use_the_one_registry():
    for registry in (*GROUPS.values(), VERIFIERS):
        assert isinstance(registry, Registry), registry
    assert {g: list(o) for g, o in group_schemas().items()} == {g: r.names() for g, r in GROUPS.items()}


def test_tasks_and_backends_declare_their_params_beside_them():
    for name in TASKS:
        spec = TASKS.spec(name)
        assert issubclass(spec.params, TaskConfig) and spec.params.__module__ == spec.fn.__module__, name
        assert spec.fn.verifier_kind in VERIFIERS, f"task {name} names verifier kind {spec.fn.verifier_kind!r}"
        assert compose(f"task={name}").task.name == name
    for name in BACKENDS:
        spec = BACKENDS.spec(name)
        # hf has no keys of its own: its params are RolloutConfig, the fields every backend has
        assert issubclass(spec.params, RolloutConfig), name
        assert spec.params.__module__ in (spec.fn.__module__, RolloutConfig.__module__), name
        assert compose(f"rollout={name}").rollout.backend == name


def test_entry_build_takes_every_key_and_refuses_the_unknown():
    math = VERIFIERS.spec("math")
    assert math.build({"timeout_s": 2.0}) == math.params(timeout_s=2.0, num_workers=2)
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['timeout'\] for 'math'; accepted: "):
        math.build({"timeout": 2.0})
    with pytest.raises(ValueError, match="accepted: none"):
        VERIFIERS.spec("int").build({"timeout_s": 1.0})
    hf = BACKENDS.spec("hf")  # name field ``backend``: the key is rollout.backend
    assert hf.build({"backend": "hf", "batch_size": 2}).batch_size == 2
    with pytest.raises(ValueError, match="params named 'vllm' passed to 'hf'"):
        hf.build({"backend": "vllm"})
    with pytest.raises(ValueError, match=f"unknown task 'nope'; valid names: {', '.join(TASKS.names())}$"):
        TASKS.spec("nope")


def test_register_refuses_a_taken_name_and_a_params_named_otherwise():
    reg = Registry("thing")

    @dataclasses.dataclass
    class P:
        name: str = "a"
        x: int = 1

    reg.register("a", params=P)(lambda p: p.x)
    with pytest.raises(ValueError, match="thing 'a' is already registered"):
        reg.register("a", params=P)(lambda p: p.x)
    with pytest.raises(ValueError, match="P.name defaults to 'a', but it is registered as thing 'b'"):
        reg.register("b", params=P)
    assert isinstance(reg.spec("a"), Entry) and reg.get("a")(reg.spec("a").build(x=3)) == 3


def test_a_module_dropped_into_a_package_registers_itself(tmp_path, monkeypatch):
    pkg = tmp_path / "plugpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        from harness.registry import Registry
        THINGS = Registry("thing")
    """))
    for name in ("alpha", "beta"):
        (pkg / f"{name}.py").write_text(f"from plugpkg import THINGS\nTHINGS.register({name!r})(print)\n")
    (pkg / "_private.py").write_text("raise RuntimeError('not imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert import_package_modules("plugpkg") == ["plugpkg.alpha", "plugpkg.beta"]
        assert sys.modules["plugpkg"].THINGS.names() == ["alpha", "beta"]
    finally:
        for m in [m for m in sys.modules if m == "plugpkg" or m.startswith("plugpkg.")]:
            del sys.modules[m]


def test_model_presets_are_the_model_group_options_and_nothing_else():
    """``model_schema`` (the old base node of the presets) is no ``model=`` option in --help."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        options = GlobalHydra.instance().config_loader().get_group_options("model")
    assert options == sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
