"""What this machine's CPU can do, read once from the operating system: its instruction-set flags.

Why a module of its own: two layers ask the same question (the embedder, whether torch's bfloat16
products run on AMX tiles; the engine, whether its prefill may multiply in bfloat16 and which
kernels ONNX Runtime's saved decode graph was packed for), and reading ``/proc/cpuinfo`` was
written out in each. The flags are read once per process (the file does not change while it
runs) and an unreadable file or another OS is a set of no flags, never an error: callers then
keep float32.
"""

from __future__ import annotations

import functools
from pathlib import Path

#: Where Linux lists the flags (``flags`` on x86, ``Features`` on ARM).
CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The first CPU's instruction-set flags; empty where ``cpuinfo`` is unreadable or has none."""
    return _flags(cpuinfo)


@functools.cache
def _flags(cpuinfo: Path) -> frozenset[str]:
    try:
        with cpuinfo.open() as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        return frozenset()  # not Linux, or no /proc: no flags known, so nothing assumed
    return frozenset()


def bf16_units(cpuinfo: Path = CPUINFO) -> bool:
    """True when the CPU reports AMX bfloat16 tiles (``amx_bf16``: Intel Sapphire Rapids and later),
    where torch's oneDNN multiplies bfloat16 matrices several times faster than float32."""
    return "amx_bf16" in cpu_flags(cpuinfo)
