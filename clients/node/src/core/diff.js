// Capability diffs: RFC 6902 JSON Patches produced and applied with `fast-json-patch`.
// `applyDiff` follows switchyard-core's `diff::apply`, checking in order: the generation the
// patch was made against, the patch itself against the limits (its operations count against
// `max_array_items`), each operation (atomically: nothing applies if one fails), that the
// result is an object, and the result against the limits.
import jsonpatch from "fast-json-patch";
import { clone, isObject, kind } from "./json.js";
import { DEFAULT_LIMITS, violations } from "./limits.js";

/**
 * @typedef {{op: "add"|"remove"|"replace"|"move"|"copy"|"test", path: string, from?: string, value?: unknown}} PatchOperation
 */

/** Why a patch was not applied; `code` is one of the conformance error names. */
export class DiffError extends Error {
  /**
   * @param {"wrong_generation"|"over_limits"|"operation_failed"|"not_an_object"} code
   * @param {string} message
   * @param {number} [index] the failing operation, for `operation_failed`
   */
  constructor(code, message, index) {
    super(message);
    this.name = "DiffError";
    this.code = code;
    this.index = index;
  }
}

/**
 * The patch that turns `from` into `to`; empty when they are equal.
 * @returns {PatchOperation[]}
 */
export function diff(from, to) {
  return /** @type {PatchOperation[]} */ (jsonpatch.compare(from, to));
}

/**
 * Applies `patch`, made against `baseGeneration`, to `held` (generation `heldGeneration`).
 * Returns the next document; `held` is never modified. Throws DiffError.
 * @param {PatchOperation[]} patch
 */
export function applyDiff(held, heldGeneration, baseGeneration, patch, limits = DEFAULT_LIMITS) {
  if (heldGeneration !== baseGeneration) {
    throw new DiffError(
      "wrong_generation",
      `diff against generation ${baseGeneration}, held generation is ${heldGeneration}`,
    );
  }
  const patchViolations = violations(limits, patch);
  if (patchViolations.length > 0) {
    throw new DiffError("over_limits", `patch over limits: ${describe(patchViolations)}`);
  }
  let next;
  try {
    next = jsonpatch.applyPatch(clone(held), clone(patch), true, true).newDocument;
  } catch (err) {
    const index = typeof err?.index === "number" ? err.index : 0;
    const op = patch[index];
    throw new DiffError(
      "operation_failed",
      `operation ${index} (${op?.op} ${op?.path}) failed: ${err?.message?.split("\n")[0] ?? err}`,
      index,
    );
  }
  if (!isObject(next)) {
    throw new DiffError("not_an_object", `the patched document is ${kind(next)}, not an object`);
  }
  const docViolations = violations(limits, next);
  if (docViolations.length > 0) {
    throw new DiffError("over_limits", `document over limits: ${describe(docViolations)}`);
  }
  return next;
}

function describe(list) {
  return list.map((v) => (v.path ? `${v.path}: ${v.reason}` : v.reason)).join("; ");
}
