//! Per-object retry state of the executor: a write that failed waits longer each time, with
//! jitter, and the run that failed or skipped it tells the loop when a pass must come for it.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, Instant};

/// How long after its retry was due a failure is forgotten if not tried again: twice the
/// longest backoff, for the batches queued meanwhile.
const FORGOTTEN_AFTER: Duration = Duration::from_secs(120);

/// Per-object retry state for failed writes.
#[derive(Debug, Default)]
pub struct Backoff {
    failures: HashMap<String, (u32, Instant)>,
    jitter: RandomState,
    /// The earliest retry of a write that the run under way failed or skipped.
    owed: Option<Instant>,
}

impl Backoff {
    /// Whether `id` may be tried at `now`; if not, its retry is owed a pass.
    pub(super) fn ready(&mut self, id: &str, now: Instant) -> bool {
        match self.failures.get(id) {
            Some((_, at)) if now < *at => {
                let at = *at;
                self.owe(at);
                false
            }
            _ => true,
        }
    }

    fn owe(&mut self, at: Instant) {
        self.owed = Some(self.owed.map_or(at, |owed| owed.min(at)));
    }

    /// When a pass must come for a retry, after a run: the earliest retry of what the run failed
    /// or skipped, even one due already (the batch planned meanwhile does not have it, and the
    /// next one must), else the next retry due after `now`.
    pub(super) fn next_pass(&mut self, now: Instant) -> Option<Instant> {
        [self.owed.take(), self.next_retry(now)]
            .into_iter()
            .flatten()
            .min()
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
        self.owe(at);
    }

    pub(super) fn succeeded(&mut self, id: &str) {
        self.failures.remove(id);
    }

    /// Forgets the objects whose retry was due long before `now` and that were not tried
    /// again: they are no longer wanted. Not those just due: a batch planned while an object's
    /// failed write was still on its way does not have it, and the next one will.
    pub(super) fn forget_stale(&mut self, now: Instant) {
        self.failures
            .retain(|_, (_, at)| *at + FORGOTTEN_AFTER > now);
    }

    /// When the next object is due for a retry, after `now`: waking for one due already, that
    /// no run owes, would make the loop spin.
    fn next_retry(&self, now: Instant) -> Option<Instant> {
        self.failures
            .values()
            .map(|(_, at)| *at)
            .filter(|at| *at > now)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

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
    fn a_run_owes_a_pass_to_what_it_failed_or_skipped_even_once_due() {
        let mut backoff = Backoff::default();
        let t0 = Instant::now();
        backoff.failed("failed", t0);
        let due = backoff.failures["failed"].1;
        // Long after, the run is over: the failed write is due, and still owed a pass.
        let later = t0 + Duration::from_secs(5);
        assert_eq!(backoff.next_pass(later), Some(due));
        // Once told, not again (a pass came for it).
        assert_eq!(backoff.next_pass(later), None);
        // A skipped write (still backing off) is owed its retry.
        backoff.failed("failed", later);
        backoff.owed = None;
        assert!(!backoff.ready("failed", later));
        assert_eq!(backoff.next_pass(later), Some(backoff.failures["failed"].1));
    }

    #[test]
    fn a_retry_due_long_ago_but_not_tried_is_forgotten_and_one_just_due_is_kept() {
        let mut backoff = Backoff::default();
        let t0 = Instant::now();
        backoff.failed("gone", t0);
        backoff.failed("due", t0 + Duration::from_secs(119));
        backoff.failed("failing", t0 + Duration::from_secs(121));
        let later = t0 + Duration::from_secs(121);
        // A retry due is not a reason to wake: waking for it would make the loop spin.
        assert!(backoff.next_retry(later).unwrap() > later);
        backoff.forget_stale(later);
        assert!(backoff.ready("gone", later));
        assert!(backoff.ready("due", later));
        assert!(!backoff.ready("failing", later), "still backing off");
        // "due" keeps its count: its next failure waits longer than a first one.
        let ids: BTreeSet<&str> = backoff.failures.keys().map(String::as_str).collect();
        assert_eq!(ids, BTreeSet::from(["due", "failing"]));
    }
}
