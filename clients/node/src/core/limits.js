// The limits every capability document and every patch obeys (serialized size, nesting
// depth, key length, array length), exactly as switchyard-core's `limits` module: depth
// counts containers (the document object is depth 1), key length is in UTF-8 bytes, and
// violations carry the dotted path where they occur.
import { isObject, join, serializedLen, sortedKeys } from "./json.js";

/** @typedef {{max_serialized_bytes: number, max_depth: number, max_key_bytes: number, max_array_items: number}} Limits */

/** @type {Readonly<Limits>} */
export const DEFAULT_LIMITS = Object.freeze({
  max_serialized_bytes: 256 * 1024,
  max_depth: 32,
  max_key_bytes: 256,
  max_array_items: 4096,
});

/** Limits from a partial object; absent fields take the defaults. */
export function limitsFrom(partial = {}) {
  return { ...DEFAULT_LIMITS, ...(partial ?? {}) };
}

export const depthReason = (depth, limit) => `nesting depth ${depth} exceeds limit ${limit}`;
export const keyReason = (len, limit) => `key is ${len} bytes, limit ${limit}`;
export const sizeReason = (size, limit) =>
  `document would be ${size} bytes serialized, limit ${limit}`;

const keyBytes = (k) => Buffer.byteLength(k, "utf8");

/** Whether `value` at container depth `depth` has no depth, key or array violation. */
export function structurallyWithin(limits, value, depth) {
  if (Array.isArray(value)) {
    return (
      depth <= limits.max_depth &&
      value.length <= limits.max_array_items &&
      value.every((v) => structurallyWithin(limits, v, depth + 1))
    );
  }
  if (isObject(value)) {
    return (
      depth <= limits.max_depth &&
      Object.keys(value).every(
        (k) => keyBytes(k) <= limits.max_key_bytes && structurallyWithin(limits, value[k], depth + 1),
      )
    );
  }
  return true;
}

/**
 * Depth, key and array violations of `value` at `path` with container depth `depth`.
 * @returns {{path: string, reason: string}[]}
 */
export function structuralViolations(limits, value, path, depth, out = []) {
  if (isObject(value)) {
    if (depth > limits.max_depth) {
      out.push({ path, reason: depthReason(depth, limits.max_depth) });
      return out;
    }
    for (const key of sortedKeys(value)) {
      const childPath = join(path, key);
      if (keyBytes(key) > limits.max_key_bytes) {
        out.push({ path: childPath, reason: keyReason(keyBytes(key), limits.max_key_bytes) });
        continue;
      }
      structuralViolations(limits, value[key], childPath, depth + 1, out);
    }
  } else if (Array.isArray(value)) {
    if (depth > limits.max_depth) {
      out.push({ path, reason: depthReason(depth, limits.max_depth) });
      return out;
    }
    if (value.length > limits.max_array_items) {
      out.push({ path, reason: `array has ${value.length} items, limit ${limits.max_array_items}` });
      return out;
    }
    value.forEach((child, i) => structuralViolations(limits, child, join(path, String(i)), depth + 1, out));
  }
  return out;
}

/** Every violation of `value` as a whole document, including its serialized size. */
export function violations(limits, value) {
  const out = [];
  if (!structurallyWithin(limits, value, 1)) structuralViolations(limits, value, "", 1, out);
  const size = serializedLen(value);
  if (size > limits.max_serialized_bytes) {
    out.push({ path: "", reason: sizeReason(size, limits.max_serialized_bytes) });
  }
  return out;
}
