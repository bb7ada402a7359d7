"""Peak memory of a phase: CUDA allocator peak on GPU, resident-set high-water mark on CPU."""

from __future__ import annotations

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
