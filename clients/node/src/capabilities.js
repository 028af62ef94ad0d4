// The runner's capability document: base facts (tools and GPUs probed once at load; with the
// `provides` of its handler packs), then the directory's static, dynamic and override tiers,
// merged and redacted by the core.
// Memory and load are refreshed on every `refresh`; the tier files are re-read when they
// change on disk (or when forced).
import { baseFacts, loadFacts, probedFacts } from "./base.js";
import { jsonEqual } from "./core/json.js";
import { agentDir } from "./identity.js";
import { DEFAULT_LIMITS } from "./core/limits.js";
import { Merged } from "./core/tier.js";
import { mergeDirectory, readDirectory, stamps } from "./tiers.js";

export class Capabilities {
  /**
   * @param {{dir: string, scriptTimeoutMs?: number, probeTimeoutMs?: number,
   *   limits?: import("./core/limits.js").Limits, provides?: () => Record<string, unknown>}} options
   */
  constructor({ dir, scriptTimeoutMs = 10_000, probeTimeoutMs = 5_000, limits = DEFAULT_LIMITS, provides = () => ({}) }) {
    /** The runner directory holding the tier files, canonical (a missing one throws `AgentDirectoryError`). */
    this.dir = agentDir(dir);
    /** How long a dynamic script may run. */
    this.scriptTimeoutMs = scriptTimeoutMs;
    /** How long each detection probe (a tool's version, `nvidia-smi`) may run. */
    this.probeTimeoutMs = probeTimeoutMs;
    this.limits = limits;
    /** The packs' `provides` subtree, recomputed on each merge (parameters may change). */
    this.provides = provides;
    /** The base tier as last detected. */
    this.detected = baseFacts();
    /** The directory tiers as last read. @type {import("./tiers.js").DirectoryTiers} */
    this.directory = { rejections: [] };
    /** Modification stamps of the tier files when last read. */
    this.stamps = "";
    /** The last merge. */
    this.merged = new Merged();
  }

  /** Probes the machine (tools, GPUs), reads the directory and merges. */
  async load() {
    Object.assign(this.detected, await probedFacts(this.probeTimeoutMs));
    await this.#reread();
    this.#merge();
    return this;
  }

  async #reread() {
    this.stamps = stamps(this.dir);
    this.directory = await readDirectory(this.dir, this.scriptTimeoutMs);
  }

  #merge() {
    const base = { ...this.detected };
    const provides = this.provides();
    if (provides && Object.keys(provides).length > 0) base.provides = provides;
    this.merged = mergeDirectory(base, this.directory, this.limits);
  }

  /** Refreshes memory and load, re-reads changed tier files (or all, if `force`); true if the document changed. */
  async refresh(force = false) {
    const before = this.merged.document;
    Object.assign(this.detected, loadFacts());
    if (force || stamps(this.dir) !== this.stamps) await this.#reread();
    this.#merge();
    return !jsonEqual(before, this.merged.document);
  }

  /** The merged, redacted document. */
  get document() {
    return this.merged.document;
  }
}
