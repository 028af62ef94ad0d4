//! Bearer tokens as stored ([`TokenRecord`]: who a token is for, never the
//! token) and the [`Role`]s they grant.

use super::names::StoredName;

/// What a token lets its holder do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Registers agents and holds leases.
    Agent,
    /// Submits, reads and cancels tasks.
    Submitter,
    /// A submitter who may also see and steer agents.
    Operator,
}

impl StoredName for Role {
    const WHAT: &'static str = "role";
    const NAMES: &'static [(Self, &'static str)] = &[
        (Self::Agent, "agent"),
        (Self::Submitter, "submitter"),
        (Self::Operator, "operator"),
    ];
}

impl Role {
    /// The role's name as written in token files and stored.
    pub fn as_str(self) -> &'static str {
        StoredName::stored(self)
    }

    /// Parses `agent`, `submitter` or `operator`.
    pub fn parse(text: &str) -> Option<Self> {
        Self::from_stored(text).ok()
    }
}

/// A bearer token as stored: who it is for, never the token itself (the
/// store keys it by the token's SHA-256).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    /// A label for people (unique per namespace).
    pub name: String,
    /// The namespace the token is bound to.
    pub namespace: String,
    /// What it may do.
    pub role: Role,
    /// When it was created.
    pub created_at_ms: i64,
    /// When it stops being valid, if it does.
    pub expires_at_ms: Option<i64>,
    /// When it was (or, for a rotated token, will be) revoked.
    pub revoked_at_ms: Option<i64>,
    /// When it last authenticated a request (kept to the minute).
    pub last_used_at_ms: Option<i64>,
    /// For an agent token: the agent names it may register, exact or with
    /// `*` wildcards (`build-*`); empty for any name.
    pub agent_names: Vec<String>,
    /// The first 12 hex digits of the token's SHA-256: how listings tell
    /// tokens of one name apart (it reveals nothing of the token).
    pub id: String,
}

impl TokenRecord {
    /// A new token's record: valid until `expires_at_ms`, if given.
    pub fn new(name: String, namespace: String, role: Role, created_at_ms: i64) -> Self {
        Self {
            name,
            namespace,
            role,
            created_at_ms,
            expires_at_ms: None,
            revoked_at_ms: None,
            last_used_at_ms: None,
            agent_names: Vec::new(),
            id: String::new(),
        }
    }

    /// Whether the token authenticates at `now_ms`.
    pub fn valid_at(&self, now_ms: i64) -> bool {
        self.revoked_at_ms.is_none_or(|at| at > now_ms)
            && self.expires_at_ms.is_none_or(|at| at > now_ms)
    }

    /// Whether the token may register an agent called `name`.
    pub fn may_register(&self, name: &str) -> bool {
        name_allowed(&self.agent_names, name)
    }
}

/// Whether `name` matches one of `patterns` (exact, or with `*` wildcards);
/// every name does when there are none.
pub fn name_allowed(patterns: &[String], name: &str) -> bool {
    patterns.is_empty() || patterns.iter().any(|p| glob(p, name))
}

/// Whether `name` matches `pattern`, where `*` matches any run of characters.
fn glob(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty(); // no `*`: exact
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn globs() {
        assert!(glob("build-1", "build-1"));
        assert!(!glob("build-1", "build-12"));
        assert!(glob("build-*", "build-12"));
        assert!(!glob("build-*", "deploy-1"));
        assert!(glob("*-gpu", "a-gpu"));
        assert!(glob("a*b*c", "aXbYc"));
        assert!(!glob("a*b*c", "aXcYb"));
        assert!(glob("*", "anything"));
        assert!(!glob("ab*ab", "ab"));
    }
}
