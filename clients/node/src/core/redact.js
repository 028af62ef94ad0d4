// Secret redaction, exactly as switchyard-core's `redact` module: every non-null value under a
// key that looks sensitive (by its words, split at non-alphanumerics and camelCase boundaries)
// or that the static tier declares sensitive becomes `[redacted]`; redacted values are not
// descended into, and redaction is idempotent.
import { isObject, join, setKey, sortedKeys } from "./json.js";

/** What a redacted value becomes. */
export const MARKER = "[redacted]";

const SENSITIVE_WORDS = new Set([
  "token", "secret", "secrets", "password", "passwords", "passwd", "authorization",
  "cookie", "cookies", "credential", "credentials", "apikey", "privatekey",
]);
const SENSITIVE_PAIRS = new Set(["api key", "private key"]);

const ALNUM = /^[\p{Alphabetic}\p{N}]$/u;
const UPPER = /^\p{Uppercase}$/u;
const LOWER = /^\p{Lowercase}$/u;
const DIGIT = /^[0-9]$/;

/** Splits a key into lowercase words at separators and camelCase boundaries. */
export function keyWords(key) {
  const chars = Array.from(key);
  const words = [];
  let current = "";
  chars.forEach((c, i) => {
    if (!ALNUM.test(c)) {
      if (current) words.push(current);
      current = "";
      return;
    }
    if (UPPER.test(c) && current) {
      const prev = chars[i - 1];
      const next = chars[i + 1];
      const nextIsLower = next !== undefined && LOWER.test(next);
      // fooBar → foo|Bar ; APIKey → API|Key ; v2Token → v2|Token
      if (LOWER.test(prev) || DIGIT.test(prev) || (UPPER.test(prev) && nextIsLower)) {
        words.push(current);
        current = "";
      }
    }
    current += c.toLowerCase();
  });
  if (current) words.push(current);
  return words;
}

/** Whether `key` looks sensitive by its words. */
export function isSensitiveKey(key) {
  const words = keyWords(key);
  if (words.some((w) => SENSITIVE_WORDS.has(w))) return true;
  for (let i = 0; i + 1 < words.length; i++) {
    if (SENSITIVE_PAIRS.has(`${words[i]} ${words[i + 1]}`)) return true;
  }
  return false;
}

const asciiLower = (s) => s.replace(/[A-Z]/g, (c) => c.toLowerCase());

/** The extra sensitive keys or dotted paths a static tier declares in `sensitive`. */
export function declaredSensitive(staticTier) {
  const list = isObject(staticTier) && Array.isArray(staticTier.sensitive) ? staticTier.sensitive : [];
  return new Set(list.filter((s) => typeof s === "string").map(asciiLower));
}

/**
 * Replaces every value under a sensitive key in `doc` (in place) with MARKER; returns the
 * dotted paths it changed, in document (byte-sorted key) order.
 * @param {unknown} doc
 * @param {Set<string>} [extra] lowercase key names or dotted paths
 */
export function redact(doc, extra = new Set()) {
  const paths = [];
  walk(doc, "", extra, paths);
  return paths;
}

function walk(value, path, extra, out) {
  if (isObject(value)) {
    for (const key of sortedKeys(value)) {
      const childPath = join(path, key);
      const sensitive =
        isSensitiveKey(key) ||
        (extra.size > 0 && (extra.has(asciiLower(key)) || extra.has(asciiLower(childPath))));
      const child = value[key];
      if (sensitive) {
        if (child !== null && child !== MARKER) {
          setKey(value, key, MARKER);
          out.push(childPath);
        }
      } else {
        walk(child, childPath, extra, out);
      }
    }
  } else if (Array.isArray(value)) {
    value.forEach((child, i) => walk(child, join(path, String(i)), extra, out));
  }
}
