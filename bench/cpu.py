"""CPU time from /proc: of one process, and of the whole machine (Linux only; None elsewhere or
for a process that is not on this machine)."""

from __future__ import annotations

import os
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float | None:
    """User and system CPU of a process so far, in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


def machine_cpu() -> float | None:
    """CPU all cores of this machine have spent so far, in seconds: user, nice, system and
    interrupts (not idle, I/O wait or time stolen by the host)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[1:8])
    return (user + nice + system + irq + softirq) / TICK
