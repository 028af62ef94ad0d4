// Secrets found by their shape, whatever key they sit under, following switchyard-core's
// `secrets` module (core/src/secrets.rs): cloud and forge tokens, JWTs, PEM private keys,
// passwords inside URLs and DSNs, and `Bearer`/`Basic` credentials. The shapes are a subset of
// gitleaks' default rule set (`config/gitleaks.toml`: `aws-access-token`, `github-pat`,
// `github-fine-grained-pat`, `github-oauth`, `github-app-token`, `github-refresh-token`,
// `gitlab-pat`, `slack-*-token`, `slack-webhook-url`, `jwt`, `private-key`,
// `stripe-access-token`, `gcp-api-key`, `npm-access-token`, `pypi-upload-token`,
// `openai-api-key`, `anthropic-api-key`), written without look-around so the Rust core and the
// Python and Node runners use the same expressions; tests/conformance/redaction.json holds all
// three to them, with look-alikes that must be left alone (git shas, UUIDs, digests, prose).
//
// A document's string value holding a secret is replaced whole (see `redact.js`); free text (a
// failure message, a refusal, a drain reason) keeps its words and loses only the secret:
// `redactText` replaces the token, the password of a URL, the value after `password=` or the
// credential after `Bearer`.

/** What a redacted value or secret becomes (re-exported by `redact.js`). */
export const MARKER = "[redacted]";

/**
 * The shapes, in the order they are tried: [expression, the capture group that is the secret
 * (0: the whole match), whether the secret must also look like a credential rather than a word].
 * The expressions are the Rust core's as written; JavaScript has no inline `(?i)`, so an
 * expression starting with it is compiled without it and with the `i` flag (see `compile`). Kept
 * in step with core/src/secrets.rs and clients/python/switchyard_runner/core/secrets.py.
 * @type {ReadonlyArray<readonly [string, number, boolean]>}
 */
export const PATTERNS = Object.freeze([
  // PEM private keys, the whole block when it is there.
  [
    String.raw`-----BEGIN[A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----(?:[\s\S]*?-----END[A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----)?`,
    0,
    false,
  ],
  // AWS access key ids.
  [String.raw`\b(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b`, 0, false],
  // GitHub: classic, OAuth, app, refresh and fine-grained tokens.
  [String.raw`\bgh[pousr]_[A-Za-z0-9]{36,255}\b`, 0, false],
  [String.raw`\bgithub_pat_[A-Za-z0-9_]{22,255}\b`, 0, false],
  // GitLab personal, deploy and runner tokens.
  [String.raw`\bgl(?:pat|dt|rt|ptt)-[A-Za-z0-9_-]{20,}`, 0, false],
  // Slack tokens and webhooks.
  [String.raw`\bxox[abposr]-[A-Za-z0-9-]{10,}`, 0, false],
  [String.raw`https://hooks\.slack\.com/(?:services|workflows)/[A-Za-z0-9+/_-]{20,}`, 0, false],
  // Stripe, Google API, npm, PyPI, OpenAI and Anthropic keys; Switchyard's own tokens.
  [String.raw`\b[rs]k_(?:live|test)_[A-Za-z0-9]{20,}`, 0, false],
  [String.raw`\bAIza[A-Za-z0-9_-]{35}`, 0, false],
  [String.raw`\bnpm_[A-Za-z0-9]{36}\b`, 0, false],
  [String.raw`\bpypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{50,}`, 0, false],
  [String.raw`\bsk-(?:proj-|ant-[a-z0-9]+-)?[A-Za-z0-9_-]{20,}`, 0, false],
  [String.raw`\bsy_[0-9a-f]{64}\b`, 0, false],
  // JSON Web Tokens.
  [String.raw`\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]*`, 0, false],
  // The password of a URL or DSN: scheme://user:PASSWORD@host.
  [String.raw`[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:([^\s/@]+)@`, 1, false],
  // HTTP credentials: Bearer TOKEN, Basic BASE64.
  [String.raw`\b(?:[Bb]earer|BEARER)\s+([A-Za-z0-9._~+/-]{8,}=*)`, 1, true],
  [String.raw`\b(?:[Bb]asic|BASIC)\s+([A-Za-z0-9+/]{8,}={0,2})`, 1, true],
  // key=value and key: value pairs in DSNs, command lines and messages.
  [
    String.raw`(?i)\b(?:password|passwd|pwd|passphrase|secret|token|api[_-]?key|access[_-]?key|secret[_-]?key|private[_-]?key)\s*[=:]\s*([^\s,;&'\x22]+)`,
    1,
    false,
  ],
]);

const CASE_INSENSITIVE = "(?i)";

/**
 * One of PATTERNS as a RegExp: `g` to iterate, `d` for the capture groups' offsets, `u` for
 * code-point matching (and, with `i`, Unicode simple case folding, as the Rust `regex` crate's
 * `(?i)` folds), and a leading `(?i)` (the only inline flag PATTERNS use) turned into `i`.
 * @param {string} pattern
 */
function compile(pattern) {
  if (pattern.startsWith(CASE_INSENSITIVE)) {
    return new RegExp(pattern.slice(CASE_INSENSITIVE.length), "gdui");
  }
  return new RegExp(pattern, "gdu");
}

const SHAPES = PATTERNS.map(([pattern, group, check]) => ({
  regex: compile(pattern),
  group,
  check,
}));

const isAsciiDigit = (c) => c >= "0" && c <= "9";
const isAsciiUpper = (c) => c >= "A" && c <= "Z";
const isAsciiAlnum = (c) => isAsciiDigit(c) || isAsciiUpper(c) || (c >= "a" && c <= "z");

/**
 * Whether a `Bearer`/`Basic` credential looks like one rather than a word of prose: it has a
 * digit, a symbol, or an uppercase letter after its first character (`dXNlcjpwYXNz` does,
 * `authentication` and `Authentication` do not).
 * @param {string} secret
 */
export function looksLikeCredential(secret) {
  return Array.from(secret).some(
    (c, i) => isAsciiDigit(c) || !isAsciiAlnum(c) || (i > 0 && isAsciiUpper(c)),
  );
}

/** The [start, end) ranges (UTF-16 offsets) of the secrets in `text`, sorted and merged. */
function spans(text) {
  const found = [];
  for (const { regex, group, check } of SHAPES) {
    for (const m of text.matchAll(regex)) {
      const range = m.indices[group];
      if (range === undefined) continue; // the group did not take part in the match
      const secret = m[group];
      if (secret.includes(MARKER)) continue;
      if (check && !looksLikeCredential(secret)) continue;
      found.push([range[0], range[1]]);
    }
  }
  found.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  const merged = [];
  for (const [start, end] of found) {
    const last = merged[merged.length - 1];
    if (last !== undefined && start <= last[1]) last[1] = Math.max(last[1], end);
    else merged.push([start, end]);
  }
  return merged;
}

/**
 * Whether `text` holds a secret of a known shape.
 * @param {string} text
 */
export function containsSecret(text) {
  return spans(text).length > 0;
}

/**
 * `text` with every secret of a known shape replaced by MARKER; the rest is kept. Idempotent.
 * @param {string} text
 */
export function redactText(text) {
  const found = spans(text);
  if (found.length === 0) return text;
  let out = "";
  let at = 0;
  for (const [start, end] of found) {
    out += text.slice(at, start) + MARKER;
    at = end;
  }
  return out + text.slice(at);
}
