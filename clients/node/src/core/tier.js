// The tier merge that builds a capability document, exactly as switchyard-core's `tier`
// module: tiers apply in order over `{}` with RFC 7386 semantics (objects merge deeply, `null`
// deletes, arrays and scalars replace). The merge is total: a tier that is not an object, or a
// value over the limits, becomes a rejection and the rest applies. Provenance maps every leaf
// (a scalar, an array or an empty object) to the tier whose value is there.
import { byteCompare, clone, hasKey, isObject, join, kind, serializedLen, setKey, sortedKeys } from "./json.js";
import {
  DEFAULT_LIMITS,
  depthReason,
  keyReason,
  sizeReason,
  structuralViolations,
  structurallyWithin,
} from "./limits.js";

/** The tiers in merge order. */
export const TIERS = Object.freeze(["base", "static", "dynamic", "override", "operator"]);

/**
 * @typedef {"base"|"static"|"dynamic"|"override"|"operator"} Tier
 * @typedef {{tier: Tier|null, path: string, reason: string}} Rejection
 */

/** A merge in progress or done: the document, its provenance and what was rejected. */
export class Merged {
  constructor() {
    /** @type {Record<string, unknown>} */
    this.document = {};
    /** @type {Map<string, Tier>} dotted leaf path → tier */
    this.provenance = new Map();
    /** @type {Rejection[]} in the order found */
    this.rejections = [];
  }

  /** Provenance as `{path: tier}` sorted by path. */
  provenanceObject() {
    const out = {};
    for (const path of [...this.provenance.keys()].sort(byteCompare)) {
      setKey(out, path, this.provenance.get(path));
    }
    return out;
  }

  /** Merges one more tier on top. */
  apply(tier, value, limits = DEFAULT_LIMITS) {
    if (!isObject(value)) {
      this.rejections.push({ tier, path: "", reason: `tier is not a JSON object (it is ${kind(value)})` });
      return;
    }
    const mayOverflow =
      serializedLen(this.document) + serializedLen(value) > limits.max_serialized_bytes;
    const before = mayOverflow ? [clone(this.document), new Map(this.provenance)] : null;
    const mark = this.rejections.length;
    mergeObject(this, tier, limits, this.document, value, "", 1);
    if (!before) return;
    const size = serializedLen(this.document);
    if (size > limits.max_serialized_bytes) {
      [this.document, this.provenance] = before;
      this.rejections.length = mark;
      this.rejections.push({ tier, path: "", reason: sizeReason(size, limits.max_serialized_bytes) });
    }
  }
}

/**
 * Merges `tiers` (`[tier, value]` pairs, in tier order) over an empty document.
 * @param {[Tier, unknown][]} tiers
 */
export function mergeTiers(tiers, limits = DEFAULT_LIMITS) {
  const merged = new Merged();
  for (const [tier, value] of tiers) merged.apply(tier, value, limits);
  return merged;
}

function forget(merged, path) {
  merged.provenance.delete(path);
  const prefix = `${path}.`;
  for (const k of [...merged.provenance.keys()]) {
    if (k.startsWith(prefix)) merged.provenance.delete(k);
  }
}

function mergeObject(merged, tier, limits, target, patch, path, depth) {
  const reject = (p, reason) => merged.rejections.push({ tier, path: p, reason });
  for (const key of sortedKeys(patch)) {
    const value = patch[key];
    const childPath = join(path, key);
    const keyLen = Buffer.byteLength(key, "utf8");
    if (keyLen > limits.max_key_bytes) {
      reject(childPath, keyReason(keyLen, limits.max_key_bytes));
      continue;
    }
    if (value === null) {
      if (hasKey(target, key)) {
        delete target[key];
        forget(merged, childPath);
      }
    } else if (isObject(value)) {
      if (depth + 1 > limits.max_depth) {
        reject(childPath, depthReason(depth + 1, limits.max_depth));
        continue;
      }
      const existedAsObject = hasKey(target, key) && isObject(target[key]);
      if (!existedAsObject) {
        const existed = hasKey(target, key);
        setKey(target, key, {});
        if (existed) forget(merged, childPath);
      }
      const child = target[key];
      const wasEmpty = Object.keys(child).length === 0;
      mergeObject(merged, tier, limits, child, value, childPath, depth + 1);
      if (Object.keys(child).length === 0) {
        // An empty object is a leaf: it keeps its provenance if it already was one,
        // otherwise this tier made it (created or emptied it).
        if (!(existedAsObject && wasEmpty && merged.provenance.has(childPath))) {
          merged.provenance.set(childPath, tier);
        }
      } else {
        merged.provenance.delete(childPath);
      }
    } else {
      if (!structurallyWithin(limits, value, depth + 1)) {
        const [first] = structuralViolations(limits, value, childPath, depth + 1);
        if (first) {
          reject(childPath, first.path === childPath ? first.reason : `${first.path}: ${first.reason}`);
          continue;
        }
      }
      const existed = hasKey(target, key);
      setKey(target, key, clone(value));
      if (existed) forget(merged, childPath);
      merged.provenance.set(childPath, tier);
    }
  }
}
