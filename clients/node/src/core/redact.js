// Secret redaction, exactly as switchyard-core's `redact` module: every non-null value under a
// key that looks sensitive (by its words, split at non-alphanumerics and camelCase boundaries:
// one of SENSITIVE_WORDS, or `X key` with X one of SENSITIVE_KEY_PREFIXES; `tokens`, as in
// `max_tokens`, is not) or that the static tier declares sensitive becomes `[redacted]`, and so
// does every string, whatever its key, holding a secret of a known shape (`secrets.js`: cloud
// and forge tokens, JWTs, private keys, passwords in URLs, `Bearer` credentials). Redacted values
// are not descended into, and redaction is idempotent. Free text shown to people (reasons,
// messages) goes through `redactText` (secrets.js) instead, which keeps the words around the
// secret.
import { isObject, join, setKey, sortedKeys } from "./json.js";
import { containsSecret, MARKER } from "./secrets.js";

/** What a redacted value becomes. */
export { MARKER };

const SENSITIVE_WORDS = new Set([
  "token", "secret", "secrets", "password", "passwords", "passwd", "authorization",
  "cookie", "cookies", "credential", "credentials", "pwd", "passphrase", "pat", "jwt",
  "apikey", "privatekey", "accesskey", "secretkey", "signingkey", "sshkey",
  "encryptionkey", "masterkey", "sessionkey", "clientkey", "accountkey",
]);
/** `X` of the `(X, "key")` word pairs: `api key`, `access_key`, `SigningKey`, ... */
const SENSITIVE_KEY_PREFIXES = new Set([
  "api", "private", "access", "secret", "signing", "ssh", "encryption", "master",
  "session", "client", "account",
]);

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
    if (words[i + 1] === "key" && SENSITIVE_KEY_PREFIXES.has(words[i])) return true;
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
 * Replaces every value under a sensitive key in `doc` (in place) with MARKER, and every string
 * holding a secret of a known shape; returns the dotted paths it changed, in document
 * (byte-sorted key) order. Strings are immutable, so only those inside `doc` (an object or an
 * array) are replaced.
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
      } else if (typeof child === "string") {
        if (containsSecret(child)) {
          setKey(value, key, MARKER);
          out.push(childPath);
        }
      } else {
        walk(child, childPath, extra, out);
      }
    }
  } else if (Array.isArray(value)) {
    value.forEach((child, i) => {
      const childPath = join(path, String(i));
      if (typeof child === "string") {
        if (containsSecret(child)) {
          value[i] = MARKER;
          out.push(childPath);
        }
      } else {
        walk(child, childPath, extra, out);
      }
    });
  }
}
