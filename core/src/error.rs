//! The crate's typed errors: one precise error per fallible operation ([`DiffError`] for patch
//! application, [`PlacementError`] for placement validation, [`SelectorError`] for selector
//! parsing), and [`Error`] wrapping them for callers that handle all three alike. Merges never
//! fail; they report rejections instead (see [`crate::tier::Rejection`]).

use crate::limits::Violation;

/// Why a diff could not be applied. The server answers every variant with a resync request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiffError {
    /// The patch was made against a generation other than the one held.
    #[error("patch is against generation {base}, held generation is {held}")]
    WrongGeneration {
        /// The generation the receiver holds.
        held: u64,
        /// The generation the patch says it applies to.
        base: u64,
    },
    /// An operation could not be applied; nothing was applied.
    #[error("operation {index} ({op} {path}) failed: {reason}")]
    OperationFailed {
        /// Zero-based index of the failing operation.
        index: usize,
        /// The operation name (`add`, `remove`, `replace`, `move`, `copy`, `test`).
        op: String,
        /// The JSON Pointer the operation targets.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// The patch itself, or the document it would produce, is over the limits.
    #[error("{what} is over the limits: {}", first_violation(.violations))]
    OverLimits {
        /// `patch` or `document`.
        what: &'static str,
        /// Every violation found.
        violations: Vec<Violation>,
    },
    /// The patch would turn the document into something other than a JSON object.
    #[error("patch would make the document a {kind}, not an object")]
    NotAnObject {
        /// The JSON type the document would have.
        kind: &'static str,
    },
}

fn first_violation(violations: &[Violation]) -> String {
    violations
        .first()
        .map(ToString::to_string)
        .unwrap_or_default()
}

/// A placement that cannot be compiled, naming the field (`requirements[2].values`,
/// `json_schema`, `preferences[0].weight`) and what was wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct PlacementError {
    /// The offending field, as a path into the placement message.
    pub field: String,
    /// What was wrong, for people.
    pub message: String,
}

impl PlacementError {
    pub(crate) fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// A selector that does not parse: where, what was expected there, and what was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at byte {offset}: expected {expected}, found {found}")]
pub struct SelectorError {
    /// Byte offset into the selector text.
    pub offset: usize,
    /// What the grammar expected at `offset`.
    pub expected: String,
    /// What was there instead (`end of input` at the end).
    pub found: String,
}

/// Any error of this crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// See [`DiffError`].
    #[error(transparent)]
    Diff(#[from] DiffError),
    /// See [`PlacementError`].
    #[error(transparent)]
    Placement(#[from] PlacementError),
    /// See [`SelectorError`].
    #[error("selector {0}")]
    Selector(#[from] SelectorError),
}
