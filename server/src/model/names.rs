//! The name each lifecycle enum is stored under (a text column), in one
//! place: [`StoredName`] turns a value into its name and back, and a name the
//! code does not know is an [`UnknownState`] (a newer schema, or damage),
//! never a silent default.

use std::fmt;

/// An enum stored as text: its values and their names.
pub trait StoredName: Copy + PartialEq + 'static {
    /// What the enum is, for errors (`task state`, `agent status`).
    const WHAT: &'static str;
    /// Every value, each with its stored name.
    const NAMES: &'static [(Self, &'static str)];

    /// The stored name. (A method name of its own: the core's agent
    /// status has an `as_str` of its own, the wire's names.)
    fn stored(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(value, _)| *value == self)
            .map_or("", |(_, name)| name)
    }

    /// The value a stored name stands for.
    fn from_stored(name: &str) -> Result<Self, UnknownState> {
        Self::NAMES
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(value, _)| *value)
            .ok_or_else(|| UnknownState {
                what: Self::WHAT,
                value: name.to_owned(),
            })
    }
}

/// A stored name the code does not know (a newer schema, or damage).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?}")]
pub struct UnknownState {
    /// Which enum was being parsed.
    pub what: &'static str,
    /// The text found.
    pub value: String,
}

/// `Display` as the stored name.
pub(crate) fn display<T: StoredName>(value: T, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    f.write_str(value.stored())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        AgentStatus, LeaseEnd, LeaseState, ReleaseCause, RevocationCause, Role, TaskState,
    };

    fn round_trips<T: StoredName + fmt::Debug>() {
        for (value, name) in T::NAMES {
            assert_eq!(value.stored(), *name);
            assert_eq!(T::from_stored(name), Ok(*value));
        }
        let err = T::from_stored("bogus").unwrap_err();
        assert_eq!(err.what, T::WHAT);
    }

    #[test]
    fn every_stored_name_round_trips_and_an_unknown_one_is_refused() {
        round_trips::<TaskState>();
        round_trips::<LeaseState>();
        round_trips::<LeaseEnd>();
        round_trips::<RevocationCause>();
        round_trips::<ReleaseCause>();
        round_trips::<AgentStatus>();
        round_trips::<Role>();
    }
}
