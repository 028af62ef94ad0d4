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
}
