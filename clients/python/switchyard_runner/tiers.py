"""The capability tiers of an agent directory, read as SheetBot agents (and the Rust agent) read them.

``.capabilities.json`` (static), the output of ``.capabilities.dynamic.py`` (dynamic;
``getCapabilities(static)`` is called in a child process with a timeout), and
``.capabilities.override.json``, merged over the base facts by the core and redacted. A file that
cannot be used is a rejection and is skipped, never fatal; missing files are ignored.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import sys
from dataclasses import dataclass, field

from switchyard.core import redact
from switchyard.core.json_util import JSON, kind
from switchyard.core.limits import Limits
from switchyard.core.tier import Merged, Rejection, Tier, merge_tiers

STATIC_FILE = ".capabilities.json"
OVERRIDE_FILE = ".capabilities.override.json"
DYNAMIC_FILE = ".capabilities.dynamic.py"

_DYNAMIC_SHIM = """\
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location('capabilities', sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
caps = module.getCapabilities(json.loads(sys.argv[2]))
sys.stdout.write('\\n' + json.dumps(caps) + '\\n')
"""


@dataclass
class DirectoryTiers:
    """The tiers read from a directory, before merging."""

    static_tier: JSON = None
    """``.capabilities.json``, if present and valid JSON."""
    dynamic_tier: JSON = None
    """The dynamic script's output, if it ran successfully."""
    override_tier: JSON = None
    """``.capabilities.override.json``, if present and valid JSON."""
    rejections: list[Rejection] = field(default_factory=list)
    """Files that exist but could not be used."""


def _read_json(path: pathlib.Path, tier: Tier, tiers: DirectoryTiers) -> JSON:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as err:
        tiers.rejections.append(Rejection(tier, "", f"reading {path}: {err}"))
        return None
    try:
        return json.loads(text)
    except ValueError as err:
        tiers.rejections.append(Rejection(tier, "", f"{path} is not valid JSON: {err}"))
        return None


def parse_output(stdout: str) -> JSON:
    """The JSON a script printed: all of its output, or else its last line that is an object."""
    try:
        return json.loads(stdout.strip())
    except ValueError:
        pass
    for line in reversed(stdout.splitlines()):
        try:
            value = json.loads(line.strip())
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


async def run_dynamic(directory: pathlib.Path, script: pathlib.Path, static: JSON, timeout: float) -> JSON:
    """Runs ``getCapabilities(static)`` of a Python script in a child process.

    Raises :class:`ScriptRejected` when it fails, hangs past ``timeout`` seconds, or prints no
    JSON object.
    """
    name = script.name
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _DYNAMIC_SHIM, str(script), json.dumps(static),
            cwd=str(directory), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
    except OSError as err:
        raise ScriptRejected(f"{name} could not be started: {err}") from err
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise ScriptRejected(f"{name} timed out after {timeout:g}s") from None
    if proc.returncode != 0:
        tail = " | ".join(stderr.decode(errors="replace").splitlines()[-3:])
        raise ScriptRejected(f"{name} failed (exit status: {proc.returncode}): {tail}")
    value = parse_output(stdout.decode(errors="replace"))
    if value is None:
        raise ScriptRejected(f"{name} printed no JSON object")
    if not isinstance(value, dict):
        raise ScriptRejected(f"{name} returned {kind(value)}, not an object")
    return value


class ScriptRejected(Exception):
    """A dynamic script that could not be used; its message is the rejection reason."""


async def read_directory(directory: pathlib.Path, script_timeout: float = 10.0) -> DirectoryTiers:
    """Reads the static, dynamic and override tiers of ``directory``."""
    tiers = DirectoryTiers()
    tiers.static_tier = _read_json(directory / STATIC_FILE, Tier.STATIC, tiers)
    script = directory / DYNAMIC_FILE
    if script.is_file():
        static = tiers.static_tier if tiers.static_tier is not None else {}
        try:
            tiers.dynamic_tier = await run_dynamic(directory, script, static, script_timeout)
        except ScriptRejected as err:
            tiers.rejections.append(Rejection(Tier.DYNAMIC, "", str(err)))
    tiers.override_tier = _read_json(directory / OVERRIDE_FILE, Tier.OVERRIDE, tiers)
    return tiers


def stamps(directory: pathlib.Path) -> list[tuple[int, int] | None]:
    """Modification time and size of each tier file, to notice changes."""
    out: list[tuple[int, int] | None] = []
    for name in (STATIC_FILE, OVERRIDE_FILE, DYNAMIC_FILE):
        try:
            st = os.stat(directory / name)
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return out


def merge(base: dict, tiers: DirectoryTiers, runtime: dict | None = None, limits: Limits | None = None) -> Merged:
    """Merges base facts and a directory's tiers, then redacts, exactly as the Rust agent does.

    Tags derived by detection apply only when no tier sets ``tags`` itself. ``runtime`` holds
    values set through the runner's API; they merge into the dynamic tier (over the script's
    output), since they are facts the running program found.
    """
    base = dict(base)
    dynamic = tiers.dynamic_tier
    if runtime:
        dynamic = merge_tiers([(Tier.DYNAMIC, dynamic or {}), (Tier.DYNAMIC, runtime)]).document
    layers = [(Tier.STATIC, tiers.static_tier), (Tier.DYNAMIC, dynamic), (Tier.OVERRIDE, tiers.override_tier)]
    if any(isinstance(v, dict) and "tags" in v for _, v in layers):
        base.pop("tags", None)
    merged = merge_tiers([(Tier.BASE, base)] + [(t, v) for t, v in layers if v is not None], limits)
    merged.rejections[0:0] = list(tiers.rejections)
    redact.redact(merged.document, redact.declared_sensitive(tiers.static_tier))
    return merged
