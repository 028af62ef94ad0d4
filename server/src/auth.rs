//! Who is calling, and what they may do. Bearer tokens are bound to one
//! namespace and one role (agent, submitter, operator); they come from a
//! tokens file or from `switchyard-server token create`, and only their
//! SHA-256 is kept (in memory for the file, in the store for created ones),
//! never the token, and never in a log line.
//!
//! Roles: an agent token registers agents and holds leases in its
//! namespace; a submitter submits, reads and cancels tasks of its
//! namespace; an operator can do that too and also see and steer agents of
//! its namespace. Nobody sees another namespace. With no tokens at all the
//! server is open (allowed only on a loopback address, or with
//! `--insecure`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, RwLock};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
pub use crate::model::Role;
use crate::model::TokenRecord;
use crate::store::Store;

/// The caller of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// No tokens are configured: everything is allowed.
    Open,
    /// A token holder.
    Principal {
        /// The token's label (safe to log).
        name: String,
        /// Its namespace.
        namespace: String,
        /// Its role.
        role: Role,
    },
}

/// What a request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Agent registration and sessions.
    Agent,
    /// Task submission, reading and cancelling.
    Tasks,
    /// Fleet viewing and steering.
    Fleet,
}

impl Caller {
    /// Refuses unless the caller may do `need` in `namespace`.
    pub fn require(&self, need: Need, namespace: &str) -> Result<()> {
        let Caller::Principal {
            namespace: own,
            role,
            ..
        } = self
        else {
            return Ok(());
        };
        let allowed = match need {
            Need::Agent => *role == Role::Agent,
            Need::Tasks => matches!(role, Role::Submitter | Role::Operator),
            Need::Fleet => *role == Role::Operator,
        };
        if !allowed {
            return Err(Error::PermissionDenied(format!(
                "a {} token may not {}",
                role.as_str(),
                match need {
                    Need::Agent => "act as an agent",
                    Need::Tasks => "submit or read tasks",
                    Need::Fleet => "see or steer agents",
                }
            )));
        }
        if own != namespace {
            return Err(Error::PermissionDenied(format!(
                "the token is for namespace {own}, not {namespace}"
            )));
        }
        Ok(())
    }

    /// Whether the caller may see objects of `namespace` at all (reads by id
    /// answer NOT_FOUND otherwise, so other namespaces stay invisible).
    pub fn sees(&self, namespace: &str) -> bool {
        match self {
            Caller::Open => true,
            Caller::Principal { namespace: own, .. } => own == namespace,
        }
    }
}

/// The SHA-256 of a token, in lowercase hex.
pub fn hash_token(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A new random token (256 bits, hex), prefixed so it is recognisable in
/// secret scanners.
pub fn generate_token() -> String {
    let bytes: [u8; 32] = rand::random();
    format!(
        "sy_{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

/// One entry of a tokens file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileToken {
    name: String,
    namespace: String,
    role: String,
    /// The token in clear (hashed on load), or…
    #[serde(default)]
    token: Option<String>,
    /// …its SHA-256 in hex.
    #[serde(default)]
    sha256: Option<String>,
}

/// Known tokens: the file's (loaded at start) and the store's (looked up on
/// first use and cached).
#[derive(Debug, Clone)]
pub struct Tokens {
    inner: Arc<TokensInner>,
}

#[derive(Debug)]
struct TokensInner {
    /// Token hash → record, from the file and from store lookups.
    known: RwLock<HashMap<String, TokenRecord>>,
    /// Where created tokens live.
    store: Arc<dyn Store>,
    /// False when no token exists anywhere: the server is open.
    enabled: bool,
}

impl Tokens {
    /// Loads the tokens file (if any) and checks whether the store holds
    /// tokens; auth is on when either has one.
    pub async fn load(file: Option<&Path>, store: Arc<dyn Store>) -> Result<Self> {
        let mut known = HashMap::new();
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                Error::Config(format!("reading the tokens file {}: {e}", path.display()))
            })?;
            let entries: Vec<FileToken> = serde_json::from_str(&text).map_err(|e| {
                Error::Config(format!(
                    "the tokens file {} is not valid: {e}",
                    path.display()
                ))
            })?;
            for (i, entry) in entries.into_iter().enumerate() {
                let Some(role) = Role::parse(&entry.role) else {
                    return Err(Error::Config(format!(
                        "tokens file entry {i} ({}): role must be agent, submitter or operator",
                        entry.name
                    )));
                };
                let hash = match (entry.token, entry.sha256) {
                    (Some(token), None) => hash_token(&token),
                    (None, Some(hash)) if hash.len() == 64 => hash.to_ascii_lowercase(),
                    _ => {
                        return Err(Error::Config(format!(
                            "tokens file entry {i} ({}): give exactly one of token or sha256 (64 hex digits)",
                            entry.name
                        )));
                    }
                };
                known.insert(
                    hash,
                    TokenRecord {
                        name: entry.name,
                        namespace: entry.namespace,
                        role,
                        created_at_ms: 0,
                    },
                );
            }
        }
        let enabled = !known.is_empty() || store.any_tokens().await?;
        Ok(Self {
            inner: Arc::new(TokensInner {
                known: RwLock::new(known),
                store,
                enabled,
            }),
        })
    }

    /// Whether any token is configured.
    pub fn enabled(&self) -> bool {
        self.inner.enabled
    }

    /// The caller presenting `authorization` (the request's header value,
    /// if it has one): UNAUTHENTICATED without a valid `Bearer` token while
    /// tokens are configured.
    pub async fn caller(&self, authorization: Option<&str>) -> Result<Caller> {
        if !self.inner.enabled {
            return Ok(Caller::Open);
        }
        let header = authorization.ok_or_else(|| {
            Error::Unauthenticated("missing authorization: Bearer <token>".to_owned())
        })?;
        let token = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                Error::Unauthenticated("authorization must be `Bearer <token>`".to_owned())
            })?;
        let hash = hash_token(token);
        let cached = self
            .inner
            .known
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&hash)
            .cloned();
        let record = match cached {
            Some(r) => r,
            None => {
                let record = self
                    .inner
                    .store
                    .find_token(&hash)
                    .await?
                    .ok_or_else(|| Error::Unauthenticated("unknown token".to_owned()))?;
                self.inner
                    .known
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(hash, record.clone());
                record
            }
        };
        Ok(Caller::Principal {
            name: record.name,
            namespace: record.namespace,
            role: record.role,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_allow_what_they_should() {
        let agent = Caller::Principal {
            name: "a".into(),
            namespace: "ns".into(),
            role: Role::Agent,
        };
        let sub = Caller::Principal {
            name: "s".into(),
            namespace: "ns".into(),
            role: Role::Submitter,
        };
        let op = Caller::Principal {
            name: "o".into(),
            namespace: "ns".into(),
            role: Role::Operator,
        };
        assert!(agent.require(Need::Agent, "ns").is_ok());
        assert!(agent.require(Need::Tasks, "ns").is_err());
        assert!(agent.require(Need::Fleet, "ns").is_err());
        assert!(sub.require(Need::Tasks, "ns").is_ok());
        assert!(sub.require(Need::Fleet, "ns").is_err());
        assert!(sub.require(Need::Agent, "ns").is_err());
        assert!(op.require(Need::Tasks, "ns").is_ok());
        assert!(op.require(Need::Fleet, "ns").is_ok());
        assert!(op.require(Need::Tasks, "other").is_err());
        assert!(Caller::Open.require(Need::Fleet, "any").is_ok());
    }

    #[test]
    fn hashes_are_sha256_hex() {
        assert_eq!(
            hash_token("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let t = generate_token();
        assert!(t.starts_with("sy_") && t.len() == 67);
    }
}
