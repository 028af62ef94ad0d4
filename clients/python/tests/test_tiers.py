"""Reading an agent directory: SheetBot's conventions, and scripts that fail or hang."""

from __future__ import annotations

import json
import pathlib

from switchyard.capabilities import Capabilities
from switchyard.core.tier import Tier
from switchyard.tiers import parse_output, read_directory


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
