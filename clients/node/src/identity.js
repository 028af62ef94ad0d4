// Who a runner is on its host: its agent directory, made absolute once (`agentDir`, so scripts
// and tier reads never depend on the working directory and a missing directory is an error, not
// an empty document), and its default name (`defaultAgentName`), the same rule as the Rust agent
// and the Python runner (`tests/conformance/naming.json`): `{hostname}-{runner}-{h}`, where `h`
// is the first six hex digits of the SHA-256 of the canonical directory. Two runners on one
// host, or one runner in two directories, so get names of their own, and a restart in the same
// directory keeps its name.
import { createHash } from "node:crypto";
import { realpathSync, statSync } from "node:fs";
import { resolve } from "node:path";

/** This runner's part of a default name. */
export const RUNNER = "node";

/** An agent directory that does not exist or is not a directory; the message names it. */
export class AgentDirectoryError extends Error {
  /** @param {string} dir @param {string} problem */
  constructor(dir, problem) {
    super(`agent directory ${dir}: ${problem}`);
    this.name = "AgentDirectoryError";
    /** The directory as it was given. */
    this.dir = dir;
  }
}

const PROBLEMS = { ENOENT: "No such file or directory", ENOTDIR: "Not a directory", ELOOP: "Too many levels of symbolic links" };

/**
 * `dir` canonicalised (absolute, symlinks resolved); throws `AgentDirectoryError` when it does
 * not exist or is not a directory.
 * @param {string} dir
 * @returns {string}
 */
export function agentDir(dir) {
  let canonical;
  try {
    canonical = realpathSync(resolve(dir));
  } catch (err) {
    throw new AgentDirectoryError(dir, PROBLEMS[err.code] ?? err.message);
  }
  if (!statSync(canonical).isDirectory()) throw new AgentDirectoryError(dir, "not a directory");
  return canonical;
}

/**
 * The name an agent registers under when none is given: the hostname, the runner (`rust`,
 * `python`, `node`) and the first six hex digits of the SHA-256 of `dir` (already canonical,
 * see `agentDir`) as UTF-8.
 * @param {string} hostname @param {string} runner @param {string} dir
 */
export function defaultAgentName(hostname, runner, dir) {
  const h = createHash("sha256").update(dir, "utf8").digest("hex").slice(0, 6);
  return `${hostname}-${runner}-${h}`;
}
