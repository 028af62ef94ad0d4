// Handler packs, exactly as switchyard-core's `pack` module: `mergePacks` is a pure fold in
// which the first registration wins (a duplicate pack id is rejected whole; a claimed or
// invalid handler kind or capability is rejected alone; nothing throws), and
// `resolveParams` turns the merged capabilities into the document's `provides` subtree,
// `{name: {version, healthy, reason?}}`. Parameter values never enter the result. A pack may
// require capabilities (`requires: ["ai.llm@1"]`, or a name alone for any version); `advertise`
// withdraws its kinds while one of them is missing, unhealthy or of another major version in
// the runner's document, and says why (the runner reports DEGRADED with the reasons).
import { checkKind } from "./kinds.js";
import { byteCompare, hasKey, isObject, setKey, sortedKeys } from "./json.js";

/**
 * @typedef {{description?: string, default?: unknown, sensitive?: boolean}} PackParam
 * @typedef {{version: string, params?: Record<string, PackParam>}} ProvidedCapability
 * @typedef {{id: string, handlers?: string[], provides?: Record<string, ProvidedCapability>, requires?: string[]}} PackDeclaration
 * @typedef {{pack: string, kind: "pack"|"handler"|"capability", id: string, reason: string}} PackRejection
 * @typedef {{packs: string[], handlers: Map<string,string>, provides: Map<string,{pack: string, capability: ProvidedCapability}>, requires: Map<string,string[]>, rejections: PackRejection[]}} MergedPacks
 * @typedef {{kind: string, capability: string, problem: string, reason: string}} Withdrawal
 * @typedef {{kinds: string[], withdrawn: Withdrawal[]}} Advertised
 */

const SEGMENT = /^[A-Za-z0-9_-]+$/;
const U64_MAX = (1n << 64n) - 1n;

function validDottedName(name) {
  return name !== "" && name.split(".").every((seg) => SEGMENT.test(seg));
}

/**
 * The numeric part of a version as the core's `version::parse_lenient` reads it (an optional
 * `v`, one to three numeric components, missing ones 0, further ones ignored; the pre-release is
 * not kept), or `undefined` when no leading number can be read or a component is over `u64`.
 * @param {unknown} text
 * @returns {{major: bigint, minor: bigint, patch: bigint}|undefined}
 */
export function parseLenient(text) {
  if (typeof text !== "string") return undefined;
  let t = text.trim();
  if (t.startsWith("v") || t.startsWith("V")) t = t.slice(1);
  const nums = [0n, 0n, 0n];
  let rest = t;
  let count = 0;
  for (;;) {
    const digits = /^[0-9]*/.exec(rest)[0];
    if (digits === "") break;
    const n = BigInt(digits);
    if (n > U64_MAX) return undefined;
    if (count < 3) nums[count] = n;
    count++;
    rest = rest.slice(digits.length);
    if (rest[0] === "." && /^[0-9]$/.test(rest[1] ?? "")) {
      rest = rest.slice(1);
      continue;
    }
    break;
  }
  if (count === 0) return undefined;
  const [major, minor, patch] = nums;
  return { major, minor, patch };
}

/** Whether the core's lenient version parser accepts `text` (`v1`, `1.2`, `1.2.3-rc1`, ...). */
export function parsesLeniently(text) {
  return parseLenient(text) !== undefined;
}

/**
 * Merges packs in order, first registration wins.
 * @param {PackDeclaration[]} packs
 * @returns {MergedPacks}
 */
export function mergePacks(packs) {
  /** @type {MergedPacks} */
  const merged = { packs: [], handlers: new Map(), provides: new Map(), requires: new Map(), rejections: [] };
  const seen = new Set();
  for (const pack of packs) {
    const id = typeof pack?.id === "string" ? pack.id : "";
    const reject = (kind, itemId, reason) => merged.rejections.push({ pack: id, kind, id: itemId, reason });
    if (id === "") {
      reject("pack", "", "pack id is empty");
      continue;
    }
    if (seen.has(id)) {
      reject("pack", id, "duplicate pack id; the pack contributes nothing");
      continue;
    }
    seen.add(id);
    merged.packs.push(id);
    const requires = Array.isArray(pack.requires) ? pack.requires : [];
    for (const kind of pack.handlers ?? []) {
      const problem = checkKind(kind);
      if (problem !== null) {
        reject("handler", String(kind ?? ""), `handler kind ${problem}`);
      } else if (merged.handlers.has(kind)) {
        reject("handler", kind, `already handled by pack ${merged.handlers.get(kind)}`);
      } else {
        merged.handlers.set(kind, id);
        if (requires.length > 0) merged.requires.set(kind, [...requires]);
      }
    }
    const provides = isObject(pack.provides) ? pack.provides : {};
    for (const name of sortedKeys(provides)) {
      const capability = provides[name];
      if (!validDottedName(name)) {
        reject("capability", name, `\`${name}\` is not a dotted name`);
      } else if (!parsesLeniently(capability?.version)) {
        reject("capability", name, `version \`${capability?.version}\` is not a version`);
      } else if (merged.provides.has(name)) {
        reject("capability", name, `already provided by pack ${merged.provides.get(name).pack}`);
      } else {
        merged.provides.set(name, { pack: id, capability });
      }
    }
  }
  return merged;
}

/**
 * The `provides` subtree: `{name: {version, healthy, reason?}}`. `lookup` answers a
 * parameter's configured value by name; only whether it answers (non-empty) matters.
 * @param {MergedPacks} merged
 * @param {(name: string) => string|undefined|null} lookup
 */
export function resolveParams(merged, lookup) {
  const out = {};
  for (const name of [...merged.provides.keys()].sort(byteCompare)) {
    const { capability } = merged.provides.get(name);
    const params = isObject(capability.params) ? capability.params : {};
    const missing = sortedKeys(params).filter((param) => {
      const spec = params[param] ?? {};
      if (spec.default !== undefined && spec.default !== null) return false;
      const value = lookup(param);
      return value === undefined || value === null || value === "";
    });
    const entry = { version: capability.version, healthy: missing.length === 0 };
    if (missing.length === 1) entry.reason = `missing parameter ${missing[0]}`;
    else if (missing.length > 1) entry.reason = `missing parameters ${missing.join(", ")}`;
    setKey(out, name, entry);
  }
  return out;
}

/** Reasons for a DEGRADED status: one per unhealthy capability in `provides`. */
export function unhealthyReasons(provides) {
  return sortedKeys(provides)
    .filter((name) => provides[name]?.healthy === false)
    .map((name) => `capability ${name} unhealthy: ${provides[name].reason ?? "unhealthy"}`);
}

const NOT_A_REF = "not a capability ref (name@major)";

/**
 * `document.provides[name]` when it is an object, read as the core's
 * `CapabilityDocument::provided` reads it: `version` (a string, or a number as text), `healthy`
 * (a boolean; anything else counts as healthy) and `reason` (a string).
 */
function provided(document, name) {
  const provides = isObject(document) && hasKey(document, "provides") ? document.provides : undefined;
  if (!isObject(provides) || !hasKey(provides, name) || !isObject(provides[name])) return undefined;
  const entry = provides[name];
  const { version } = entry;
  return {
    version: typeof version === "string" ? version : typeof version === "number" ? String(version) : undefined,
    healthy: typeof entry.healthy === "boolean" ? entry.healthy : true,
    reason: typeof entry.reason === "string" ? entry.reason : undefined,
  };
}

/**
 * Why a required capability (`name@major` or `name`) is not there in `document`, or `null` if it
 * is: `not provided`, `version V, not major M`, `unhealthy[: reason]`, or that it is not a
 * capability ref.
 * @param {string} required
 * @param {unknown} document
 * @returns {string|null}
 */
export function requirementProblem(required, document) {
  if (typeof required !== "string") return NOT_A_REF;
  const at = required.indexOf("@");
  let name = required;
  let major;
  if (at >= 0) {
    name = required.slice(0, at);
    // Rust's `u64::from_str`: ASCII digits with an optional leading `+`, within u64.
    const text = required.slice(at + 1);
    if (!/^\+?[0-9]+$/.test(text) || BigInt(text) > U64_MAX) return NOT_A_REF;
    major = BigInt(text);
  }
  if (!validDottedName(name)) return NOT_A_REF;
  const have = provided(document, name);
  if (!have) return "not provided";
  if (major !== undefined && parseLenient(have.version)?.major !== major) {
    return `version ${have.version ?? "no version"}, not major ${major}`;
  }
  if (!have.healthy) return have.reason !== undefined ? `unhealthy: ${have.reason}` : "unhealthy";
  return null;
}

/**
 * The kinds the merged packs handle given the runner's `document` (its `provides` subtree): a
 * kind whose pack requires a capability that is missing, unhealthy or of another major version
 * is withdrawn (once per failing requirement, in the order the pack lists them) and comes back
 * when the capability does. Kinds are in sorted (byte) order.
 * @param {MergedPacks} merged
 * @param {unknown} document
 * @returns {Advertised}
 */
export function advertise(merged, document) {
  /** @type {Advertised} */
  const out = { kinds: [], withdrawn: [] };
  for (const kind of [...merged.handlers.keys()].sort(byteCompare)) {
    const problems = [];
    for (const capability of merged.requires?.get(kind) ?? []) {
      const problem = requirementProblem(capability, document);
      if (problem !== null) {
        const reason = `handler ${kind} withdrawn: needs ${capability}, ${problem}`;
        problems.push({ kind, capability, problem, reason });
      }
    }
    if (problems.length === 0) out.kinds.push(kind);
    else out.withdrawn.push(...problems);
  }
  return out;
}
