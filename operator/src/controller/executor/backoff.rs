//! The executor's per-object retry state: a write that failed waits, longer each time, before
//! it is tried again, so that one object the API server refuses never hammers it.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, Instant};

/// The soonest the loop wakes for a retry that is already due (see [`Backoff::next_retry`]).
const RETRY_FLOOR: Duration = Duration::from_millis(100);

/// Per-object retry state for failed writes.
#[derive(Debug, Default)]
pub struct Backoff {
    failures: HashMap<String, (u32, Instant)>,
    jitter: RandomState,
    /// When the last run started: a retry due before it was offered to that run.
    offered_until: Option<Instant>,
}

impl Backoff {
    pub(super) fn ready(&self, id: &str, now: Instant) -> bool {
        self.failures.get(id).is_none_or(|(_, at)| now >= *at)
    }

    /// How long `id` waits after its `attempts`-th failure in a row: a base of 0.4 s doubling
    /// up to 51.2 s, less up to half of it as jitter (a hash of the id and attempt with this
    /// process's random seed), so that objects that failed together are not retried together.
    fn delay(&self, id: &str, attempts: u32) -> Duration {
        let base = Duration::from_millis(200)
            .saturating_mul(1 << attempts.min(8))
            .min(Duration::from_secs(60));
        let jitter_ms = self.jitter.hash_one((id, attempts)) % (base.as_millis() as u64 / 2 + 1);
        base / 2 + Duration::from_millis(jitter_ms)
    }

    pub(super) fn failed(&mut self, id: &str, now: Instant) {
        let attempts = self.failures.get(id).map_or(0, |(n, _)| *n) + 1;
        let at = now + self.delay(id, attempts);
        self.failures.insert(id.to_owned(), (attempts, at));
    }

    pub(super) fn succeeded(&mut self, id: &str) {
        self.failures.remove(id);
    }

    /// Forgets the objects whose retry was due at `started` (the start of a run that tried
    /// every object due) but that were not tried again: they are no longer wanted.
    pub(super) fn forget_due(&mut self, started: Instant) {
        self.failures.retain(|_, (_, at)| *at > started);
        self.offered_until = Some(started);
    }

    /// When the loop must wake for the next retry. A retry that came due while the last run
    /// went on (its write failed early in a long run) was offered to no run: it is due at once,
    /// but no sooner than [`RETRY_FLOOR`] from `now`, so that passes that run nothing (a
    /// follower's, one waiting for slices) poll slowly instead of spinning. A retry due before
    /// the last run started was offered to it, and is forgotten or backing off again.
    pub fn next_retry(&self, now: Instant) -> Option<Instant> {
        let offered = |at: Instant| self.offered_until.is_some_and(|until| at <= until);
        (self.failures.values())
            .map(|(_, at)| *at)
            .filter(|at| !offered(*at))
            .map(|at| at.max(now + RETRY_FLOOR))
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_object_waits_longer_each_time_and_a_success_clears_it() {
        let mut backoff = Backoff::default();
        let t0 = Instant::now();
        assert!(backoff.ready("q", t0));
        backoff.failed("q", t0);
        // First failure: 0.4 s, half of it jitter: due between 0.2 s and 0.4 s.
        assert!(!backoff.ready("q", t0 + Duration::from_millis(199)));
        assert!(backoff.ready("q", t0 + Duration::from_millis(401)));
        assert!(backoff.ready("other", t0));
        for _ in 0..20 {
            backoff.failed("q", t0);
        }
        // Capped: due between 25.6 s and 51.2 s.
        let due = backoff.next_retry(t0).unwrap() - t0;
        assert!(
            due >= Duration::from_millis(25_600) && due <= Duration::from_millis(51_200),
            "{due:?}"
        );
        backoff.succeeded("q");
        assert!(backoff.ready("q", t0));
        assert_eq!(backoff.next_retry(t0), None);
    }

    #[test]
    fn a_retry_that_was_due_but_not_tried_is_forgotten() {
        let mut backoff = Backoff::default();
        let t0 = Instant::now();
        backoff.failed("gone", t0);
        backoff.failed("failing", t0 + Duration::from_secs(1));
        let later = t0 + Duration::from_secs(1);
        backoff.forget_due(later);
        assert!(
            !backoff.ready("failing", later),
            "tried in that run, still backing off"
        );
        assert!(backoff.ready("gone", later));
        assert_eq!(backoff.failures.len(), 1);
    }

    #[test]
    fn a_retry_that_came_due_during_a_run_wakes_the_loop_and_one_offered_does_not() {
        let mut backoff = Backoff::default();
        let started = Instant::now();
        // A write refused early in a run that went on for a second: due before the run ended,
        // offered to no run.
        backoff.failed("quota", started);
        backoff.forget_due(started);
        let ended = started + Duration::from_secs(1);
        assert_eq!(backoff.next_retry(ended), Some(ended + RETRY_FLOOR));
        // The next run was offered it (and retried it, or it is no longer wanted).
        backoff.forget_due(ended);
        assert_eq!(backoff.next_retry(ended), None);
    }
}
