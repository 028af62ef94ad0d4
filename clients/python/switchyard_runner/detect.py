"""Base facts: the base tier, detected as the Rust agent detects it (``agent-rs/src/detect.rs``):
``os``, ``arch``, ``hostname``, ``os_release`` (the kernel), ``linux`` (``/etc/os-release``),
``cpu.{count,model}``, ``memory.{total,free,available,unit}`` in MB, ``loadavg.{1min,5min,15min}``,
``software.<tool>`` for the tools that answer (:data:`TOOLS`, each probe time-limited), ``gpus``
from ``nvidia-smi`` (index, uuid, name, memory, driver), ``resources`` (what the runner offers:
CPU millicores, memory MB, the GPUs as devices; a tier may override or add to it), and ``tags``
derived from them. The
parsing is held to the shared vectors in ``tests/conformance/detect.json``.

:func:`base` is the cheap part (no process started); :func:`probed` starts the probes.
Memory needs ``psutil`` (the ``psutil`` extra); without it the key is left out. Load averages come
from psutil or ``os.getloadavg``.
"""

from __future__ import annotations

import asyncio
import os
import platform
import re
import socket
from typing import Any

from switchyard_runner.core.version import parse_lenient

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


TOOLS: list[tuple[str, str, list[str]]] = [
    ("git", "git", ["--version"]),
    ("clang", "clang", ["--version"]),
    ("cmake", "cmake", ["--version"]),
    ("node", "node", ["--version"]),
    ("uv", "uv", ["--version"]),
    ("scons", "scons", ["--version"]),
    ("vboxmanage", "vboxmanage", ["--version"]),
    ("deno", "deno", ["--version"]),
    ("python3", "python3", ["--version"]),
    ("docker", "docker", ["--version"]),
    ("cargo", "cargo", ["--version"]),
    ("rustc", "rustc", ["--version"]),
    ("go", "go", ["version"]),
    ("java", "java", ["-version"]),
    ("gcc", "gcc", ["--version"]),
]
"""The tools probed: (name, program, the arguments that print its version)."""

NVIDIA_SMI_ARGS = ["--query-gpu=index,uuid,name,memory.total,driver_version", "--format=csv,noheader,nounits"]
"""The query ``nvidia-smi`` answers, one GPU a row."""

_SEPARATORS = re.compile(r'[\s",()]')
_TRAILING = re.compile(r"[^A-Za-z0-9]+$")
_DIGITS = "0123456789"


def _strip_prefix_all(text: str, prefix: str) -> str:
    while prefix and text.startswith(prefix):
        text = text[len(prefix) :]
    return text


def _is_version(token: str) -> bool:
    first = token.split(".", 1)[0]
    return bool(first) and all(c in _DIGITS for c in first) and "." in token


def version_in(output: str) -> str | None:
    """The first version-looking token of a tool's output (``git version 2.39.5`` → ``2.39.5``,
    ``v20.11.1`` → ``20.11.1``, ``go1.22.1`` → ``1.22.1``)."""
    for line in output.splitlines():
        for tok in _SEPARATORS.split(line):
            t = _strip_prefix_all(_strip_prefix_all(tok, "v"), "go")
            if _is_version(t):
                return _TRAILING.sub("", t)
    return None


def software_entry(version_text: str) -> dict[str, Any]:
    """``{version, major_version, minor_version, patch_version}`` as the core's ``software_entry``."""
    entry: dict[str, Any] = {"version": version_text}
    parsed = parse_lenient(version_text)
    if parsed is not None:
        entry["major_version"], entry["minor_version"], entry["patch_version"] = parsed[:3]
    return entry


def os_release(text: str) -> dict[str, Any]:
    """``/etc/os-release`` as SheetBot reports it."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            fields[k.strip()] = v.strip().strip('"')
    out: dict[str, Any] = {}
    for key, name in (("NAME", "name"), ("PRETTY_NAME", "pretty_name"), ("VERSION_CODENAME", "versionCodename")):
        if key in fields:
            out[name] = fields[key]
    if "VERSION_ID" in fields:
        out["versionId"] = fields["VERSION_ID"]
        out["release"] = software_entry(fields["VERSION_ID"])
    return out


def _number(text: str) -> int | None:
    return int(text) if text and all(c in _DIGITS for c in text) else None


def parse_nvidia_smi(output: str) -> list[dict[str, Any]]:
    """GPUs from ``nvidia-smi``'s rows (``index, uuid, name, memory MB, driver``); a row of another
    shape is left out, an unreadable number is ``None``."""
    gpus = []
    for line in output.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 5:
            gpus.append(
                {
                    "index": _number(parts[0]),
                    "uuid": parts[1],
                    "name": parts[2],
                    "memory_mb": _number(parts[3]),
                    "driver": parts[4],
                }
            )
    return gpus


def resources(cpu_count: int, memory_total_mb: int | None, gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """What the runner offers: ``cpu_millicores`` (1,000 a CPU) and ``memory_mb`` when known, and
    every GPU as a device (``index``, ``uuid``, ``model``, ``memory_mb``)."""
    out: dict[str, Any] = {}
    if cpu_count > 0:
        out["cpu_millicores"] = cpu_count * 1000
    if memory_total_mb is not None:
        out["memory_mb"] = memory_total_mb
    out["gpus"] = [
        {"index": g.get("index"), "uuid": g.get("uuid"), "model": g.get("name"), "memory_mb": g.get("memory_mb")}
        for g in gpus
    ]
    return out


def tags(os_: str, arch_: str, software: dict[str, Any], gpus: int) -> list[str]:
    """The tags detection derives: OS and architecture, ``docker``, ``gpu`` and ``nvidia``."""
    out = [os_, arch_]
    if "docker" in software:
        out.append("docker")
    if gpus > 0:
        out += ["gpu", "nvidia"]
    return out


async def _run(program: str, args: list[str], timeout: float) -> str | None:
    """The program's standard output and error, or ``None`` if it is missing, fails or hangs."""
    try:
        proc = await asyncio.create_subprocess_exec(
            program,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError:
        return None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        return None
    if proc.returncode != 0:
        return None
    # Some tools (java) print their version on standard error.
    return out.decode(errors="replace") + "\n" + err.decode(errors="replace")


async def software(timeout: float = 5.0) -> dict[str, Any]:
    """Tool versions, probed concurrently (each with its own timeout)."""

    async def one(name: str, program: str, args: list[str]) -> tuple[str, str | None]:
        output = await _run(program, args, timeout)
        return name, version_in(output) if output is not None else None

    found = await asyncio.gather(*(one(*tool) for tool in TOOLS))
    return {name: software_entry(version) for name, version in sorted(found) if version is not None}


async def nvidia_gpus(timeout: float = 5.0) -> list[dict[str, Any]]:
    """NVIDIA GPUs from ``nvidia-smi``, if it answers."""
    output = await _run("nvidia-smi", NVIDIA_SMI_ARGS, timeout)
    return parse_nvidia_smi(output) if output is not None else []


def _cpu() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        model = platform.processor().strip()
    return {"count": os.cpu_count() or 0, "model": model}


async def probed(timeout: float = 5.0) -> dict[str, Any]:
    """What the probes find: ``software``, ``gpus`` (when any), and the ``resources`` and ``tags``
    derived from them."""
    found, gpus = await asyncio.gather(software(timeout), nvidia_gpus(timeout))
    memory_total = load_facts().get("memory", {}).get("total")
    out: dict[str, Any] = {
        "software": found,
        "resources": resources(_cpu()["count"], memory_total, gpus),
        "tags": tags(os_name(), arch(), found, len(gpus)),
    }
    if gpus:
        out["gpus"] = gpus
    return out


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
    """What the runner knows about its machine without starting a process (the base tier before
    :func:`probed` adds tools, GPUs and their tags)."""
    doc: dict[str, Any] = {"os": os_name(), "arch": arch()}
    try:
        doc["hostname"] = socket.gethostname()
    except OSError:
        pass
    if platform.release():
        doc["os_release"] = software_entry(platform.release())
    try:
        with open("/etc/os-release", encoding="utf-8") as f:
            doc["linux"] = os_release(f.read())
    except OSError:
        pass
    doc["cpu"] = _cpu()
    doc.update(load_facts())
    doc["tags"] = [doc["os"], doc["arch"]]
    return doc
