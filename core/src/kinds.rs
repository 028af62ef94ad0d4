//! The task kinds an agent handles, and the rules for a kind's name. An agent advertises a list
//! of patterns; matching treats "the agent handles the task's kind" as a hard constraint.
//!
//! Patterns:
//! - an exact kind, e.g. `exec` or `build.docker`;
//! - a prefix pattern `P.*`, which handles every kind below `P` (`build.*` handles
//!   `build.docker` and `build.rust.release`, not `build` itself: advertise both for both);
//! - `*`, which handles every kind (an adapter that forwards whatever it is given).
//!
//! A kind is 1 to [`MAX_KIND_BYTES`] bytes of printable characters with no white space; `*` is never
//! part of a kind. An agent advertises at most [`MAX_PATTERNS`]
//! patterns. An empty list handles nothing: an agent with no handlers is granted nothing.

use std::collections::BTreeSet;

/// The longest kind, in bytes.
pub const MAX_KIND_BYTES: usize = 256;

/// The most patterns one agent advertises.
pub const MAX_PATTERNS: usize = 1_024;

/// What is wrong with a kind or a pattern.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KindError {
    /// Empty.
    #[error("is empty")]
    Empty,
    /// Longer than [`MAX_KIND_BYTES`].
    #[error("is {0} bytes, at most {MAX_KIND_BYTES} allowed")]
    TooLong(usize),
    /// White space or a control character.
    #[error("has {0:?}: no white space or control characters")]
    BadCharacter(char),
    /// `*` anywhere but a trailing `.*` or alone.
    #[error("has `*` other than as `*` alone or a trailing `.*`")]
    Wildcard,
    /// More than [`MAX_PATTERNS`] patterns.
    #[error("lists {0} kinds, at most {MAX_PATTERNS} allowed")]
    TooMany(usize),
}

/// Checks a task's kind.
pub fn check_kind(kind: &str) -> Result<(), KindError> {
    if kind.is_empty() {
        return Err(KindError::Empty);
    }
    if kind.len() > MAX_KIND_BYTES {
        return Err(KindError::TooLong(kind.len()));
    }
    if kind.contains('*') {
        return Err(KindError::Wildcard);
    }
    match kind.chars().find(|c| c.is_whitespace() || c.is_control()) {
        Some(c) => Err(KindError::BadCharacter(c)),
        None => Ok(()),
    }
}

/// The kinds an agent handles: exact kinds, prefixes (from `P.*`), or every kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct HandledKinds {
    exact: BTreeSet<String>,
    prefixes: BTreeSet<String>,
    all: bool,
}

impl HandledKinds {
    /// Handles nothing.
    pub fn none() -> Self {
        Self::default()
    }

    /// Handles every kind (`*`).
    pub fn every() -> Self {
        Self {
            all: true,
            ..Self::default()
        }
    }

    /// The kinds the patterns advertise; the first bad pattern's index and what is wrong.
    pub fn parse<S: AsRef<str>>(patterns: &[S]) -> Result<Self, (usize, KindError)> {
        if patterns.len() > MAX_PATTERNS {
            return Err((MAX_PATTERNS, KindError::TooMany(patterns.len())));
        }
        let mut kinds = Self::default();
        for (i, pattern) in patterns.iter().enumerate() {
            let pattern = pattern.as_ref();
            if pattern == "*" {
                kinds.all = true;
            } else if let Some(prefix) = pattern.strip_suffix(".*") {
                check_kind(prefix).map_err(|e| (i, e))?;
                kinds.prefixes.insert(prefix.to_owned());
            } else {
                check_kind(pattern).map_err(|e| (i, e))?;
                kinds.exact.insert(pattern.to_owned());
            }
        }
        Ok(kinds)
    }

    /// Whether a task of `kind` may go to the agent.
    pub fn handles(&self, kind: &str) -> bool {
        self.all || self.exact.contains(kind) || parents(kind).any(|p| self.prefixes.contains(p))
    }

    /// Whether it handles nothing.
    pub fn is_empty(&self) -> bool {
        !self.all && self.exact.is_empty() && self.prefixes.is_empty()
    }

    /// Whether it handles every kind.
    pub fn handles_every_kind(&self) -> bool {
        self.all
    }

    /// The exact kinds.
    pub fn exact(&self) -> impl Iterator<Item = &str> {
        self.exact.iter().map(String::as_str)
    }

    /// The prefixes of its `P.*` patterns.
    pub fn prefixes(&self) -> impl Iterator<Item = &str> {
        self.prefixes.iter().map(String::as_str)
    }

    /// The patterns, sorted: `*` first, then exact kinds and `P.*` patterns in order.
    pub fn patterns(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        if self.all {
            out.push("*".to_owned());
        }
        let mut rest: Vec<String> = self
            .exact
            .iter()
            .cloned()
            .chain(self.prefixes.iter().map(|p| format!("{p}.*")))
            .collect();
        rest.sort();
        out.extend(rest);
        out
    }
}

/// The dotted parents of a kind, longest first: `a.b.c` has `a.b` and `a` (the prefixes of the
/// `P.*` patterns that handle it).
pub fn parents(kind: &str) -> impl Iterator<Item = &str> {
    kind.char_indices()
        .rev()
        .filter(|(_, c)| *c == '.')
        .map(move |(i, _)| &kind[..i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_prefix_and_every_kind() {
        let kinds = HandledKinds::parse(&["exec", "build.*"]).unwrap();
        assert!(kinds.handles("exec"));
        assert!(kinds.handles("build.docker"));
        assert!(kinds.handles("build.rust.release"));
        assert!(!kinds.handles("build"));
        assert!(!kinds.handles("builder.x"));
        assert!(!kinds.handles("exec.sub"));
        assert_eq!(kinds.patterns(), ["build.*", "exec"]);
        assert!(HandledKinds::every().handles("anything"));
        assert!(!HandledKinds::none().handles("exec"));
        assert!(HandledKinds::none().is_empty());
    }

    #[test]
    fn bad_patterns_name_their_index() {
        assert_eq!(
            HandledKinds::parse(&["ok", "a*b"]),
            Err((1, KindError::Wildcard))
        );
        assert_eq!(HandledKinds::parse(&[".*"]), Err((0, KindError::Empty)));
        assert_eq!(
            HandledKinds::parse(&["with space"]),
            Err((0, KindError::BadCharacter(' ')))
        );
        assert!(check_kind(&"k".repeat(257)).is_err());
        assert!(check_kind("build.docker:amd64/v2").is_ok());
        assert!(check_kind("tab\there").is_err());
    }

    #[test]
    fn parents_are_the_dotted_prefixes() {
        assert_eq!(parents("a.b.c").collect::<Vec<_>>(), ["a.b", "a"]);
        assert_eq!(parents("a").count(), 0);
    }
}
