// Handler packs, exactly as switchyard-core's `pack` module: `mergePacks` is a pure fold in
// which the first registration wins (a duplicate pack id is rejected whole; a claimed or
// invalid handler kind or capability is rejected alone; nothing throws), and
// `resolveParams` turns the merged capabilities into the document's `provides` subtree,
// `{name: {version, healthy, reason?}}`. Parameter values never enter the result.
import { byteCompare, isObject, setKey, sortedKeys } from "./json.js";

/**
 * @typedef {{description?: string, default?: unknown, sensitive?: boolean}} PackParam
 * @typedef {{version: string, params?: Record<string, PackParam>}} ProvidedCapability
 * @typedef {{id: string, handlers?: string[], provides?: Record<string, ProvidedCapability>}} PackDeclaration
 * @typedef {{pack: string, kind: "pack"|"handler"|"capability", id: string, reason: string}} PackRejection
 * @typedef {{packs: string[], handlers: Map<string,string>, provides: Map<string,{pack: string, capability: ProvidedCapability}>, rejections: PackRejection[]}} MergedPacks
 */

const SEGMENT = /^[A-Za-z0-9_-]+$/;
const U64_MAX = (1n << 64n) - 1n;

function validDottedName(name) {
  return name !== "" && name.split(".").every((seg) => SEGMENT.test(seg));
}

/** Whether the core's lenient version parser accepts `text` (`v1`, `1.2`, `1.2.3-rc1`, ...). */
export function parsesLeniently(text) {
  if (typeof text !== "string") return false;
  let t = text.trim();
  if (t.startsWith("v") || t.startsWith("V")) t = t.slice(1);
  let rest = t;
  let count = 0;
  for (;;) {
    const digits = /^[0-9]*/.exec(rest)[0];
    if (digits === "") return count > 0;
    if (BigInt(digits) > U64_MAX) return false;
    count++;
    rest = rest.slice(digits.length);
    if (rest[0] === "." && /^[0-9]$/.test(rest[1] ?? "")) {
      rest = rest.slice(1);
      continue;
    }
    return true;
  }
}

/**
 * Merges packs in order, first registration wins.
 * @param {PackDeclaration[]} packs
 * @returns {MergedPacks}
 */
export function mergePacks(packs) {
  /** @type {MergedPacks} */
  const merged = { packs: [], handlers: new Map(), provides: new Map(), rejections: [] };
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
    for (const kind of pack.handlers ?? []) {
      if (typeof kind !== "string" || kind === "") {
        reject("handler", String(kind ?? ""), "handler kind is empty");
      } else if (merged.handlers.has(kind)) {
        reject("handler", kind, `already handled by pack ${merged.handlers.get(kind)}`);
      } else {
        merged.handlers.set(kind, id);
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
