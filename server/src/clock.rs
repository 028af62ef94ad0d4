//! The injected clock: lease, heartbeat and expiry logic read time only
//! through a [`Clock`], so tests can move time instead of sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// Milliseconds since the Unix epoch, from the system or from a test.
#[derive(Clone)]
pub struct Clock(Arc<dyn Fn() -> i64 + Send + Sync>);

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Clock").field(&self.now_ms()).finish()
    }
}

impl Clock {
    /// The system clock.
    pub fn system() -> Self {
        Self(Arc::new(|| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            i64::try_from(now.as_millis()).unwrap_or(i64::MAX)
        }))
    }

    /// A clock a test moves by hand; starts at `start_ms`.
    pub fn manual(start_ms: i64) -> (Self, ManualClock) {
        let cell = Arc::new(AtomicI64::new(start_ms));
        let read = cell.clone();
        (
            Self(Arc::new(move || read.load(Ordering::SeqCst))),
            ManualClock(cell),
        )
    }

    /// Now, in milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        (self.0)()
    }
}

/// The handle that moves a [`Clock::manual`] clock.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// Moves time forward by `ms`.
    pub fn advance(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}
