"""sha256 digests of tensors (the provenance of weights, the base an adapter folder was trained on)."""

from __future__ import annotations

import hashlib

import torch


def tensors_sha256(tensors: dict) -> str:
    """sha256 over ``{name: tensor}``: each tensor's name, dtype, shape and bytes, in name order.

    Returns: 64 hex digits; equal for equal names, dtypes, shapes and bits (device-independent)."""
    h = hashlib.sha256()
    for name, t in sorted(tensors.items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(-1).view(dtypes_as_bytes(t)).numpy().tobytes())
    return h.hexdigest()


def dtypes_as_bytes(t: torch.Tensor) -> torch.dtype:
    """An integer dtype of ``t``'s element size (numpy has no bfloat16: its bits are read as int16)."""
    return torch.uint8 if t.element_size() == 1 else {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
