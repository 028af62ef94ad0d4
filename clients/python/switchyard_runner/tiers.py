"""The capability tiers of an agent directory, read as SheetBot agents (and the Rust agent) read them.

``.capabilities.json`` (static), the output of the first of ``.capabilities.dynamic.{sh,py,mjs,js,ts}``
(dynamic; ``getCapabilities(static)`` is called in a child process, in the agent directory, with a
timeout), and ``.capabilities.override.json``, merged over the base facts by the core and redacted.
A file that cannot be used is a rejection and is skipped, never fatal; missing files are ignored.

Each script kind runs as the Rust agent runs it: ``.sh`` sourced by ``bash`` and its
``getCapabilities "$STATIC"`` function's output read, ``.mjs`` and ``.js`` imported by ``node``,
``.ts`` by ``deno``, ``.py`` loaded by Python — this runner's own interpreter
(``sys.executable``), so a script may import what the runner's environment has, where the Rust
agent and the Node runner take ``python3`` from ``PATH``. An interpreter that is not installed is a
rejection naming it. A script that outlives its timeout is killed with everything it started.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
import sys
from dataclasses import dataclass, field

from switchyard_runner.core import redact
from switchyard_runner.core.json_util import JSON, kind
from switchyard_runner.core.limits import Limits
from switchyard_runner.core.tier import Merged, Rejection, Tier, merge_tiers

STATIC_FILE = ".capabilities.json"
OVERRIDE_FILE = ".capabilities.override.json"
DYNAMIC_EXTENSIONS = ("sh", "py", "mjs", "js", "ts")
"""The dynamic-script extensions, in the order they are looked for (the first found runs)."""

_PY_LOADER = """\
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location('capabilities', sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
caps = module.getCapabilities(json.loads(sys.argv[2]))
sys.stdout.write('\\n' + json.dumps(caps) + '\\n')
"""

_NODE_LOADER = """\
import { pathToFileURL } from 'node:url';
const [file, staticJson] = process.argv.slice(-2);
const mod = await import(pathToFileURL(file).href);
const caps = await mod.getCapabilities(JSON.parse(staticJson));
process.stdout.write('\\n' + JSON.stringify(caps) + '\\n');"""

_DENO_LOADER = """\
const [file, staticJson] = Deno.args;
const mod = await import(new URL(file, 'file://').href);
const caps = await mod.getCapabilities(JSON.parse(staticJson));
console.log('\\n' + JSON.stringify(caps));"""


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


def dynamic_script(directory: pathlib.Path) -> pathlib.Path | None:
    """The dynamic script in ``directory``, if any (the first of :data:`DYNAMIC_EXTENSIONS`)."""
    for ext in DYNAMIC_EXTENSIONS:
        script = directory / f".capabilities.dynamic.{ext}"
        if script.is_file():
            return script
    return None


def script_command(script: pathlib.Path, static_json: str) -> list[str] | None:
    """The command that runs ``script`` (by its extension) with the static tier; ``None`` for an
    extension no runner runs."""
    path = str(script)
    ext = script.suffix.removeprefix(".")
    if ext == "sh":
        return ["bash", "-c", 'source "$1" && getCapabilities "$2"', "switchyard-dynamic", path, static_json]
    if ext == "py":
        return [sys.executable or "python3", "-c", _PY_LOADER, path, static_json]
    if ext in ("mjs", "js"):
        return ["node", "--input-type=module", "-e", _NODE_LOADER, path, static_json]
    if ext == "ts":
        return ["deno", "eval", "--ext=ts", _DENO_LOADER, "--", path, static_json]
    return None


def _exit_text(code: int) -> str:
    """A child's end as the Rust agent words it (``exit status: 1``, ``signal: 9 (SIGKILL)``)."""
    if code >= 0:
        return f"exit status: {code}"
    try:
        return f"signal: {-code} ({signal.Signals(-code).name})"
    except ValueError:
        return f"signal: {-code}"


async def run_dynamic(directory: pathlib.Path, script: pathlib.Path, static: JSON, timeout: float) -> JSON:
    """Runs ``getCapabilities(static)`` of a dynamic script in a child process in ``directory``.

    Raises :class:`ScriptRejected` when it cannot be run, fails, hangs past ``timeout`` seconds
    (it is killed with its whole process group), or prints no JSON object.
    """
    name = script.name
    # The script runs in `directory`, so it is handed by its absolute path: a relative one
    # would be resolved from `directory` again.
    command = script_command(script.absolute(), json.dumps(static, separators=(",", ":"), ensure_ascii=False))
    if command is None:
        raise ScriptRejected(f"{script} is not a supported script")
    try:
        proc = await asyncio.create_subprocess_exec(
            *command, cwd=str(directory), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )
    except FileNotFoundError as err:
        if err.filename == command[0]:
            raise ScriptRejected(f"{name} needs {command[0]}, which is not installed (not on PATH)") from err
        raise ScriptRejected(f"{name} could not be started: {err}") from err
    except OSError as err:
        raise ScriptRejected(f"{name} could not be started: {err}") from err
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        _kill_group(proc)
        await proc.wait()
        raise ScriptRejected(f"{name} timed out after {timeout:g}s") from None
    finally:
        if proc.returncode is None:  # cancelled: leave nothing running
            _kill_group(proc)
    if proc.returncode != 0:
        tail = " | ".join(stderr.decode(errors="replace").splitlines()[-3:])
        raise ScriptRejected(f"{name} failed ({_exit_text(proc.returncode)}): {tail}")
    value = parse_output(stdout.decode(errors="replace"))
    if value is None:
        raise ScriptRejected(f"{name} printed no JSON object")
    if not isinstance(value, dict):
        raise ScriptRejected(f"{name} returned {kind(value)}, not an object")
    return value


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """Kills the script and whatever it started (it leads a session of its own)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class ScriptRejected(Exception):
    """A dynamic script that could not be used; its message is the rejection reason."""


async def read_directory(directory: pathlib.Path, script_timeout: float = 10.0) -> DirectoryTiers:
    """Reads the static, dynamic and override tiers of ``directory``."""
    tiers = DirectoryTiers()
    tiers.static_tier = _read_json(directory / STATIC_FILE, Tier.STATIC, tiers)
    script = dynamic_script(directory)
    if script is not None:
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
    for name in (STATIC_FILE, OVERRIDE_FILE, *(f".capabilities.dynamic.{ext}" for ext in DYNAMIC_EXTENSIONS)):
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
