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
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime};

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
        /// For an agent token, the agent names it may register (empty: any).
        agent_names: Vec<String>,
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

    /// Refuses unless the caller may register an agent called `name`.
    pub fn may_register(&self, name: &str) -> Result<()> {
        let Caller::Principal { agent_names, .. } = self else {
            return Ok(());
        };
        if crate::model::token::name_allowed(agent_names, name) {
            Ok(())
        } else {
            Err(Error::PermissionDenied(format!(
                "this token may register only agents named {}",
                agent_names.join(", ")
            )))
        }
    }

    /// The token's name, for a principal; `None` when open.
    pub fn principal(&self) -> Option<&str> {
        match self {
            Caller::Open => None,
            Caller::Principal { name, .. } => Some(name),
        }
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
    /// For an agent token: the agent names it may register (`*` wildcards).
    #[serde(default)]
    agent_names: Vec<String>,
    /// When it stops being valid, in milliseconds since the epoch.
    #[serde(default)]
    expires_at_ms: Option<i64>,
}

/// How long a token's looked-up record, the tokens file and "is any token
/// configured" are trusted before they are read again: a revocation, an
/// expiry, an edited file or the first token of an open server takes
/// effect on every replica within this.
pub const FRESH: Duration = Duration::from_secs(1);

/// How often a token's last use is written, at most (per replica).
const TOUCH_EVERY: Duration = Duration::from_secs(60);

/// Most store lookups kept in memory; past it the cache starts afresh (so a
/// flood of made-up tokens cannot grow it).
const MAX_CACHED: usize = 10_000;

/// Known tokens: the file's (re-read when it changes) and the store's
/// (looked up, and looked up again once [`FRESH`] has passed).
#[derive(Debug, Clone)]
pub struct Tokens {
    inner: Arc<TokensInner>,
}

#[derive(Debug)]
struct TokensInner {
    /// Where created tokens live.
    store: Arc<dyn Store>,
    /// The tokens file, if any.
    file: Option<PathBuf>,
    state: RwLock<State>,
}

#[derive(Debug)]
struct State {
    /// Token hash → record, from the file.
    file_tokens: HashMap<String, TokenRecord>,
    /// The file's modification time when it was read.
    file_modified: Option<SystemTime>,
    /// When the file and `enabled` were last checked.
    checked_at: Instant,
    /// False while no token exists anywhere: the server is open.
    enabled: bool,
    /// Token hash → record and when it was read, from the store.
    cached: HashMap<String, (TokenRecord, Instant)>,
    /// Token hash → when its last use was written.
    touched: HashMap<String, Instant>,
}

/// The wall clock: token expiry and revocation times are wall-clock times,
/// set by the `token` commands.
pub fn now_ms() -> i64 {
    crate::clock::Clock::system().now_ms()
}

/// Reads a tokens file: token hash → record.
fn read_file(path: &Path) -> Result<HashMap<String, TokenRecord>> {
    let mut known = HashMap::new();
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Config(format!("reading the tokens file {}: {e}", path.display())))?;
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
        let mut record = TokenRecord::new(entry.name, entry.namespace, role, 0);
        record.agent_names = entry.agent_names;
        record.expires_at_ms = entry.expires_at_ms;
        record.id = hash.chars().take(12).collect();
        known.insert(hash, record);
    }
    Ok(known)
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl Tokens {
    /// Loads the tokens file (if any) and checks whether the store holds
    /// tokens; auth is on when either has one, and turns on within
    /// [`FRESH`] of the first token appearing later.
    pub async fn load(file: Option<&Path>, store: Arc<dyn Store>) -> Result<Self> {
        let file_tokens = match file {
            Some(path) => read_file(path)?,
            None => HashMap::new(),
        };
        let enabled = !file_tokens.is_empty() || store.any_tokens().await?;
        Ok(Self {
            inner: Arc::new(TokensInner {
                store,
                file: file.map(Path::to_path_buf),
                state: RwLock::new(State {
                    file_modified: file.and_then(modified),
                    file_tokens,
                    checked_at: Instant::now(),
                    enabled,
                    cached: HashMap::new(),
                    touched: HashMap::new(),
                }),
            }),
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.inner
            .state
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.inner
            .state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether any token is configured.
    pub fn enabled(&self) -> bool {
        self.read().enabled
    }

    /// Re-reads the tokens file if it changed, and (while open) whether the
    /// store has a token now, once [`FRESH`] has passed since the last look.
    async fn refresh(&self) -> Result<()> {
        let (stale, enabled) = {
            let state = self.read();
            (state.checked_at.elapsed() >= FRESH, state.enabled)
        };
        if !stale {
            return Ok(());
        }
        self.write().checked_at = Instant::now();
        if let Some(path) = &self.inner.file {
            let now_modified = modified(path);
            if now_modified != self.read().file_modified {
                match read_file(path) {
                    Ok(tokens) => {
                        let mut state = self.write();
                        state.file_tokens = tokens;
                        state.file_modified = now_modified;
                        state.enabled |= !state.file_tokens.is_empty();
                        tracing::info!(tokens = state.file_tokens.len(), "tokens file re-read");
                    }
                    // Half-written or broken: keep what was read before.
                    Err(err) => tracing::warn!(cause = %err, "tokens file not re-read"),
                }
            }
        }
        if !enabled && self.inner.store.any_tokens().await? {
            self.write().enabled = true;
            tracing::info!("a token was created: authentication is on from now");
        }
        Ok(())
    }

    /// The caller presenting `authorization` (the request's header value,
    /// if it has one): UNAUTHENTICATED without a valid `Bearer` token while
    /// tokens are configured.
    pub async fn caller(&self, authorization: Option<&str>) -> Result<Caller> {
        self.refresh().await?;
        if !self.read().enabled {
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
        let (from_file, cached) = {
            let state = self.read();
            (
                state.file_tokens.get(&hash).cloned(),
                state
                    .cached
                    .get(&hash)
                    .filter(|(_, at)| at.elapsed() < FRESH)
                    .map(|(r, _)| r.clone()),
            )
        };
        let from_store = from_file.is_none();
        let record = match from_file.or(cached) {
            Some(r) => r,
            None => {
                let record = self
                    .inner
                    .store
                    .find_token(&hash)
                    .await?
                    .ok_or_else(|| Error::Unauthenticated("unknown token".to_owned()))?;
                let mut state = self.write();
                if state.cached.len() >= MAX_CACHED {
                    state.cached.clear();
                }
                state
                    .cached
                    .insert(hash.clone(), (record.clone(), Instant::now()));
                record
            }
        };
        let now = now_ms();
        if record.revoked_at_ms.is_some_and(|at| at <= now) {
            return Err(Error::Unauthenticated("the token was revoked".to_owned()));
        }
        if record.expires_at_ms.is_some_and(|at| at <= now) {
            return Err(Error::Unauthenticated("the token has expired".to_owned()));
        }
        if from_store {
            self.touch(hash, now);
        }
        Ok(Caller::Principal {
            name: record.name,
            namespace: record.namespace,
            role: record.role,
            agent_names: record.agent_names,
        })
    }

    /// Writes the token's last use, at most once per [`TOUCH_EVERY`], off
    /// the request's path.
    fn touch(&self, hash: String, now: i64) {
        {
            let mut state = self.write();
            if state
                .touched
                .get(&hash)
                .is_some_and(|at| at.elapsed() < TOUCH_EVERY)
            {
                return;
            }
            if state.touched.len() >= MAX_CACHED {
                state.touched.clear();
            }
            state.touched.insert(hash.clone(), Instant::now());
        }
        let store = self.inner.store.clone();
        tokio::spawn(async move {
            if let Err(err) = store.touch_token(&hash, now).await {
                tracing::debug!(cause = %err, "a token's last use was not written");
            }
        });
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
            agent_names: Vec::new(),
        };
        let sub = Caller::Principal {
            name: "s".into(),
            namespace: "ns".into(),
            role: Role::Submitter,
            agent_names: Vec::new(),
        };
        let op = Caller::Principal {
            name: "o".into(),
            namespace: "ns".into(),
            role: Role::Operator,
            agent_names: Vec::new(),
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
