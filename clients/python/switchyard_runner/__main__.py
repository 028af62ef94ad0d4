"""``python -m switchyard_runner``: print the capability document a runner would report, or run one.

``capabilities --dir D [--explain]`` prints the merged, redacted document (``--explain``: every
leaf with its tier, then every rejection), in the Rust agent's formats. ``run`` connects a runner
with no handlers: it reports its capabilities and advertises no task kinds, so the server grants
it nothing (a program with handlers uses :class:`switchyard_runner.Runner`). An agent directory
that does not exist or is not a directory ends either with one line on standard error and exit
status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys

from switchyard_runner.capabilities import Capabilities
from switchyard_runner.core.json_util import compact, lookup
from switchyard_runner.identity import AgentDirectoryError


def _explain_lines(caps: Capabilities) -> list[str]:
    merged = caps.merged
    lines = []
    for path, tier in merged.provenance_entries():
        found, value = lookup(merged.document, path)
        text = compact(value) if found else ""
        lines.append(f"{path:<40} {text:<32} [{tier.label}]")
    for r in merged.rejections:
        tier = r.tier.label if r.tier else "-"
        lines.append(f"rejected [{tier}] {r.path or '(whole tier)'}: {r.reason}")
    return lines


async def _capabilities(directory: str, explain: bool, script_timeout: float) -> int:
    caps = await Capabilities(directory, script_timeout).load()
    if explain:
        print("\n".join(_explain_lines(caps)))
    else:
        print(json.dumps(caps.document, indent=2, ensure_ascii=False))
    return 0


def _prog() -> str:
    """``switchyard-runner`` when started as that script, else ``python -m switchyard_runner``."""
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return script if script == "switchyard-runner" else "python -m switchyard_runner"


def main(argv: list[str] | None = None) -> int:
    """The command line entry point."""
    parser = argparse.ArgumentParser(prog=_prog(), description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=os.environ.get("SWITCHYARD_AGENT_DIR", "."), help="the agent directory holding the capability tiers")
    parser.add_argument(
        "--script-timeout-secs", type=float, default=float(os.environ.get("SWITCHYARD_SCRIPT_TIMEOUT_SECS", "10")),
        help="how long the dynamic capability script may run",
    )
    sub = parser.add_subparsers(dest="command")
    caps = sub.add_parser("capabilities", help="print the capability document this runner would report")
    caps.add_argument("--dir", dest="sub_dir", help="the agent directory (as above)")
    caps.add_argument("--explain", action="store_true", help="show every value with its tier, and every rejection")
    run = sub.add_parser(
        "run", help="connect to the server and report capabilities (no handlers: advertises no kinds, granted nothing)"
    )
    run.add_argument("--dir", dest="sub_dir", help="the agent directory (as above)")
    run.add_argument("--server", default=os.environ.get("SWITCHYARD_SERVER", "127.0.0.1:50051"))
    args = parser.parse_args(argv)
    directory = getattr(args, "sub_dir", None) or args.dir
    try:
        if args.command == "capabilities":
            return asyncio.run(_capabilities(directory, args.explain, args.script_timeout_secs))
        if args.command == "run":
            from switchyard_runner.runner import Runner, RunnerConfig

            config = RunnerConfig.from_env(server=args.server, directory=directory, script_timeout=args.script_timeout_secs)
            logging.basicConfig(level=os.environ.get("SWITCHYARD_LOG", "INFO"), stream=sys.stderr)
            Runner(config).run_forever()
            return 0
    except AgentDirectoryError as err:
        print(f"{parser.prog}: {err}", file=sys.stderr)
        return 2
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
