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

Backends: ``gloo`` on CPU; with CUDA the process group is ``cuda:nccl,cpu:gloo`` (collectives
dispatch by tensor device). Only the CPU/gloo path is tested here (no GPU in CI).

Without ``torchrun`` (no ``WORLD_SIZE`` > 1 in the environment) :func:`world` is a one-rank world
whose collectives return their input, so the single-process code path is the same code.
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)


@dataclass
class World:
    """This process's place in the job.

    Attributes:
        rank: global rank (0 .. world_size - 1); rank 0 alone tracks and writes checkpoints.
        world_size: number of processes.
        local_rank: rank on this node (selects the CUDA device).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

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
        rows were all filtered out still takes part)."""
        if not self.distributed:
            return
        params = [p for p in params if p.requires_grad]
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


def init(timeout_s: float = 1800.0) -> World:
    """Join the process group ``torchrun`` describes in the environment, once.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (and ``MASTER_ADDR``/``MASTER_PORT`` through the
    ``env://`` rendezvous). Without ``WORLD_SIZE`` > 1 it returns the one-rank world.

    Raises:
        RuntimeError: from ``init_process_group`` when the rendezvous fails.
    """
    global _WORLD
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return _WORLD
    if not torch.distributed.is_initialized():
        backend = "cuda:nccl,cpu:gloo" if torch.cuda.is_available() else "gloo"
        torch.distributed.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
        log.info("rank %s/%d joined the process group (%s)", os.environ.get("RANK"), size, backend)
    _WORLD = World(rank=torch.distributed.get_rank(), world_size=torch.distributed.get_world_size(),
                   local_rank=int(os.environ.get("LOCAL_RANK", "0")))
    return _WORLD


def shutdown() -> None:
    """Leave the process group (end of a run)."""
    global _WORLD
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    _WORLD = World()
