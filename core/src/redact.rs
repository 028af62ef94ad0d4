//! Secret redaction. Before a document leaves an agent, and again when the server receives one,
//! every value under a key that looks sensitive is replaced by [`MARKER`]; the paths redacted are
//! returned so the server can report them (never their values).
//!
//! A key is sensitive when one of its words, split at `_`, `-`, `.`, spaces and camelCase
//! boundaries (`githubToken` → `github`, `token`; `X-Auth-Token` → `x`, `auth`, `token`;
//! `APIKey` → `api`, `key`), is one of `token`, `secret`, `secrets`, `password`, `passwords`,
//! `passwd`, `pwd`, `passphrase`, `authorization`, `cookie`, `cookies`, `credential`,
//! `credentials`, `pat`, `jwt`, or when two adjacent words are one of `api key`,
//! `private key`, `access key`, `secret key`, `signing key`, `ssh key`, `encryption key`,
//! `master key`, `session key`, `client key` or `account key` (also written as one word:
//! `apikey`, `privatekey`, `accesskey`, ...). The plural
//! `tokens` is deliberately **not** sensitive: it names counters such as `max_tokens` or
//! `tokens_per_minute`, and a test pins this. Keys listed in the static tier's `sensitive` array
//! are also sensitive; an entry matches a key name (ASCII case-insensitive) or a full dotted path.
//!
//! Every non-null value under a sensitive key is replaced, whatever its type; `null` is left
//! alone (it holds no secret), as is a value that already is the marker, so redaction is
//! idempotent and a second pass reports nothing.
//!
//! Values are looked at too, whatever their key: a string holding a secret of a known shape
//! ([`crate::secrets`]: cloud and forge tokens, JWTs, private keys, passwords in URLs,
//! `Bearer` credentials) is replaced whole. Free text shown to people (reasons, messages) goes
//! through [`crate::secrets::redact_text`] instead, which keeps the words around the secret.

use crate::limits::join;
use json_patch::jsonptr::Pointer;
use serde_json::Value;
use std::collections::BTreeSet;

/// What a redacted value becomes (defined beside the secret shapes, which
/// recognise it).
pub use crate::secrets::MARKER;

const SENSITIVE_WORDS: &[&str] = &[
    "token",
    "secret",
    "secrets",
    "password",
    "passwords",
    "passwd",
    "authorization",
    "cookie",
    "cookies",
    "credential",
    "credentials",
    "pwd",
    "passphrase",
    "pat",
    "jwt",
    "apikey",
    "privatekey",
    "accesskey",
    "secretkey",
    "signingkey",
    "sshkey",
    "encryptionkey",
    "masterkey",
    "sessionkey",
    "clientkey",
    "accountkey",
];

/// `(first, "key")` pairs: `api key`, `access_key`, `SigningKey`, ...
const SENSITIVE_KEY_PREFIXES: &[&str] = &[
    "api",
    "private",
    "access",
    "secret",
    "signing",
    "ssh",
    "encryption",
    "master",
    "session",
    "client",
    "account",
];

/// Splits a key into lowercase words at separators and camelCase boundaries.
pub fn key_words(key: &str) -> Vec<String> {
    let chars: Vec<char> = key.chars().collect();
    let mut words = Vec::new();
    let mut current = String::new();
    for (i, &c) in chars.iter().enumerate() {
        if !c.is_alphanumeric() {
            if !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
            continue;
        }
        if c.is_uppercase() && !current.is_empty() {
            let prev = chars[i - 1];
            let next_is_lower = chars.get(i + 1).is_some_and(|n| n.is_lowercase());
            // fooBar → foo|Bar ; APIKey → API|Key ; v2Token → v2|Token
            if prev.is_lowercase()
                || prev.is_ascii_digit()
                || (prev.is_uppercase() && next_is_lower)
            {
                words.push(std::mem::take(&mut current));
            }
        }
        current.extend(c.to_lowercase());
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
}

/// Whether `key` looks sensitive by its words (see the module doc).
pub fn is_sensitive_key(key: &str) -> bool {
    let words = key_words(key);
    words.iter().any(|w| SENSITIVE_WORDS.contains(&w.as_str()))
        || words
            .windows(2)
            .any(|p| p[1] == "key" && SENSITIVE_KEY_PREFIXES.contains(&p[0].as_str()))
}

/// The extra sensitive keys a static tier declares in its `sensitive` array of strings.
pub fn declared_sensitive(static_tier: &Value) -> BTreeSet<String> {
    static_tier
        .get("sensitive")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_ascii_lowercase)
        .collect()
}

/// Replaces every value under a sensitive key in `doc` with [`MARKER`] and returns the dotted
/// paths it changed, in document order. `extra` holds lowercase key names or dotted paths (see
/// [`declared_sensitive`]).
pub fn redact(doc: &mut Value, extra: &BTreeSet<String>) -> Vec<String> {
    let mut paths = Vec::new();
    walk(doc, "", extra, &mut paths);
    paths
}

/// [`redact`] on a copy; for callers that must keep the original.
pub fn redacted(doc: &Value, extra: &BTreeSet<String>) -> (Value, Vec<String>) {
    let mut copy = doc.clone();
    let paths = redact(&mut copy, extra);
    (copy, paths)
}

/// [`redact`] for a document whose every value outside the subtrees at
/// `changed` (the places a JSON Patch touched, see [`crate::diff::touched`])
/// is already redacted under the same `extra`: only those subtrees are
/// walked, and the keys on the way to them checked. A subtree under an
/// array is walked from the array (a patch can shift items). The result is
/// what [`redact`] would give; the caller falls back to it when the patch
/// touched the `sensitive` declaration itself.
pub fn redact_at<'p>(
    doc: &mut Value,
    changed: impl IntoIterator<Item = &'p Pointer>,
    extra: &BTreeSet<String>,
) -> Vec<String> {
    let mut out = Vec::new();
    for pointer in changed {
        let mut node = &mut *doc;
        let mut path = String::new();
        let mut tokens = pointer.tokens();
        loop {
            let token = match (tokens.next(), node.is_object()) {
                (Some(token), true) => token,
                // The place itself, or an array or scalar on the way.
                _ => {
                    walk(node, &path, extra, &mut out);
                    break;
                }
            };
            let key = token.decoded();
            let Some(child) = node.as_object_mut().and_then(|m| m.get_mut(key.as_ref())) else {
                break; // removed
            };
            let child_path = join(&path, &key);
            if is_sensitive(&key, &child_path, extra) {
                redact_value(child, child_path, &mut out);
                break;
            }
            node = child;
            path = child_path;
        }
    }
    out
}

fn is_sensitive(key: &str, path: &str, extra: &BTreeSet<String>) -> bool {
    is_sensitive_key(key)
        || (!extra.is_empty()
            && (extra.contains(&key.to_ascii_lowercase())
                || extra.contains(&path.to_ascii_lowercase())))
}

fn redact_value(value: &mut Value, path: String, out: &mut Vec<String>) {
    if !value.is_null() && value.as_str() != Some(MARKER) {
        *value = Value::String(MARKER.to_owned());
        out.push(path);
    }
}

fn walk(value: &mut Value, path: &str, extra: &BTreeSet<String>, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                let child_path = join(path, key);
                if is_sensitive(key, &child_path, extra) {
                    redact_value(child, child_path, out);
                } else {
                    walk(child, &child_path, extra, out);
                }
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter_mut().enumerate() {
                walk(child, &join(path, &i.to_string()), extra, out);
            }
        }
        Value::String(text) if crate::secrets::contains_secret(text) => {
            *value = Value::String(MARKER.to_owned());
            out.push(path.to_owned());
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn redact_at_matches_a_whole_redaction() {
        let extra: BTreeSet<String> = ["build.signing".to_owned(), "pin".to_owned()].into();
        let mut doc = json!({
            "memory": {"free": 1},
            "x": [1, 2],
            "build": {"signing": "[redacted]", "name": "a"},
            "db": {"password": "[redacted]"}
        });
        let patches = [
            json!([{"op": "replace", "path": "/memory", "value": {"free": 2, "api_key": "k1"}}]),
            json!([{"op": "add", "path": "/x/0", "value": {"password": "p"}},
                   {"op": "add", "path": "/x/0", "value": 0}]),
            json!([{"op": "add", "path": "/db/password", "value": "again"}]),
            json!([{"op": "replace", "path": "/build/signing", "value": {"k": "v"}}]),
            json!([{"op": "add", "path": "/tools", "value": {"gh": {"githubToken": "t", "pin": 4}}}]),
            json!([{"op": "add", "path": "/plain", "value": {"a": "b"}},
                   {"op": "move", "from": "/plain", "path": "/db/nested"}]),
            json!([{"op": "copy", "from": "/memory", "path": "/m2"}]),
            json!([{"op": "remove", "path": "/tools"}]),
            json!([{"op": "replace", "path": "", "value": {"token": "t", "a": {"cookie": 1}}}]),
        ];
        for patch in patches {
            let patch: crate::diff::Patch = serde_json::from_value(patch).unwrap();
            json_patch::patch(&mut doc, &patch).unwrap();
            let mut whole = doc.clone();
            let expected = redact(&mut whole, &extra);
            let got = redact_at(&mut doc, crate::diff::touched(&patch), &extra);
            assert_eq!(doc, whole, "after {patch:?}");
            let (mut got, mut expected) = (got, expected);
            got.sort();
            expected.sort();
            assert_eq!(got, expected, "after {patch:?}");
        }
    }

    #[test]
    fn words_split_on_case_and_separators() {
        assert_eq!(key_words("githubToken"), vec!["github", "token"]);
        assert_eq!(key_words("X-Auth-Token"), vec!["x", "auth", "token"]);
        assert_eq!(key_words("db_password"), vec!["db", "password"]);
        assert_eq!(key_words("APIKey"), vec!["api", "key"]);
        assert_eq!(
            key_words("HTTPServer2Port"),
            vec!["http", "server2", "port"]
        );
    }

    #[test]
    fn sensitive_keys() {
        for k in [
            "token",
            "githubToken",
            "X-Auth-Token",
            "db_password",
            "apiKey",
            "api_key",
            "API_KEY",
            "apikey",
            "Authorization",
            "cookie",
            "set-cookie",
            "private_key",
            "privateKey",
            "credentials",
            "aws.credential",
            "AWS_ACCESS_KEY_ID",
            "aws_secret_access_key",
            "GITHUB_PAT",
            "access_key",
            "passphrase",
            "ssh_key",
            "signingKey",
            "DB_PWD",
            "client_secret",
            "passwd",
            "secrets",
            "SECRET",
        ] {
            assert!(is_sensitive_key(k), "{k} should be sensitive");
        }
    }

    #[test]
    fn plural_tokens_and_lookalikes_are_not_sensitive() {
        for k in [
            "max_tokens",
            "tokens",
            "tokensPerMinute",
            "key",
            "keyboard",
            "public_key",
            "monkey",
            "secretary",
            "author",
        ] {
            assert!(!is_sensitive_key(k), "{k} should not be sensitive");
        }
    }

    #[test]
    fn redacts_nested_and_in_arrays_reports_paths() {
        let mut d = json!({
            "os": "linux",
            "github": {"token": "ghp_x", "user": "me"},
            "registries": [{"url": "u", "password": "p"}],
            "max_tokens": 4096,
            "nested_secret": {"deep": 1},
            "cookie": null,
        });
        let paths = redact(&mut d, &BTreeSet::new());
        assert_eq!(
            paths,
            vec!["github.token", "nested_secret", "registries.0.password"]
        );
        assert_eq!(d["github"]["token"], json!(MARKER));
        assert_eq!(d["nested_secret"], json!(MARKER));
        assert_eq!(d["max_tokens"], json!(4096));
        assert_eq!(d["cookie"], Value::Null);
    }

    #[test]
    fn redaction_is_idempotent() {
        let mut d = json!({"apiKey": "k", "x": {"password": ["a"]}});
        let first = redact(&mut d, &BTreeSet::new());
        let once = d.clone();
        let second = redact(&mut d, &BTreeSet::new());
        assert_eq!(first.len(), 2);
        assert!(second.is_empty());
        assert_eq!(d, once);
    }

    #[test]
    fn declared_sensitive_keys_and_paths() {
        let static_tier = json!({"sensitive": ["LicenseServer", "db.dsn", 3]});
        let extra = declared_sensitive(&static_tier);
        assert_eq!(extra.len(), 2);
        let mut d = json!({"licenseserver": "s", "db": {"dsn": "postgres://", "host": "h"}, "other": {"dsn": "keep"}});
        let paths = redact(&mut d, &extra);
        assert_eq!(paths, vec!["db.dsn", "licenseserver"]);
        assert_eq!(d["other"]["dsn"], json!("keep"));
    }
}
