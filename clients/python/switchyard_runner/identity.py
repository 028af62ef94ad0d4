"""Who a runner is on its host: its agent directory, made absolute once (:func:`agent_dir`, so
scripts and tier reads never depend on the working directory and a missing directory is an
error, not an empty document), and its default name (:func:`default_agent_name`).

The name rule is the Rust agent's and the Node runner's too (``tests/conformance/naming.json``):
``{hostname}-{runner}-{h}``, where ``h`` is the first six hex digits of the SHA-256 of the
canonical agent directory. Two runners on one host, or one runner in two directories, so get
names of their own, and a restart in the same directory keeps its name.
"""

from __future__ import annotations

import hashlib
import os
import pathlib

RUNNER = "python"
"""This runner's part of a default name."""


class AgentDirectoryError(ValueError):
    """An agent directory that does not exist or is not a directory; the message names it."""


def agent_dir(directory: str | os.PathLike) -> pathlib.Path:
    """``directory`` canonicalised (absolute, symlinks resolved).

    Raises :class:`AgentDirectoryError` when it does not exist or is not a directory.
    """
    try:
        canonical = pathlib.Path(directory).resolve(strict=True)
    except OSError as err:  # missing, a symlink loop, a path through a file
        raise AgentDirectoryError(f"agent directory {os.fspath(directory)}: {err.strerror or err}") from err
    if not canonical.is_dir():
        raise AgentDirectoryError(f"agent directory {os.fspath(directory)}: not a directory")
    return canonical


def default_agent_name(hostname: str, runner: str, directory: str | os.PathLike) -> str:
    """The name an agent registers under when none is given: the hostname, the runner
    (``rust``, ``python``, ``node``) and the first six hex digits of the SHA-256 of
    ``directory``, which must already be canonical (see :func:`agent_dir`), as UTF-8."""
    # Undecodable bytes in a path become U+FFFD, as Rust's to_string_lossy makes them.
    text = os.fsencode(directory).decode("utf-8", "replace")
    return f"{hostname}-{runner}-{hashlib.sha256(text.encode('utf-8')).hexdigest()[:6]}"
