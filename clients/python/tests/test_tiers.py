"""Reading an agent directory: SheetBot's conventions, and scripts that fail or hang."""

from __future__ import annotations

import asyncio
import json
import pathlib
import shutil
import time

import pytest

from switchyard_runner.capabilities import Capabilities
from switchyard_runner.core.tier import Tier
from switchyard_runner.tiers import parse_output, read_directory


def test_output_with_log_lines_still_parses() -> None:
    assert parse_output('detecting...\n{"a": 1}\n') == {"a": 1}
    assert parse_output('{"a": 1}') == {"a": 1}
    assert parse_output("nothing here") is None


async def test_hanging_script_is_a_rejection_not_a_hang(tmp_path: pathlib.Path) -> None:
    (tmp_path / ".capabilities.json").write_text(json.dumps({"a": 1}))
    (tmp_path / ".capabilities.dynamic.py").write_text("import time\ndef getCapabilities(s):\n    time.sleep(60)\n")
    tiers = await read_directory(tmp_path, script_timeout=0.5)
    assert tiers.static_tier == {"a": 1}
    assert tiers.dynamic_tier is None
    assert [(r.tier, r.path) for r in tiers.rejections] == [(Tier.DYNAMIC, "")]
    assert "timed out" in tiers.rejections[0].reason


async def test_script_returning_a_non_object_is_rejected(tmp_path: pathlib.Path) -> None:
    (tmp_path / ".capabilities.dynamic.py").write_text("def getCapabilities(s):\n    return [1, 2]\n")
    tiers = await read_directory(tmp_path)
    assert "not an object" in tiers.rejections[0].reason


async def test_static_tags_replace_detected_tags_and_runtime_values_merge(tmp_path: pathlib.Path) -> None:
    caps = await Capabilities(tmp_path).load()
    # The detected tags: OS and architecture first, then what the probes found.
    assert caps.document["tags"] == caps.detected["tags"]
    assert caps.document["tags"][:2] == [caps.document["os"], caps.document["arch"]]
    assert caps.merged.provenance["tags"] == Tier.BASE
    caps.set_runtime({"tags": ["x"], "tool": {"version": "1"}})
    assert caps.document["tags"] == ["x"]
    assert caps.merged.provenance["tool.version"] == Tier.DYNAMIC
    caps.set_runtime({"tool": None})
    assert "tool" not in caps.document


async def test_changed_override_file_is_reread(tmp_path: pathlib.Path) -> None:
    override = tmp_path / ".capabilities.override.json"
    override.write_text('{"x": 1}')
    caps = await Capabilities(tmp_path).load()
    override.write_text('{"x": 22}')
    assert await caps.refresh()
    assert caps.document["x"] == 22


# One script per kind the Rust agent runs (agent-rs/src/tiers.rs), each printing a log line
# first and returning the static tier it was handed.
SCRIPTS = {
    "sh": 'getCapabilities() {\n  echo "probing..."\n  printf \'{"lang": "sh", "static": %s}\\n\' "$1"\n}\n',
    "py": "def getCapabilities(static):\n    print('probing...')\n    return {'lang': 'py', 'static': static}\n",
    "mjs": "export async function getCapabilities(s) {\n  console.log('probing...');\n  return { lang: 'mjs', static: s };\n}\n",
    "js": "exports.getCapabilities = async (s) => ({ lang: 'js', static: s });\n",
}


@pytest.mark.parametrize("ext", sorted(SCRIPTS))
async def test_every_dynamic_script_kind_the_rust_agent_runs_is_run(tmp_path: pathlib.Path, ext: str) -> None:
    (tmp_path / ".capabilities.json").write_text(json.dumps({"a": 1, "name": "ünï"}))
    (tmp_path / f".capabilities.dynamic.{ext}").write_text(SCRIPTS[ext])
    tiers = await read_directory(tmp_path)
    assert tiers.rejections == []
    assert tiers.dynamic_tier == {"lang": ext, "static": {"a": 1, "name": "ünï"}}


async def test_a_typescript_script_runs_under_deno_or_is_a_rejection_naming_it(tmp_path: pathlib.Path) -> None:
    (tmp_path / ".capabilities.dynamic.ts").write_text(
        "export function getCapabilities(s: object): object {\n  return { lang: 'ts' };\n}\n"
    )
    caps = await Capabilities(tmp_path).load()
    if shutil.which("deno"):
        assert caps.document["lang"] == "ts"
    else:
        assert [(r.tier, r.path, r.reason) for r in caps.merged.rejections] == [
            (Tier.DYNAMIC, "", ".capabilities.dynamic.ts needs deno, which is not installed (not on PATH)")
        ]


async def test_the_first_script_in_the_rust_agents_order_runs_and_edits_to_any_are_noticed(tmp_path: pathlib.Path) -> None:
    for ext in ("py", "sh"):
        (tmp_path / f".capabilities.dynamic.{ext}").write_text(SCRIPTS[ext])
    caps = await Capabilities(tmp_path).load()
    assert caps.document["lang"] == "sh"
    (tmp_path / ".capabilities.dynamic.sh").unlink()
    assert await caps.refresh()
    assert caps.document["lang"] == "py"


async def test_a_hanging_shell_script_is_killed_with_what_it_started(tmp_path: pathlib.Path) -> None:
    pid_file = tmp_path / "sleep.pid"
    (tmp_path / ".capabilities.dynamic.sh").write_text(
        f'getCapabilities() {{\n  sleep 60 &\n  echo $! > "{pid_file}"\n  wait\n}}\n'
    )
    started = time.monotonic()
    tiers = await read_directory(tmp_path, script_timeout=0.5)
    assert time.monotonic() - started < 10
    assert "timed out" in tiers.rejections[0].reason
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    # Nothing to await: the orphaned child is reaped by init, seen only in /proc.
    while process_state(pid) not in (None, "Z") and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert process_state(pid) in (None, "Z"), "the script's child outlived it"


def process_state(pid: int) -> str | None:
    """The state letter of a process (``Z`` for a zombie), or ``None`` once it is gone."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except (FileNotFoundError, ProcessLookupError):
        return None
