"""The cores this process may use: its CPU affinity (a container's or ``taskset``'s limit), not the machine's count."""
from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores this process may run on (≥ 1): ``os.sched_getaffinity`` where the OS has it, else ``os.cpu_count()``."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)
