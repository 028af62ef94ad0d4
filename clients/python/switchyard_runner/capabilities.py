"""The runner's capability document: base facts (tools and GPUs probed once at load; with the
``provides`` of its handler packs), then the agent directory's static, dynamic and override tiers,
merged and redacted by the core.

Memory and load are refreshed on every :meth:`Capabilities.refresh`; the tier files are re-read
when they change on disk; values set through the runner's API merge into the dynamic tier.
"""

from __future__ import annotations

import copy
import pathlib

from switchyard_runner import detect, identity, tiers
from switchyard_runner.core.json_util import JSON, json_equal
from switchyard_runner.core.tier import Merged


class Capabilities:
    """Builds and refreshes the document of one agent directory."""

    def __init__(
        self, directory: pathlib.Path | str | None, script_timeout: float = 10.0, probe_timeout: float = 5.0
    ):
        self.directory = identity.agent_dir(directory) if directory is not None else None
        """The agent directory, canonical (absolute, symlinks resolved; one that does not exist
        raises :class:`~switchyard_runner.identity.AgentDirectoryError`); ``None`` for a runner
        with base facts only."""
        self.script_timeout = script_timeout
        """How long the dynamic script may run, in seconds."""
        self.probe_timeout = probe_timeout
        """How long each detection probe (a tool's version, ``nvidia-smi``) may run, in seconds."""
        self.detected: dict = detect.base()
        """The base tier from detection."""
        self.provides: dict = {}
        """The packs' ``provides`` subtree (set by the runner)."""
        self.runtime: dict = {}
        """Values set through :meth:`set_runtime`, merged into the dynamic tier."""
        self.directory_tiers = tiers.DirectoryTiers()
        """The directory tiers as last read."""
        self._stamps: list | None = None
        self.merged = Merged()
        """The last merge."""

    async def load(self) -> Capabilities:
        """Probes the machine (tools, GPUs), reads the directory and merges; returns ``self``."""
        self.detected.update(await detect.probed(self.probe_timeout))
        await self._reread()
        self.merge()
        return self

    async def _reread(self) -> None:
        if self.directory is None:
            return
        self._stamps = tiers.stamps(self.directory)
        self.directory_tiers = await tiers.read_directory(self.directory, self.script_timeout)

    def merge(self) -> None:
        """Merges the current tiers."""
        base = dict(self.detected)
        if self.provides:
            base["provides"] = copy.deepcopy(self.provides)
        self.merged = tiers.merge(base, self.directory_tiers, self.runtime)

    def set_runtime(self, values: dict) -> None:
        """Merges ``values`` (RFC 7386: ``None`` deletes) into the runtime part of the dynamic tier."""
        from switchyard_runner.core.tier import Tier, merge_tiers

        self.runtime = merge_tiers([(Tier.DYNAMIC, self.runtime), (Tier.DYNAMIC, values)]).document
        self.merge()

    async def refresh(self, force: bool = False) -> bool:
        """Refreshes memory and load, re-reads changed tier files; True if the document changed."""
        before = copy.deepcopy(self.merged.document)
        self.detected.update(detect.load_facts())
        if self.directory is not None and (force or tiers.stamps(self.directory) != self._stamps):
            await self._reread()
        self.merge()
        return not json_equal(before, self.merged.document)

    @property
    def document(self) -> JSON:
        """The merged, redacted document."""
        return self.merged.document
