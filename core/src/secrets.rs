//! Secrets found by their shape, whatever key they sit under: cloud and forge tokens, JWTs, PEM
//! private keys, passwords inside URLs and DSNs, and `Bearer`/`Basic` credentials. The shapes
//! are a subset of gitleaks' default rule set (`config/gitleaks.toml`: `aws-access-token`,
//! `github-pat`, `github-fine-grained-pat`, `github-oauth`, `github-app-token`,
//! `github-refresh-token`, `gitlab-pat`, `slack-*-token`, `slack-webhook-url`, `jwt`,
//! `private-key`, `stripe-access-token`, `gcp-api-key`, `npm-access-token`, `pypi-upload-token`,
//! `openai-api-key`, `anthropic-api-key`), written without look-around so the Rust core and the
//! Python and Node runners use the same expressions; `tests/conformance/redaction.json` holds all
//! three to them, with look-alikes that must be left alone (git shas, UUIDs, digests, prose).
//!
//! A document's string value holding a secret is replaced whole (see [`crate::redact`]); free
//! text (a failure message, a refusal, a drain reason) keeps its words and loses only the
//! secret: [`redact_text`] replaces the token, the password of a URL, the value after
//! `password=` or the credential after `Bearer`.

use regex::{Regex, RegexSet};
use std::sync::LazyLock;

/// What a redacted value or secret becomes.
pub const MARKER: &str = "[redacted]";

/// One shape: the expression, and which capture group is the secret (0: the whole match).
struct Shape {
    regex: Regex,
    group: usize,
    /// Whether the secret must also look like a credential rather than a word
    /// (see [`looks_like_credential`]).
    credential_check: bool,
}

fn shape(pattern: &str, group: usize, credential_check: bool) -> Shape {
    Shape {
        regex: Regex::new(pattern).expect("secret shapes compile"),
        group,
        credential_check,
    }
}

/// The shapes, in the order they are tried. Kept in step with
/// `clients/python/switchyard_runner/core/secrets.py` and `clients/node/src/core/secrets.js`.
pub const PATTERNS: &[(&str, usize, bool)] = &[
    // PEM private keys, the whole block when it is there.
    (
        r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----(?:[\s\S]*?-----END[A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----)?",
        0,
        false,
    ),
    // AWS access key ids.
    (
        r"\b(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b",
        0,
        false,
    ),
    // GitHub: classic, OAuth, app, refresh and fine-grained tokens.
    (r"\bgh[pousr]_[A-Za-z0-9]{36,255}\b", 0, false),
    (r"\bgithub_pat_[A-Za-z0-9_]{22,255}\b", 0, false),
    // GitLab personal, deploy and runner tokens.
    (r"\bgl(?:pat|dt|rt|ptt)-[A-Za-z0-9_-]{20,}", 0, false),
    // Slack tokens and webhooks.
    (r"\bxox[abposr]-[A-Za-z0-9-]{10,}", 0, false),
    (
        r"https://hooks\.slack\.com/(?:services|workflows)/[A-Za-z0-9+/_-]{20,}",
        0,
        false,
    ),
    // Stripe, Google API, npm, PyPI, OpenAI and Anthropic keys; Switchyard's own tokens.
    (r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{20,}", 0, false),
    (r"\bAIza[A-Za-z0-9_-]{35}", 0, false),
    (r"\bnpm_[A-Za-z0-9]{36}\b", 0, false),
    (r"\bpypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{50,}", 0, false),
    (
        r"\bsk-(?:proj-|ant-[a-z0-9]+-)?[A-Za-z0-9_-]{20,}",
        0,
        false,
    ),
    (r"\bsy_[0-9a-f]{64}\b", 0, false),
    // JSON Web Tokens.
    (
        r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]*",
        0,
        false,
    ),
    // The password of a URL or DSN: scheme://user:PASSWORD@host.
    (r"[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:([^\s/@]+)@", 1, false),
    // HTTP credentials: Bearer TOKEN, Basic BASE64.
    (
        r"\b(?:[Bb]earer|BEARER)\s+([A-Za-z0-9._~+/-]{8,}=*)",
        1,
        true,
    ),
    (r"\b(?:[Bb]asic|BASIC)\s+([A-Za-z0-9+/]{8,}={0,2})", 1, true),
    // key=value and key: value pairs in DSNs, command lines and messages.
    (
        r"(?i)\b(?:password|passwd|pwd|passphrase|secret|token|api[_-]?key|access[_-]?key|secret[_-]?key|private[_-]?key)\s*[=:]\s*([^\s,;&'\x22]+)",
        1,
        false,
    ),
];

static SHAPES: LazyLock<Vec<Shape>> = LazyLock::new(|| {
    PATTERNS
        .iter()
        .map(|&(pattern, group, check)| shape(pattern, group, check))
        .collect()
});

/// All shapes at once, so text holding none (nearly all of it) is read once.
static ANY: LazyLock<RegexSet> =
    LazyLock::new(|| RegexSet::new(PATTERNS.iter().map(|p| p.0)).expect("secret shapes compile"));

/// Whether a `Bearer`/`Basic` credential looks like one rather than a word of prose: it has a
/// digit, a symbol, or an uppercase letter after its first character (`dXNlcjpwYXNz` does,
/// `authentication` and `Authentication` do not).
fn looks_like_credential(secret: &str) -> bool {
    secret.chars().enumerate().any(|(i, c)| {
        c.is_ascii_digit() || !c.is_ascii_alphanumeric() || (i > 0 && c.is_ascii_uppercase())
    })
}

/// The byte ranges of the secrets in `text`, sorted and merged.
fn spans(text: &str) -> Vec<(usize, usize)> {
    let mut found: Vec<(usize, usize)> = Vec::new();
    for index in ANY.matches(text).iter() {
        let shape = &SHAPES[index];
        for caps in shape.regex.captures_iter(text) {
            let Some(m) = caps.get(shape.group) else {
                continue;
            };
            if m.as_str() == MARKER || m.as_str().contains(MARKER) {
                continue;
            }
            if shape.credential_check && !looks_like_credential(m.as_str()) {
                continue;
            }
            found.push((m.start(), m.end()));
        }
    }
    found.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::new();
    for (start, end) in found {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// Whether `text` holds a secret of a known shape.
pub fn contains_secret(text: &str) -> bool {
    !spans(text).is_empty()
}

/// `text` with every secret of a known shape replaced by [`MARKER`]; the rest is kept. Idempotent.
pub fn redact_text(text: &str) -> String {
    let spans = spans(text);
    if spans.is_empty() {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (start, end) in spans {
        out.push_str(&text[at..start]);
        out.push_str(MARKER);
        at = end;
    }
    out.push_str(&text[at..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_shapes() {
        for secret in [
            "AKIAIOSFODNN7EXAMPLE",
            "ghp_0123456789abcdefghijklmnopqrstuvwxyz",
            "glpat-abcdefghij0123456789",
            "xoxb-1234567890-abcdefghij",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
            "-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----",
            "postgres://u:hunter2@db/prod",
            "Bearer abcdef123456",
            "Basic dXNlcjpwYXNz",
            "host=db password=hunter2",
        ] {
            assert!(contains_secret(secret), "{secret}");
            assert!(redact_text(secret).contains(MARKER), "{secret}");
        }
    }

    #[test]
    fn leaves_look_alikes_alone() {
        for text in [
            "3f786850e387550fdab836ed7e6dc881de23001b",
            "0b7a1e9c-8d43-4a7b-9a1e-2f6b5c1d9e00",
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "Basic authentication is off",
            "Bearer authentication failed",
            "postgres://db:5432/prod",
            "max_tokens=4096",
            "https://example.com/a:b@c",
            "[redacted]",
        ] {
            assert!(!contains_secret(text), "{text}");
            assert_eq!(redact_text(text), text);
        }
    }

    #[test]
    fn text_keeps_its_words() {
        assert_eq!(
            redact_text("connect postgres://app:hunter2@db:5432/sy failed"),
            "connect postgres://app:[redacted]@db:5432/sy failed"
        );
        assert_eq!(
            redact_text("auth: Bearer abc.def-123 refused"),
            "auth: Bearer [redacted] refused"
        );
        let once = redact_text("token=abc password=xyz");
        assert_eq!(once, "token=[redacted] password=[redacted]");
        assert_eq!(redact_text(&once), once);
    }
}
