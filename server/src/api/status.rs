//! The one error boundary: the crate's [`Error`] becomes a `tonic::Status`
//! here and nowhere else. Codes, by variant:
//!
//! | error | status |
//! |---|---|
//! | `Invalid` (a request field) | INVALID_ARGUMENT, with a `BadRequest` field violation |
//! | `NotFound` | NOT_FOUND |
//! | `StaleFencingToken`, `LeaseNotHeld`, `InvalidTransition`, `FailedPrecondition` | FAILED_PRECONDITION |
//! | `GenerationMismatch` | ABORTED |
//! | `Unauthenticated` | UNAUTHENTICATED |
//! | `PermissionDenied` | PERMISSION_DENIED |
//! | `ResourceExhausted` | RESOURCE_EXHAUSTED |
//! | `Overloaded` | RESOURCE_EXHAUSTED, with a `RetryInfo` detail (when to try again) |
//! | `Store`, `Unavailable` | UNAVAILABLE (a store failure says only what the server was doing) |
//! | `Corrupt` | INTERNAL (only what the server was reading) |
//! | `Batch` | whatever the error inside maps to |
//! | `Config`, `UnsupportedDatabaseUrl`, `Transport`, `Reflection` | INTERNAL (`internal error`) |
//!
//! The driver's error, file paths and the details of corrupt data stay in
//! the server's log.

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::error::Error;

impl From<Error> for Status {
    fn from(err: Error) -> Self {
        Status::from(&err)
    }
}

impl From<&Error> for Status {
    fn from(err: &Error) -> Self {
        match err {
            // Details stay in the server's log; clients learn only the kind.
            Error::Store { context, .. } => {
                Status::unavailable(format!("store unavailable while {context}"))
            }
            Error::Corrupt { context, .. } => {
                Status::internal(format!("stored data unreadable while {context}"))
            }
            Error::Invalid { field, reason } => Status::with_error_details(
                Code::InvalidArgument,
                format!("{field}: {reason}"),
                ErrorDetails::with_bad_request_violation(field.as_str(), reason.as_str()),
            ),
            Error::NotFound { .. } => Status::not_found(err.to_string()),
            Error::StaleFencingToken { .. }
            | Error::LeaseNotHeld { .. }
            | Error::InvalidTransition { .. }
            | Error::FailedPrecondition(_) => Status::failed_precondition(err.to_string()),
            Error::GenerationMismatch { .. } => Status::aborted(err.to_string()),
            Error::Unauthenticated(message) => Status::unauthenticated(message.as_str()),
            Error::PermissionDenied(message) => Status::permission_denied(message.as_str()),
            Error::ResourceExhausted(message) => Status::resource_exhausted(message.as_str()),
            Error::Overloaded { retry_after_ms, .. } => Status::with_error_details(
                Code::ResourceExhausted,
                err.to_string(),
                ErrorDetails::with_retry_info(Some(std::time::Duration::from_millis(
                    *retry_after_ms,
                ))),
            ),
            Error::Unavailable(message) => Status::unavailable(message.as_str()),
            Error::Batch(inner) => Status::from(inner.as_ref()),
            Error::UnsupportedDatabaseUrl(_)
            | Error::Config(_)
            | Error::Transport(_)
            | Error::Reflection(_) => Status::internal("internal error"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invalid_field_is_named_in_the_message_and_the_details() {
        let status = Status::from(Error::invalid("placement.selector", "unexpected `,`"));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "placement.selector: unexpected `,`");
        let details = status.get_error_details();
        let violations = details.bad_request().map(|b| b.field_violations.clone());
        assert_eq!(
            violations.map(|v| v[0].field.clone()),
            Some("placement.selector".into())
        );
    }

    #[test]
    fn store_internals_stay_out_of_the_message() {
        let err = Error::Store {
            context: "granting leases",
            source: sqlx::Error::Protocol("password authentication failed".into()),
        };
        let status = Status::from(Error::Batch(std::sync::Arc::new(err)));
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.message(), "store unavailable while granting leases");
    }
}
