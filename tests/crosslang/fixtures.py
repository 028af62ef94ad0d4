"""The shared SheetBot-style agent directory for cross-language checks.

:func:`build_agent_dir` writes the static and override tiers and the dynamic script of one
language (``python`` → ``.capabilities.dynamic.py``, ``node`` → ``.capabilities.dynamic.mjs``,
``shell`` → ``.capabilities.dynamic.sh``). Every script returns :data:`DYNAMIC_OUTPUT`, computed
from the static tier it receives, so every runner must merge the same result whatever the
script's language.
"""

from __future__ import annotations

import json
import pathlib

STATIC = {
    "tags": ["crosslang", "linux"],
    "packages": ["typescript", "node"],
    "environment": "production",
    "max_concurrent_tasks": 4,
    "max_tokens": 4096,
    "github": {"token": "ghp_static", "user": "me", "orgs": ["a", "b"]},
    "sensitive": ["LicenseServer", "db.dsn"],
    "LicenseServer": "lic://x",
    "db": {"dsn": "postgres://u:p@h/db", "host": "h"},
    "memory": {"unit": "GB"},
    "empty": {},
}
"""``.capabilities.json``: tags (so base tags drop), secrets by word and by declaration."""

DYNAMIC_OUTPUT = {
    "detected": {"from_static": "production", "tag_count": 2, "apiKey": "k-dyn", "X-Auth-Token": "t"},
    "environment": "staging",
    "packages": ["python"],
    "nested": {"a": {"b": {"c": 1.5, "flag": False, "none": None}}},
}
"""What ``getCapabilities(static)`` returns (two fields are computed from the static tier)."""

OVERRIDE = {
    "environment": "prod-override",
    "debug_mode": True,
    "github": {"user": None, "orgs": ["c"]},
    "nested": {"a": {"b": {"c": None}}},
    "hostname_alias": "custom-agent",
    "empty": {},
}
"""``.capabilities.override.json``: replaces, deletes with null, merges deeply."""

PYTHON_SCRIPT = """\
def getCapabilities(static):
    print("detecting...")  # log lines before the JSON are allowed
    return {
        "detected": {"from_static": static["environment"], "tag_count": len(static["tags"]),
                     "apiKey": "k-dyn", "X-Auth-Token": "t"},
        "environment": "staging",
        "packages": ["python"],
        "nested": {"a": {"b": {"c": 1.5, "flag": False, "none": None}}},
    }
"""

NODE_SCRIPT = """\
export async function getCapabilities(staticCapabilities) {
  console.log("detecting...");  // log lines before the JSON are allowed
  return {
    detected: { from_static: staticCapabilities.environment, tag_count: staticCapabilities.tags.length,
                apiKey: "k-dyn", "X-Auth-Token": "t" },
    environment: "staging",
    packages: ["python"],
    nested: { a: { b: { c: 1.5, flag: false, none: null } } },
  };
}
"""

SHELL_SCRIPT = """\
getCapabilities() {
  echo "detecting..."  # log lines before the JSON are allowed
  local environment tags count
  environment=$(printf '%s' "$1" | sed -n 's/.*"environment": *"\\([^"]*\\)".*/\\1/p')
  tags=$(printf '%s' "$1" | sed -n 's/.*"tags": *\\[\\([^]]*\\)\\].*/\\1/p')
  IFS=, read -ra count <<< "$tags"
  printf '{"detected": {"from_static": "%s", "tag_count": %d, "apiKey": "k-dyn", "X-Auth-Token": "t"}, ' \\
    "$environment" "${#count[@]}"
  printf '"environment": "staging", "packages": ["python"], "nested": {"a": {"b": {"c": 1.5, "flag": false, "none": null}}}}\\n'
}
"""

SCRIPTS = {
    "python": (".capabilities.dynamic.py", PYTHON_SCRIPT),
    "node": (".capabilities.dynamic.mjs", NODE_SCRIPT),
    "shell": (".capabilities.dynamic.sh", SHELL_SCRIPT),
}
"""Dynamic scripts by language; each must return :data:`DYNAMIC_OUTPUT` for :data:`STATIC`."""


def build_agent_dir(directory: pathlib.Path, language: str = "python") -> pathlib.Path:
    """Writes the three tiers into ``directory`` with the ``language`` dynamic script."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ".capabilities.json").write_text(json.dumps(STATIC, indent=2))
    (directory / ".capabilities.override.json").write_text(json.dumps(OVERRIDE, indent=2))
    name, text = SCRIPTS[language]
    (directory / name).write_text(text)
    return directory
