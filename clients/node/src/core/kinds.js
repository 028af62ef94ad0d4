// The rules for a task kind's name, exactly as switchyard-core's `kinds` module: a kind is 1 to
// 256 UTF-8 bytes with no white space or control characters, and `*` is never part of one. A
// runner advertises the kinds it handles as patterns (an exact kind, a prefix pattern `P.*` for
// every kind below `P.`, or `*` for every kind), at most 1024 of them; it advertises none when
// it has no handlers, and is then granted nothing. The server checks the same rules and rejects a
// bad pattern with INVALID_ARGUMENT naming `handled_kinds[i]`.

/** The longest kind, in UTF-8 bytes. */
export const MAX_KIND_BYTES = 256;

/** The most patterns one runner advertises. */
export const MAX_PATTERNS = 1024;

const WHITE_SPACE_OR_CONTROL = /[\p{White_Space}\p{Cc}]/u;
const NAMED_ESCAPES = { "\0": "\\0", "\t": "\\t", "\n": "\\n", "\r": "\\r" };

/** A character as Rust's `{:?}` shows it, close enough for people: `' '`, `'\t'`, `'\u{85}'`. */
function debugChar(c) {
  if (Object.hasOwn(NAMED_ESCAPES, c)) return `'${NAMED_ESCAPES[c]}'`;
  if (/[\p{Cc}\p{Zl}\p{Zp}]/u.test(c)) return `'\\u{${c.codePointAt(0).toString(16)}}'`;
  return `'${c}'`;
}

/**
 * What is wrong with a task kind (`is empty`, `is 300 bytes, at most 256 allowed`, ...), or
 * `null` when it is a valid kind. The checks run in the core's order: empty, length, `*`, then
 * the first white space or control character.
 * @param {string} kind
 * @returns {string|null}
 */
export function checkKind(kind) {
  if (typeof kind !== "string") return "is not a string";
  if (kind === "") return "is empty";
  const bytes = Buffer.byteLength(kind, "utf8");
  if (bytes > MAX_KIND_BYTES) return `is ${bytes} bytes, at most ${MAX_KIND_BYTES} allowed`;
  if (kind.includes("*")) return "has `*` other than as `*` alone or a trailing `.*`";
  const bad = WHITE_SPACE_OR_CONTROL.exec(kind);
  return bad ? `has ${debugChar(bad[0])}: no white space or control characters` : null;
}
