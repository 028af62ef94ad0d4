//! The waits before a task is offered again: after a busy release (a
//! jittered doubling), and after a failed attempt (the task's
//! [`RetryPolicy`], or the default from the store's base); both jittered by
//! the task and the count, so tasks failing together do not retry together.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The first backoff after a busy release.
pub const RELEASE_BACKOFF_BASE_MS: i64 = 250;

/// The longest backoff after a busy release.
pub const MAX_RELEASE_BACKOFF_MS: i64 = 30_000;

/// The delay before a task released busy for the `releases`-th time is
/// offered again: [`RELEASE_BACKOFF_BASE_MS`] doubling per release up to
/// [`MAX_RELEASE_BACKOFF_MS`], times a jitter between one half and one that
/// `seed` (the task) decides, so that tasks released together do not come
/// back together.
pub fn release_backoff_ms(releases: u32, seed: Uuid) -> i64 {
    let doublings = releases.saturating_sub(1).min(20);
    let full = RELEASE_BACKOFF_BASE_MS
        .saturating_mul(1_i64 << doublings)
        .min(MAX_RELEASE_BACKOFF_MS);
    full / 2 + full * jitter_permille(seed, releases) / 2_000
}

/// A spread of 0..1000 that `seed` (a task) and the `n`-th try decide, for
/// jittering its delay: tasks delayed together do not come back together.
fn jitter_permille(seed: Uuid, n: u32) -> i64 {
    let mix = seed.as_u128() ^ u128::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    i64::try_from((mix % 1_000) as u64).unwrap_or(0)
}

/// The first retry delay unless a store is configured otherwise.
pub const DEFAULT_BACKOFF_BASE_MS: i64 = 1_000;

/// The longest retry delay.
pub const MAX_BACKOFF_MS: i64 = 5 * 60 * 1_000;

/// The default growth of the retry delay per failed attempt.
pub const DEFAULT_RETRY_MULTIPLIER: f64 = 2.0;

/// The default jitter of the retry delay: each delay is shortened by up to this fraction of
/// itself.
pub const DEFAULT_RETRY_JITTER: f64 = 0.2;

/// The largest growth of the retry delay per attempt a task may ask for.
pub const MAX_RETRY_MULTIPLIER: f64 = 10.0;

/// How a task's failed attempts back off: `initial_backoff_ms` after the first failure, times
/// `multiplier` for each further one, at most `max_backoff_ms`; each delay is then shortened by
/// up to `jitter` of itself (a fraction from 0 to 1), by an amount the task and the attempt
/// decide, so that tasks failing together do not come back together. A task without one backs
/// off by [`RetryPolicy::default_from`] the store's base.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// The delay after the first failed attempt.
    pub initial_backoff_ms: i64,
    /// The longest delay.
    pub max_backoff_ms: i64,
    /// The growth per failed attempt, from 1 to [`MAX_RETRY_MULTIPLIER`].
    pub multiplier: f64,
    /// How much of each delay may be taken off, from 0 to 1.
    pub jitter: f64,
}

impl RetryPolicy {
    /// The policy of a task that names none: `base_ms` doubling per attempt up to
    /// [`MAX_BACKOFF_MS`] (or `base_ms`, if longer), with [`DEFAULT_RETRY_JITTER`].
    pub fn default_from(base_ms: i64) -> RetryPolicy {
        RetryPolicy {
            initial_backoff_ms: base_ms,
            max_backoff_ms: MAX_BACKOFF_MS.max(base_ms),
            multiplier: DEFAULT_RETRY_MULTIPLIER,
            jitter: DEFAULT_RETRY_JITTER,
        }
    }

    /// The delay before retrying `task` after `attempts` failed attempts.
    pub fn delay_ms(&self, attempts: u32, task: Uuid) -> i64 {
        let growths = i32::try_from(attempts.saturating_sub(1)).unwrap_or(i32::MAX);
        let max = self.max_backoff_ms.max(0) as f64;
        let full = (self.initial_backoff_ms.max(0) as f64 * self.multiplier.max(1.0).powi(growths))
            .min(max);
        let fraction = jitter_permille(task, attempts) as f64 / 1_000.0;
        let delay = full * (1.0 - self.jitter.clamp(0.0, 1.0) * fraction);
        // Within 0..=max, so the cast cannot overflow.
        delay.round() as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_backoff_doubles_caps_and_jitters_between_half_and_whole() {
        let a = Uuid::from_u128(1);
        let b = Uuid::from_u128(2);
        for n in 1..30 {
            let full = (RELEASE_BACKOFF_BASE_MS << (n - 1).min(20)).min(MAX_RELEASE_BACKOFF_MS);
            for seed in [a, b] {
                let d = release_backoff_ms(n, seed);
                assert!(d >= full / 2 && d <= full, "{n}: {d} of {full}");
            }
        }
        assert_ne!(release_backoff_ms(3, a), release_backoff_ms(3, b));
    }

    #[test]
    fn retry_backoff_grows_caps_and_jitters_within_the_policy() {
        let task = Uuid::from_u128(7);
        let exact = RetryPolicy {
            jitter: 0.0,
            ..RetryPolicy::default_from(1_000)
        };
        assert_eq!(exact.delay_ms(1, task), 1_000);
        assert_eq!(exact.delay_ms(2, task), 2_000);
        assert_eq!(exact.delay_ms(4, task), 8_000);
        assert_eq!(exact.delay_ms(40, task), MAX_BACKOFF_MS);
        assert_eq!(exact.delay_ms(u32::MAX, task), MAX_BACKOFF_MS);
        let tripling = RetryPolicy {
            initial_backoff_ms: 500,
            max_backoff_ms: 10_000,
            multiplier: 3.0,
            jitter: 0.0,
        };
        let delays: Vec<i64> = (1..=5).map(|n| tripling.delay_ms(n, task)).collect();
        assert_eq!(delays, [500, 1_500, 4_500, 10_000, 10_000]);
        let jittered = RetryPolicy::default_from(1_000);
        let mut differ = false;
        for n in 1..30 {
            let full = exact.delay_ms(n, task);
            for seed in [task, Uuid::from_u128(8)] {
                let d = jittered.delay_ms(n, seed);
                assert!(d <= full && d >= full * 4 / 5, "{n}: {d} of {full}");
            }
            differ |= jittered.delay_ms(n, task) != jittered.delay_ms(n, Uuid::from_u128(8));
        }
        assert!(differ, "the jitter depends on the task");
    }
}
