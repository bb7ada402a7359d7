"""Data-parallel training on ``torch.distributed``, launched by ``torchrun``.

One run on ``W`` processes (ranks): every rank holds a full copy of the policy, samples its own
contiguous share of the step's prompts (whole groups: group statistics are unchanged), and the
step is made *exactly* the single-process step on the same global batch:

* batch-wide quantities are computed on the whole batch: the advantage estimator runs on the
  gathered ``[P, G]`` scores / ``[B, T]`` token rewards (batch whitening, batch-mean baselines,
  running state stay what one process computes), and every loss normaliser (token count,
  sequence count, rows) is all-reduced before any micro-batch is aggregated;
* each rank back-propagates its rows' share of the *global* loss, and the gradients are summed
  over ranks once per optimizer step (:meth:`World.all_reduce_grads`), so the update equals the
  one-process update up to float summation order (the verl#5625 / verl#3741 class of bugs, a
  normaliser that changes with ranks or micro-batches, cannot arise);
* metrics are reduced: sums of counts, means over the global batch, maxima of times and memory.

Why not ``DistributedDataParallel``'s wrapper: its backward hooks expect one forward per backward
and the same number of backward calls on every rank. Here a rank may have a different number of
micro-batches (DAPO's dynamic sampling keeps uneven groups), shared-prefix training runs the
prompt and the completion as two forwards, and generation calls the bare module. Summing the
flat gradient with one ``all_reduce`` per step is the same arithmetic as DDP's bucketed
all-reduce (without its compute/communication overlap) and works for all of these.

Sharded training (``train.sharding=fsdp2``, :func:`shard`): for a policy that does not fit one
device, PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``) shards every decoder layer and the
remaining parameters (embeddings, final norm, LM head) over the ranks, ZeRO-3 style: parameters,
gradients and optimizer state each live on one rank only. The step stays the one-process step:
gradients are reduce-scattered as *sums* (divide factor 1: each rank's loss is already its share of
the global loss), every rank runs as many forward/backward passes as the busiest rank (an idle rank
back-propagates a zero loss, :func:`idle_passes`), and forwards without gradients (generation,
evaluation, old/reference log-probs) run on the gathered full weights (:func:`full_weights`, what
TRL's ``unwrap_model_for_generation`` does for DeepSpeed ZeRO-3), so their varying number of decoding
steps never has to match across ranks. Checkpoints hold the full (unsharded) state in the format of
the unsharded run (:func:`full_state`, :func:`load_full_state`), so a run can resume with either.

Backends: ``gloo`` on CPU; with CUDA the process group is ``cuda:nccl,cpu:gloo`` (collectives
dispatch by tensor device). Only the CPU/gloo path is tested here (no GPU in CI).

Under ``torchrun`` (:func:`under_torchrun`: its rendezvous variables in the environment) the process
joins the group even with ``--nproc_per_node=1``: every collective above then really runs (on one
rank a sum is the identity, so the run equals the plain one), and ``train.sharding=fsdp2`` shards
over a one-rank mesh. That is how one GPU checks the NCCL and FSDP2 paths (``benchmarks/gpu_smoke.py``).
Without ``torchrun`` (``python -m harness.run``) :func:`world` is a one-rank world with no group,
whose collectives return their input, so the single-process code path is the same code.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import weakref
from dataclasses import dataclass
from functools import partial

import torch

from harness.model.logprobs import token_logprobs

log = logging.getLogger(__name__)


@dataclass
class World:
    """This process's place in the job.

    Attributes:
        rank: global rank (0 .. world_size - 1); rank 0 alone tracks and writes checkpoints.
        world_size: number of processes.
        local_rank: rank on this node (selects the CUDA device).
        joined: whether this process is in a ``torch.distributed`` process group (:func:`init`
            under ``torchrun``, of any size, one rank included).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    joined: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Whether collectives run over a process group (under ``torchrun``, even of one rank);
        False: they return their input."""
        return self.joined

    @property
    def backend(self) -> str | None:
        """The process group's backend as ``torch.distributed.get_backend()`` names it (``gloo``,
        ``cuda:nccl,cpu:gloo``...), None without a group."""
        return str(torch.distributed.get_backend()) if self.joined else None

    # ------------------------------------------------------------- partitions
    def shard(self, n: int) -> range:
        """This rank's contiguous share of ``n`` items (rank ``r`` gets ``[lo_r, hi_r)``; the first
        ``n % W`` ranks get one more), so concatenating the shares in rank order is ``range(n)``."""
        base, extra = divmod(int(n), self.world_size)
        lo = self.rank * base + min(self.rank, extra)
        return range(lo, lo + base + (1 if self.rank < extra else 0))

    # ------------------------------------------------------------ collectives
    def sum(self, x):
        """Sum of a python number or tensor over ranks (same type back)."""
        return self._reduce(x, torch.distributed.ReduceOp.SUM)

    def max(self, x):
        """Maximum of a python number or tensor over ranks."""
        return self._reduce(x, torch.distributed.ReduceOp.MAX)

    def _reduce(self, x, op):
        if not self.distributed:
            return x
        if isinstance(x, torch.Tensor):
            t = x.detach().clone()
            torch.distributed.all_reduce(t, op=op)
            return t
        # cpu: a host number, reduced over gloo (the group is cuda:nccl,cpu:gloo)
        t = torch.tensor(float(x), dtype=torch.float64)
        torch.distributed.all_reduce(t, op=op)
        return type(x)(t.item()) if isinstance(x, int) else float(t.item())

    def sum_dict(self, d: dict) -> dict:
        """Element-wise sum over ranks of ``{name: number}`` dicts; a key missing on a rank counts 0."""
        if not self.distributed:
            return dict(d)
        keys = sorted(set().union(*self.gather_objects(sorted(d))))
        if not keys:
            return {}
        # cpu: host numbers, reduced over gloo (the group is cuda:nccl,cpu:gloo)
        t = torch.tensor([float(d.get(k, 0.0)) for k in keys], dtype=torch.float64)
        torch.distributed.all_reduce(t)
        return dict(zip(keys, t.tolist()))

    def gather_objects(self, obj) -> list:
        """``[obj of rank 0, obj of rank 1, ...]`` on every rank (pickled; small objects only)."""
        if not self.distributed:
            return [obj]
        out = [None] * self.world_size
        torch.distributed.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj, src: int = 0):
        """Rank ``src``'s ``obj`` on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=src)
        return box[0]

    def gather_rows(self, t: torch.Tensor | None, pad_value=0) -> torch.Tensor | None:
        """Concatenate ``[b_r, ...]`` tensors of all ranks along rows, in rank order.

        Dim 1 (the token axis of ``[b, T]`` tensors) is right-padded with ``pad_value`` to the
        longest rank's width first. Small tensors only (rewards, masks, advantages): it goes
        through :meth:`gather_objects`.
        """
        if not self.distributed or t is None:
            return t
        parts = self.gather_objects(t.detach().cpu())
        if t.dim() >= 2:
            width = max(p.shape[1] for p in parts)
            parts = [torch.nn.functional.pad(p, (0, 0) * (p.dim() - 2) + (0, width - p.shape[1]), value=pad_value)
                     for p in parts]
        return torch.cat(parts).to(t.device)

    def row_offset(self, n_local: int) -> int:
        """Index of this rank's first row in the rank-ordered concatenation of all ranks' rows."""
        if not self.distributed:
            return 0
        counts = self.gather_objects(int(n_local))
        return sum(counts[: self.rank])

    def all_reduce_grads(self, params) -> None:
        """Sum the gradients of ``params`` over ranks, in place (one flat ``all_reduce`` per dtype
        and device). A parameter without a gradient on this rank contributes zeros (a rank whose
        rows were all filtered out still takes part). Parameters sharded by FSDP2 (DTensors) are
        skipped: their gradients were reduce-scattered in the backward."""
        if not self.distributed:
            return
        params = [p for p in params if p.requires_grad and not _is_dtensor(p)]  # FSDP2 reduced those
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        buckets: dict = {}
        for p in params:
            buckets.setdefault((p.grad.dtype, p.grad.device), []).append(p)
        for group in buckets.values():
            flat = torch.cat([p.grad.reshape(-1) for p in group])
            torch.distributed.all_reduce(flat)
            offset = 0
            for p in group:
                n = p.grad.numel()
                p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
                offset += n

    def broadcast_module(self, module: torch.nn.Module, src: int = 0) -> None:
        """Copy rank ``src``'s parameters and buffers into every rank's ``module``."""
        if not self.distributed:
            return
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                torch.distributed.broadcast(t.data, src=src)

    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier()


_WORLD = World()


def world() -> World:
    """The current process's :class:`World` (one rank until :func:`init` joins a group)."""
    return _WORLD


def train_device(requested: str = "auto") -> torch.device:
    """The device this rank's models train on (``model.device``).

    ``auto``: ``cuda:<LOCAL_RANK>`` when CUDA is available (one GPU per rank, torchrun's
    convention), else ``cpu``; ``cpu``; ``cuda``: ``cuda:<LOCAL_RANK>``.

    Raises:
        ValueError: ``cuda`` without a visible GPU, or another value.
    """
    if requested not in ("auto", "cpu", "cuda"):
        raise ValueError(f"model.device={requested!r}: expected 'auto', 'cpu' or 'cuda'")
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("model.device=cuda: no CUDA device is visible (torch.cuda.is_available() is False)")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def under_torchrun() -> bool:
    """Whether a launcher started this process as a rank of a job: ``torchrun`` (or any launcher
    that sets the ``env://`` rendezvous the same way) puts every name of :data:`TORCHRUN_ENV` in
    its workers' environment, for one worker too; ``python -m harness.run`` has none of them."""
    return all(k in os.environ for k in TORCHRUN_ENV)


def init(timeout_s: float = 1800.0) -> World:
    """Join the process group ``torchrun`` describes in the environment, once.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (and ``MASTER_ADDR``/``MASTER_PORT`` through the
    ``env://`` rendezvous). Joins under :func:`under_torchrun` whatever the world size (one rank
    too: its collectives then run over the group), or with ``WORLD_SIZE`` > 1; otherwise returns
    the one-rank world without a group.

    Raises:
        RuntimeError: from ``init_process_group`` when the rendezvous fails (``WORLD_SIZE`` > 1
            without ``MASTER_ADDR``/``MASTER_PORT``, for example).
    """
    global _WORLD
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1 and not under_torchrun():
        return _WORLD
    if not torch.distributed.is_initialized():
        if torch.cuda.is_available():  # NCCL's communicator belongs to the rank's own GPU
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "cuda:nccl,cpu:gloo" if torch.cuda.is_available() else "gloo"
        torch.distributed.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
        log.info("rank %s/%d joined the process group (%s)", os.environ.get("RANK"), size, backend)
    _WORLD = World(rank=torch.distributed.get_rank(), world_size=torch.distributed.get_world_size(),
                   local_rank=int(os.environ.get("LOCAL_RANK", "0")), joined=True)
    return _WORLD


def shutdown() -> None:
    """Leave the process group (end of a run)."""
    global _WORLD
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    _WORLD = World()


# ----------------------------------------------------------------------------- FSDP2
SHARDINGS = ("none", "fsdp2")
_ROOTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # policy -> its FSDP2 root (_LogprobRoot)


def _is_dtensor(t) -> bool:
    from torch.distributed.tensor import DTensor  # lazy: torch.distributed.tensor is for FSDP2 only

    return isinstance(t, DTensor)


class _LogprobRoot(torch.nn.Module):
    """The FSDP2 root unit around a ``*ForCausalLM``: its forward is
    :func:`harness.model.logprobs.token_logprobs` of the wrapped model. The trainer's forward calls the
    decoder body and the (chunked) LM head separately, not the model's own ``forward``; wrapping both
    in one module's forward makes FSDP2 gather the root parameters (embeddings, norm, LM head) for
    it and reduce-scatter their gradients after its backward."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args, **kwargs):
        if kwargs.get("share_prefix"):  # the same two forwards on every rank, whatever its prompts
            kwargs["share_prefix"] = "always"
        return token_logprobs(self.model, *args, **kwargs)


def shard(model: torch.nn.Module) -> torch.nn.Module:
    """Shard ``model`` over all ranks with FSDP2 (``fully_shard``), in place; returns ``model``.

    Units: every module whose class is in the model's ``_no_split_modules`` (the transformers
    decoder layers, the classes accelerate and verl wrap), then a root unit over the rest
    (:class:`_LogprobRoot`). Gradients are reduce-scattered as sums (``set_gradient_divide_factor(1)``
    with ``set_force_sum_reduction_for_comms``: gloo has no pre-multiplied sum). A forward without
    gradients initialises FSDP's state from the root (a collective: every rank calls this), and the
    parameters are left sharded, so an optimizer built afterwards holds the shards.

    Raises:
        RuntimeError: not in a process group (one rank under ``torchrun`` is one), or the model declares no
            ``_no_split_modules`` (not a transformers decoder).
    """
    from torch.distributed.fsdp import FSDPModule, fully_shard  # lazy: FSDP2 only (train.sharding=fsdp2)

    if not world().distributed:
        raise RuntimeError("train.sharding=fsdp2 shards over torchrun's ranks; this process is in no process group "
                           "(launch it with torchrun)")
    layers = set(getattr(model, "_no_split_modules", None) or ())
    units = [m for m in model.modules() if type(m).__name__ in layers]
    if not units:
        raise RuntimeError(f"train.sharding=fsdp2: {type(model).__name__} names no decoder-layer class "
                           "(_no_split_modules) to shard")
    device = next(model.parameters()).device
    mesh = None
    if device.type == "cuda":
        from torch.distributed.device_mesh import init_device_mesh  # lazy: FSDP2 on CUDA only

        mesh = init_device_mesh("cuda", (world().world_size,))
    for m in units:
        fully_shard(m, mesh=mesh, reshard_after_forward=True)
    root = _LogprobRoot(model)
    fully_shard(root, mesh=mesh, reshard_after_forward=True)
    for m in root.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    with torch.no_grad():  # lazy initialisation from the root, before anything calls a layer alone
        one = torch.zeros(1, 1, dtype=torch.long, device=device)
        root(one, torch.ones(1, 1, device=device), one, torch.ones(1, 1, device=device))
    root.reshard()
    _ROOTS[model] = root
    return model


def is_sharded(model) -> bool:
    """Whether :func:`shard` sharded ``model``."""
    return model is not None and model in _ROOTS


def logprob_forward(model):
    """The callable that computes ``token_logprobs(model, ...)`` for a training forward: the FSDP2
    root of a sharded model, else :func:`harness.model.logprobs.token_logprobs` bound to ``model``."""
    root = _ROOTS.get(model) if model is not None else None
    if root is not None:
        return root
    return partial(token_logprobs, model)


@contextlib.contextmanager
def full_weights(model):
    """Within the block, a sharded ``model`` holds its full parameters on every rank (all-gathered
    once on entry, freed on exit), so forwards run without collectives and ranks may run different
    numbers of them (generation). No-op for an unsharded model. Every rank must enter it together."""
    root = _ROOTS.get(model) if model is not None else None
    if root is None:
        yield model
        return
    from torch.distributed.fsdp import FSDPModule  # lazy: FSDP2 only (a sharded model)

    units = [m for m in root.modules() if isinstance(m, FSDPModule)]
    for m in units:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield model
    finally:
        for m in units:
            m.reshard()
            m.set_reshard_after_forward(True, recurse=False)


def idle_passes(model, n_local: int) -> int:
    """How many zero-loss forward/backward passes this rank must add so that every rank runs the
    same number (the busiest rank's ``n_local``): FSDP2's all-gathers and reduce-scatters are
    collectives. 0 for an unsharded model (its gradients are summed once per step). A collective
    itself: call it before the first pass, not after this rank's last one."""
    if not is_sharded(model):
        return 0
    return int(world().max(int(n_local))) - int(n_local)


def idle_backward(model, share_prefix: bool) -> None:
    """One forward/backward of a 1-token dummy row with loss ``0 * sum(log-probs)``: it joins the
    other ranks' collectives and adds exactly zero to every gradient."""
    dev = next(model.parameters()).device
    one = torch.zeros(1, 1, dtype=torch.long, device=dev)
    ones = torch.ones(1, 1, device=dev)
    logp, _ = logprob_forward(model)(one, ones, one, ones, with_entropy=True, share_prefix=share_prefix)
    (logp.sum() * 0.0).backward()


def local_fraction(params) -> float:
    """Fraction of the elements of ``params`` stored on this rank: 1.0 unsharded, about ``1 / W``
    under FSDP2 (the shards of ``W`` ranks)."""
    local = total = 0
    for p in params:
        total += p.numel()
        local += p.to_local().numel() if _is_dtensor(p) else p.numel()
    return local / max(total, 1)


def clip_grad_norm_(params, max_norm: float) -> float:
    """``torch.nn.utils.clip_grad_norm_`` returning a python float; for FSDP2's sharded gradients
    the norm is that of the full gradient (a reduction over ranks)."""
    params = list(params)
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if _is_dtensor(norm):
        norm = norm.full_tensor()
    return float(norm)


def _names(model) -> list[str]:
    return [n for n, _ in model.named_parameters()]  # the optimizer's parameter order


def full_state(model, optimizer=None) -> tuple[dict, dict | None]:
    """``(model state dict, optimizer state dict)`` with full tensors on CPU, in the format of the
    unsharded run (``module.state_dict()``, ``optimizer.state_dict()`` with integer parameter
    ids). For a sharded model this all-gathers (``torch.distributed.checkpoint.state_dict``): every
    rank must call it, rank 0 gets the full dicts (on CPU) and the other ranks empty ones; the
    optimizer's FQN keys are mapped back to ids in parameter order."""
    if not is_sharded(model):
        return model.state_dict(), (optimizer.state_dict() if optimizer is not None else None)
    from torch.distributed.checkpoint.state_dict import (  # lazy: FSDP2 only (a sharded model)
        StateDictOptions, get_model_state_dict, get_optimizer_state_dict)

    # cpu_offload: each full tensor is gathered straight to rank 0's CPU (the other ranks get empty
    # dicts), so a checkpoint never holds a whole model or optimizer on one GPU
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    sd = {k: v.cpu() for k, v in get_model_state_dict(model, options=opts).items()}
    osd = None
    if optimizer is not None:
        fqn = get_optimizer_state_dict(model, optimizer, options=opts)
        fqn = {"state": fqn.get("state", {}), "param_groups": fqn.get("param_groups", [])}
        ids = {n: i for i, n in enumerate(_names(model))}
        osd = {"state": {ids[n]: {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in st.items()}
                         for n, st in fqn["state"].items()},
               "param_groups": [{**g, "params": [ids[n] for n in g["params"]]} for g in fqn["param_groups"]]}
    return sd, osd


def load_full_state(model, state: dict, optimizer=None, optimizer_state: dict | None = None) -> None:
    """Load what :func:`full_state` returned (or an unsharded run's state dicts) into ``model``
    and ``optimizer``; for a sharded model each rank keeps its shard (every rank calls it with the
    same full dicts, as each reads the same checkpoint file)."""
    if not is_sharded(model):
        model.load_state_dict(state)
        if optimizer is not None and optimizer_state is not None:
            optimizer.load_state_dict(optimizer_state)
        return
    from torch.distributed.checkpoint.state_dict import (  # lazy: FSDP2 only (a sharded model)
        StateDictOptions, set_model_state_dict, set_optimizer_state_dict)

    opts = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, state, options=opts)
    if optimizer is not None and optimizer_state is not None:
        names = _names(model)
        fqn = {"state": {names[i]: st for i, st in optimizer_state["state"].items()},
               "param_groups": [{**g, "params": [names[i] for i in g["params"]]}
                                for g in optimizer_state["param_groups"]]}
        set_optimizer_state_dict(model, optimizer, fqn, options=opts)
