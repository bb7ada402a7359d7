"""``torchrun --nproc_per_node=1``: one rank in a real process group (issue 46).

Under torchrun the harness joins the process group even with one rank
(:func:`harness.train.distributed.init`), so its collectives (the gradient all-reduce, the gathered rows
and counts, the broadcasts) and ``train.sharding=fsdp2`` (FSDP2 over a one-rank mesh) run as they do
on many ranks; this is what one GPU can check of the NCCL path (``benchmarks/gpu_smoke.py``). On
one rank a sum over ranks is the identity, so the job must equal ``python -m harness.run`` on the
same config, in float64, to 1e-10 (the helpers and the tiny model of ``tests/test_distributed.py``).
``python -m harness.run`` itself stays without a group.
"""

from __future__ import annotations

import socket

import pytest
import torch

from harness.train import distributed
from harness.launch.validate import ConfigError, validate
from tests.conftest import compose
from tests.test_distributed import F64, _history, assert_same, launch, record, tiny_dir  # noqa: F401 (fixture)

EXTRA = ["mu=2", "beta=0.1", "kl.form=k3", "checkpoint.every=0", F64]  # old and reference log-probs, a KL term


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_one_rank_under_torchrun_joins_a_group_and_python_m_does_not(monkeypatch):
    """Without torchrun's variables: no group, collectives return their input without calling
    torch.distributed, fsdp2 refused. With them at WORLD_SIZE=1: a gloo group, and every collective
    goes through ``torch.distributed.all_reduce`` (counted), fsdp2 accepted."""
    for k in distributed.TORCHRUN_ENV:
        monkeypatch.delenv(k, raising=False)
    calls = []
    real = torch.distributed.all_reduce
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda t, *a, **kw: calls.append(t.dtype) or real(t, *a, **kw))
    w = distributed.init()
    assert not distributed.under_torchrun() and not torch.distributed.is_initialized()
    assert (w.distributed, w.backend, w.sum(2.5)) == (False, None, 2.5) and calls == []
    with pytest.raises(ConfigError, match="train.sharding=fsdp2 .* was not started by torchrun .*MASTER_PORT"):
        validate(compose("train.sharding=fsdp2"))

    torchrun_env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(_free_port())}
    for k, v in torchrun_env.items():
        monkeypatch.setenv(k, v)
    validate(compose("train.sharding=fsdp2"))  # accepted: FSDP2 on a one-rank group
    with pytest.raises(ConfigError, match="rollout.overlap=true with 1 torchrun ranks"):
        validate(compose("rollout.overlap=true", "rollout.staleness=1"))
    try:
        w = distributed.init(timeout_s=60)
        assert torch.distributed.is_initialized() and distributed.world() is w
        assert (w.distributed, w.rank, w.world_size, w.backend) == (True, 0, 1, "gloo")
        n = w.sum(3)
        assert n == 3 and isinstance(n, int) and calls == [torch.float64]  # a host number, over gloo
        p = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
        p.grad = torch.tensor([0.25, 4.0], dtype=torch.float64)
        w.all_reduce_grads([p])
        assert p.grad.tolist() == [0.25, 4.0] and len(calls) == 2  # summed over the one rank: unchanged
        assert w.gather_objects("x") == ["x"] and w.broadcast_object(7) == 7
    finally:
        distributed.shutdown()
    assert not torch.distributed.is_initialized() and not distributed.world().distributed


@pytest.fixture(scope="module")
def one_process(tiny_dir, tmp_path_factory):  # noqa: F811 (the fixture imported above)
    """The reference: ``python -m harness.run`` on :data:`EXTRA`, 2 steps."""
    out = tmp_path_factory.mktemp("python-m")
    launch(tiny_dir, out, 1, 2, EXTRA)
    return out


@pytest.mark.parametrize("sharding", ["none", "fsdp2"])
def test_one_rank_under_torchrun_equals_one_process(tiny_dir, one_process, tmp_path, sharding):  # noqa: F811
    """``torchrun --standalone --nproc_per_node=1`` with train.sharding=none (the DDP-exact path: the
    gradients all-reduced over the group) and fsdp2 (a one-rank FSDP2 mesh: reduce-scatter, gathered
    weights for generation and the old/reference log-probs, the full-state checkpoint) equals
    ``python -m harness.run``: every metric and weight to 1e-10 in float64."""
    out = tmp_path / f"torchrun-{sharding}"
    launch(tiny_dir, out, 1, 2, [*EXTRA, f"train.sharding={sharding}"], torchrun=True)
    assert_same(one_process, out, 2, tiny_dir, ranks=1)
    a, b = record(one_process), record(out)
    assert (a["tags"]["process_group"], b["tags"]["process_group"]) == ("none", "gloo")  # the group ran
    kl_a = {m.step: m.value for m in a["extra"]["train/kl"]}
    kl_b = {m.step: m.value for m in b["extra"]["train/kl"]}
    assert kl_a[2] > 0 and kl_b == pytest.approx(kl_a, rel=1e-10, abs=1e-12)
    # fsdp2 ran: the zero-loss pass count is logged for a sharded policy only (0: one rank never waits)
    assert _history(one_process, "train/idle_passes") == {}
    assert _history(out, "train/idle_passes") == ({1: 0.0, 2: 0.0} if sharding == "fsdp2" else {})
    assert _history(out, "perf/param_shard_frac") == {1: 1.0, 2: 1.0}  # one rank holds every shard
