"""The C allocator's settings for a training process (glibc ``mallopt``).

By default glibc serves every allocation above a moving threshold (128 KiB at first, raised to
the size of each freed mmapped block, at most 32 MiB) with a fresh ``mmap`` and returns it to the
system on ``free``, and returns heap memory above ``M_TRIM_THRESHOLD`` (128 KiB) on ``free``.
A rollout allocates and frees tensors of 1-30 MiB at every decoded token (logits, the KV cache's
growth), so each of those is a new mapping whose pages fault in again when written. Fixing the
mmap threshold at glibc's maximum (32 MiB on 64-bit) and the trim threshold at 1 GiB keeps those
blocks in the heap for reuse: on a 2-core CPU it cut the hf rollout of a G=16 ``preset=arith_cpu``
step by more than a quarter, peak RSS unchanged (results/benchmarks.md gives the figures, the
machine and the date). It changes where memory comes from, never a value. PyTorch's CPU
performance guide recommends a caching allocator (jemalloc / tcmalloc) for the same reason; this
is the glibc-only equivalent, with no extra install.

Environment variables win: a process started with ``MALLOC_MMAP_THRESHOLD_`` or
``MALLOC_TRIM_THRESHOLD_`` set (glibc's own tunables) keeps them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD = 32 << 20  # glibc's largest (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)
TRIM_THRESHOLD = 1 << 30
ENV = {M_MMAP_THRESHOLD: "MALLOC_MMAP_THRESHOLD_", M_TRIM_THRESHOLD: "MALLOC_TRIM_THRESHOLD_"}
# what the last tune_malloc() set in this process; a run records it as its malloc.* tags
APPLIED: dict[str, int] = {}


def tune_malloc() -> dict[str, int]:
    """Set glibc's mmap and trim thresholds (module docstring) for this process.

    Returns:
        ``{setting: bytes}`` of what was set: empty where the C library is not glibc (no
        ``gnu_get_libc_version``: musl, macOS, Windows), and without a setting its environment
        variable already gives.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return {}
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return {}
    done: dict[str, int] = {}
    for param, value in ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        if ENV[param] not in os.environ and libc.mallopt(ctypes.c_int(param), ctypes.c_int(value)) == 1:
            done[ENV[param].strip("_").lower()] = value
    APPLIED.clear()
    APPLIED.update(done)
    return done
