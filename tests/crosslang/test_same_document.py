"""The Rust agent, the Python runner and the Node runner merge one agent directory alike,
whatever the language of its dynamic script, and take it by a relative path alike.

Base facts legitimately differ between runners, so the comparison covers every leaf whose
provenance is not ``base`` (its path, tier and value), the redacted paths, and the tier
rejections. Add a runner by adding a function to ``RUNNERS`` that returns its
``(document, provenance)`` for a directory; add a dynamic-script language with a script in
``fixtures.SCRIPTS``.

Run with the project venv's pytest (``switchyard-runner`` installed) and
``SWITCHYARD_AGENT_BIN`` pointing at the Rust agent (default ``target/debug/switchyard-agent``).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Callable

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from fixtures import DYNAMIC_OUTPUT, SCRIPTS, build_agent_dir  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
Explained = tuple[dict, dict[str, str], list[tuple[str, str]]]
"""(document, provenance path → tier, rejections as (tier, path))."""

_LINE = re.compile(r"^(\S+)\s.*\[(base|static|dynamic|override|operator)\]$")
_REJECTED = re.compile(r"^rejected \[(\S+)\] (.*?): ")


def agent_binary() -> pathlib.Path:
    explicit = os.environ.get("SWITCHYARD_AGENT_BIN")
    path = pathlib.Path(explicit) if explicit else REPO / "target" / "debug" / "switchyard-agent"
    if not path.exists():
        pytest.fail(f"{path} not found: run `cargo build -p switchyard-agent` first")
    return path


def parse_explain(text: str) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """Provenance and rejections from ``capabilities --explain`` output (both runners print it)."""
    provenance: dict[str, str] = {}
    rejections: list[tuple[str, str]] = []
    for line in text.splitlines():
        if m := _REJECTED.match(line):
            rejections.append((m.group(1), "" if m.group(2) == "(whole tier)" else m.group(2)))
        elif m := _LINE.match(line):
            provenance[m.group(1)] = m.group(2)
    return provenance, rejections


def explain_with(command: list[str], directory: pathlib.Path) -> Explained:
    def run(*extra: str) -> str:
        out = subprocess.run(
            [*command, "--dir", str(directory), "capabilities", *extra],
            capture_output=True, text=True, timeout=60,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    document = json.loads(run())
    provenance, rejections = parse_explain(run("--explain"))
    return document, provenance, rejections


def rust_agent(directory: pathlib.Path) -> Explained:
    return explain_with([str(agent_binary())], directory)


def python_runner(directory: pathlib.Path) -> Explained:
    return explain_with([sys.executable, "-m", "switchyard_runner"], directory)


def node_runner(directory: pathlib.Path) -> Explained:
    """The Node runner's CLI prints ``--explain`` as JSON: document, provenance, rejections."""
    out = subprocess.run(
        ["node", str(REPO / "clients" / "node" / "src" / "cli.js"), "capabilities", "--dir", str(directory),
         "--explain"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    explained = json.loads(out.stdout)
    rejections = [(r.get("tier") or "-", r.get("path", "")) for r in explained["rejections"]]
    return explained["document"], explained["provenance"], rejections


RUNNERS: dict[str, Callable[[pathlib.Path], Explained]] = {
    "python": python_runner,
    "node": node_runner,
}
"""Runner name → how to get its explained document for a directory."""

CLIS: dict[str, list[str]] = {
    "rust": [],
    "python": [sys.executable, "-m", "switchyard_runner"],
    "node": ["node", str(REPO / "clients" / "node" / "src" / "cli.js")],
}
"""Each runner's command line, before ``--dir D capabilities`` (the Rust agent's is filled in by
:func:`cli`, as its binary is found only when a test runs)."""


def cli(runner: str) -> list[str]:
    return CLIS[runner] or [str(agent_binary())]


def lookup(doc: object, path: str) -> object:
    """The value at a dotted path (keys in the fixtures hold no dots), or a sentinel."""
    for part in path.split("."):
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            return "<absent>"
    return doc


def redacted_paths(doc: object, path: str = "") -> set[str]:
    if isinstance(doc, dict):
        return set().union(*(redacted_paths(v, f"{path}.{k}" if path else k) for k, v in doc.items()))
    if isinstance(doc, list):
        return set().union(*(redacted_paths(v, f"{path}.{i}") for i, v in enumerate(doc)))
    return {path} if doc == "[redacted]" else set()


def canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True)


@pytest.mark.parametrize("language", sorted(SCRIPTS))
@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_runner_merges_like_the_rust_agent(runner: str, language: str, tmp_path: pathlib.Path) -> None:
    explain = RUNNERS[runner]
    rust_dir = build_agent_dir(tmp_path / "rust", language)
    other_dir = build_agent_dir(tmp_path / runner, language)
    rust_doc, rust_prov, rust_rej = rust_agent(rust_dir)
    doc, prov, rej = explain(other_dir)

    rust_set = {p: t for p, t in rust_prov.items() if t != "base"}
    other_set = {p: t for p, t in prov.items() if t != "base"}
    assert other_set == rust_set, "provenance of the non-base leaves"
    assert len(rust_set) > 10, "the fixture exercises the tiers"
    for path in rust_set:
        assert canonical(lookup(doc, path)) == canonical(lookup(rust_doc, path)), path
    assert redacted_paths(doc) == redacted_paths(rust_doc)
    assert {"github.token", "LicenseServer", "db.dsn", "detected.apiKey", "detected.X-Auth-Token"} <= redacted_paths(doc)
    assert rej == rust_rej
    # Base facts exist in both but are not compared; the tags came from the static tier in both.
    assert doc["tags"] == rust_doc["tags"] == ["crosslang", "linux"]


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_broken_dynamic_script_is_a_rejection_in_both(runner: str, tmp_path: pathlib.Path) -> None:
    explain = RUNNERS[runner]
    dirs = []
    for name in ("rust", runner):
        d = build_agent_dir(tmp_path / name, "python")
        (d / ".capabilities.dynamic.py").write_text("def getCapabilities(static):\n    raise ValueError('boom')\n")
        (d / ".capabilities.override.json").write_text("{not json")
        dirs.append(d)
    rust_doc, _, rust_rej = rust_agent(dirs[0])
    doc, _, rej = explain(dirs[1])
    assert rej == rust_rej == [("dynamic", ""), ("override", "")]
    assert doc["environment"] == rust_doc["environment"] == "production"


@pytest.mark.parametrize("language", sorted(SCRIPTS))
@pytest.mark.parametrize("runner", sorted(CLIS))
def test_a_relative_directory_runs_its_dynamic_script_in_every_runner(
    runner: str, language: str, tmp_path: pathlib.Path
) -> None:
    build_agent_dir(tmp_path / "agents" / "a", language)
    out = subprocess.run(
        [*cli(runner), "--dir", "agents/a", "capabilities"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    document = json.loads(out.stdout)
    assert document["nested"]["a"]["b"] == {"flag": False}  # a null deletes: c in the override, none here
    assert document["detected"]["from_static"] == DYNAMIC_OUTPUT["detected"]["from_static"]


@pytest.mark.parametrize("runner", sorted(CLIS))
def test_a_missing_directory_ends_every_runner_with_status_2_and_one_line(runner: str, tmp_path: pathlib.Path) -> None:
    out = subprocess.run(
        [*cli(runner), "--dir", "agents/missing", "capabilities"], cwd=tmp_path, capture_output=True, text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stdout == ""
    [line] = out.stderr.splitlines()
    assert "agent directory agents/missing: No such file or directory" in line
