"""Peak memory of a phase (CUDA allocator peak on GPU, resident-set high-water mark on CPU) and the
process's age (start-up cost: interpreter, imports, config composition)."""

from __future__ import annotations

import os
import resource

import torch


class PeakMemory:
    """Measure peak memory (bytes) between :meth:`reset` and :meth:`read`.

    CPU: Linux ``VmHWM`` from ``/proc/self/status``, reset by writing ``5`` to
    ``/proc/self/clear_refs``; where that is not allowed the process-lifetime
    ``ru_maxrss`` is reported instead. CUDA: ``torch.cuda.max_memory_allocated``.
    """

    def __init__(self):
        self.cuda = torch.cuda.is_available()

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass

    def read(self) -> int:
        if self.cuda:
            return int(torch.cuda.max_memory_allocated())
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: ``/proc/self/stat`` field 22, the start time in
    clock ticks after boot, against ``/proc/uptime``); None where ``/proc`` is not available."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 is the 20th after the name
