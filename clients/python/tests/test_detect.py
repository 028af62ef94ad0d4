"""Detection as the Rust agent does it, held to the shared vectors (``tests/conformance/detect.json``):
the tool list, version parsing, ``software`` entries, ``/etc/os-release``, ``nvidia-smi`` rows, the
resources offered and the derived tags; and a real probe of this machine finds the Python running the tests."""

from __future__ import annotations

import json
import pathlib
import sys

from switchyard_runner import detect

VECTORS = json.loads(
    (pathlib.Path(__file__).resolve().parents[3] / "tests" / "conformance" / "detect.json").read_text()
)


def test_the_tool_list_is_the_rust_agents() -> None:
    assert [[n, p, a] for n, p, a in detect.TOOLS] == VECTORS["tools"]


def test_versions_in_tool_output() -> None:
    for case in VECTORS["version_in"]:
        assert detect.version_in(case["output"]) == case["version"], case["output"]


def test_software_entries() -> None:
    for case in VECTORS["software_entry"]:
        assert detect.software_entry(case["version"]) == case["expected"], case["version"]


def test_os_release() -> None:
    for case in VECTORS["os_release"]:
        assert detect.os_release(case["text"]) == case["expected"], case["text"]


def test_nvidia_smi_rows() -> None:
    for case in VECTORS["nvidia_smi"]:
        assert detect.parse_nvidia_smi(case["output"]) == case["expected"], case["output"]


def test_resources() -> None:
    for case in VECTORS["resources"]:
        got = detect.resources(case["cpu_count"], case["memory_total_mb"], case["gpus"])
        assert got == case["expected"], case


def test_tags() -> None:
    for case in VECTORS["tags"]:
        software = {name: {} for name in case["software"]}
        assert detect.tags(case["os"], case["arch"], software, case["gpus"]) == case["expected"]


async def test_probes_find_the_tools_that_answer() -> None:
    found = await detect.probed(timeout=10.0)
    # python3 runs these tests' interpreter family; its version is reported.
    python3 = found["software"].get("python3")
    assert python3 is not None
    assert python3["major_version"] == 3
    assert found["tags"][:2] == [detect.os_name(), detect.arch()]
    assert ("gpus" in found) == ("gpu" in found["tags"])
    assert found["resources"]["cpu_millicores"] >= 1000
    assert len(found["resources"]["gpus"]) == len(found.get("gpus", []))
    base = detect.base()
    assert base["cpu"]["count"] >= 1
    assert sys.platform != "linux" or "linux" in base
