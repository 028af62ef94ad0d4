"""Base facts: the base tier, shaped like the Rust agent's (``os``, ``arch``, ``hostname``,
``memory.{total,free,available,unit}`` in MB, ``loadavg.{1min,5min,15min}``, ``tags``).

Memory needs ``psutil`` (the ``psutil`` extra); without it the key is left out. Load averages come
from psutil or ``os.getloadavg``. The Rust agent detects more (tool versions, CPUs, GPUs); base
facts legitimately differ between runners.
"""

from __future__ import annotations

import os
import platform
import socket
from typing import Any

try:  # optional
    import psutil
except ImportError:  # pragma: no cover - depends on the environment
    psutil = None

_ARCH = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64", "i686": "x86", "i386": "x86"}


def os_name() -> str:
    """The OS as the Rust agent names it: ``linux``, ``darwin``, ``windows``..."""
    return platform.system().lower() or "unknown"


def arch() -> str:
    """The CPU architecture as Rust names it: ``x86_64``, ``aarch64``..."""
    machine = platform.machine().lower()
    return _ARCH.get(machine, machine)


def load_facts() -> dict[str, Any]:
    """Memory in MB and load averages; cheap enough for every refresh."""
    out: dict[str, Any] = {}
    if psutil is not None:
        vm = psutil.virtual_memory()
        mb = 1024 * 1024
        out["memory"] = {"total": vm.total // mb, "free": vm.free // mb, "available": vm.available // mb, "unit": "MB"}
    try:
        one, five, fifteen = psutil.getloadavg() if psutil is not None else os.getloadavg()
        out["loadavg"] = {"1min": round(one, 2), "5min": round(five, 2), "15min": round(fifteen, 2)}
    except (OSError, AttributeError):
        pass
    return out


def base() -> dict[str, Any]:
    """Everything the runner knows about its machine: the base tier."""
    doc: dict[str, Any] = {"os": os_name(), "arch": arch()}
    try:
        doc["hostname"] = socket.gethostname()
    except OSError:
        pass
    doc.update(load_facts())
    doc["tags"] = [doc["os"], doc["arch"]]
    return doc
