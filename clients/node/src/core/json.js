// JSON helpers shared by the capability core: byte-ordered keys (as serde_json's BTreeMap
// orders them), safe key assignment (a `__proto__` key is data, never a prototype), deep
// equality, and the compact serialized size in UTF-8 bytes.

/** @param {unknown} v */
export function isObject(v) {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

/** Compares two strings by their UTF-8 bytes, as Rust's `str` ordering does. */
export function byteCompare(a, b) {
  if (a === b) return 0;
  return Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8"));
}

/** The keys of `obj` in UTF-8 byte order. */
export function sortedKeys(obj) {
  return Object.keys(obj).sort(byteCompare);
}

/** Sets `obj[key] = value` as an own, enumerable data property, whatever the key. */
export function setKey(obj, key, value) {
  Object.defineProperty(obj, key, { value, writable: true, enumerable: true, configurable: true });
}

/** Whether `obj` has `key` as an own property. */
export function hasKey(obj, key) {
  return Object.prototype.hasOwnProperty.call(obj, key);
}

/** A deep copy of a JSON value (own keys only, `__proto__` safe). */
export function clone(v) {
  if (Array.isArray(v)) return v.map(clone);
  if (isObject(v)) {
    const out = {};
    for (const k of Object.keys(v)) setKey(out, k, clone(v[k]));
    return out;
  }
  return v;
}

/** Deep JSON equality (key order does not matter). */
export function jsonEqual(a, b) {
  if (a === b) return true;
  if (Array.isArray(a)) {
    return Array.isArray(b) && a.length === b.length && a.every((x, i) => jsonEqual(x, b[i]));
  }
  if (isObject(a)) {
    if (!isObject(b)) return false;
    const ka = Object.keys(a);
    if (ka.length !== Object.keys(b).length) return false;
    return ka.every((k) => hasKey(b, k) && jsonEqual(a[k], b[k]));
  }
  return false;
}

/** A copy of a JSON value with every object's keys in byte order (canonical output). */
export function canonical(v) {
  if (Array.isArray(v)) return v.map(canonical);
  if (isObject(v)) {
    const out = {};
    for (const k of sortedKeys(v)) setKey(out, k, canonical(v[k]));
    return out;
  }
  return v;
}

/** The length in bytes of `value` serialized as compact JSON. */
export function serializedLen(value) {
  return Buffer.byteLength(JSON.stringify(value) ?? "null", "utf8");
}

/** What kind of JSON value `v` is, for messages (`an array`, `null`, ...). */
export function kind(v) {
  if (v === null) return "null";
  if (Array.isArray(v)) return "an array";
  if (typeof v === "object") return "an object";
  if (typeof v === "string") return "a string";
  if (typeof v === "number") return "a number";
  if (typeof v === "boolean") return "a boolean";
  return typeof v;
}

/** Joins a dotted path and a key (`""` + `a` is `a`). */
export function join(path, key) {
  return path === "" ? key : `${path}.${key}`;
}

/**
 * The largest magnitude a number in a `google.protobuf.Struct` (an IEEE-754 double) carries
 * exactly as an integer: 2^53 − 1.
 */
export const MAX_EXACT_INTEGER = Number.MAX_SAFE_INTEGER;

/** Why a number of larger magnitude is refused. */
export const BEYOND_EXACT =
  "number is beyond ±(2^53 − 1) (9007199254740991), the most a Struct number carries exactly; " +
  "send it as a string";

/**
 * The first number in `v` a Struct cannot carry exactly (NaN, an infinity, a magnitude past
 * MAX_EXACT_INTEGER; a BigInt), as `{path, reason}` with the dotted path from `path`; null if none.
 */
export function uncarried(v, path = "") {
  const at = (key) => (path ? `${path}.${key}` : String(key));
  if (typeof v === "bigint") return { path, reason: BEYOND_EXACT };
  if (typeof v === "number") {
    if (!Number.isFinite(v)) return { path, reason: "number is NaN or infinite" };
    return Math.abs(v) > MAX_EXACT_INTEGER ? { path, reason: BEYOND_EXACT } : null;
  }
  if (Array.isArray(v)) {
    for (let i = 0; i < v.length; i++) {
      const found = uncarried(v[i], at(i));
      if (found) return found;
    }
    return null;
  }
  if (isObject(v)) {
    for (const k of Object.keys(v)) {
      const found = uncarried(v[k], at(k));
      if (found) return found;
    }
  }
  return null;
}
