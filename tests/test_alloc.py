"""glibc's allocator thresholds (harness/runtime/alloc.py)."""

import ctypes
import ctypes.util

import pytest

from harness.runtime import alloc


def _glibc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") else None


@pytest.mark.skipif(_glibc() is None, reason="the C library is not glibc")
def test_tune_malloc_sets_both_thresholds_and_leaves_the_environments(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    assert alloc.tune_malloc() == {"malloc_mmap_threshold": 32 << 20, "malloc_trim_threshold": 1 << 30}
    assert alloc.APPLIED == {"malloc_mmap_threshold": 32 << 20, "malloc_trim_threshold": 1 << 30}
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")  # the user's tunable wins
    assert alloc.tune_malloc() == {"malloc_trim_threshold": 1 << 30} == alloc.APPLIED


def test_tune_malloc_does_nothing_without_glibc(monkeypatch):
    class NotGlibc:  # musl / macOS: no gnu_get_libc_version
        def mallopt(self, *a):
            raise AssertionError("mallopt called on a C library that is not glibc")

    monkeypatch.setattr(alloc.ctypes, "CDLL", lambda name: NotGlibc())
    assert alloc.tune_malloc() == {}
