//! The statuses teamgpu wrote whose watch event has not come back yet, and when each was
//! last written (a status whose numbers alone moved waits for [`super::status::STATUS_PACE`]).
//!
//! A pass that follows a status write closely (the write's own watch events wake it) may
//! still find the status from before the write in the cache, and would write the same status
//! again. On the real control plane at 1,000 namespaces that was 9 of the 15 statuses a claim
//! changes, written twice, and a second pass holding up the next event. So a status written
//! over version `v` of its policy is not written again while the cache still holds `v` and
//! the status wanted is the one written. Any other version (the write's own, or somebody
//! else's) is compared as usual.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::time::Instant;

use serde_json::Value;

use super::PolicyKind;
use super::status::STATUS_PACE;

/// See the module doc.
#[derive(Debug, Default)]
pub struct WrittenStatuses {
    /// Handed out, not settled yet.
    handed: HashMap<(PolicyKind, String), Written>,
    /// Written. A record holds while the cache has the version it was written over; a later
    /// version never matches it again, and the next write of the policy replaces it.
    written: HashMap<(PolicyKind, String), Written>,
    /// When each status written within the pace was handed out.
    last_written: HashMap<(PolicyKind, String), Instant>,
    /// The pass's time (that of every status handed out), and when the first status it held
    /// back may be written.
    now: Option<Instant>,
    held_until: Option<Instant>,
}

#[derive(Debug, Clone, PartialEq)]
struct Written {
    /// The policy's resourceVersion the status was planned against.
    over: Option<String>,
    /// [`content`] of what was written.
    content: u64,
}

/// What a status says, for telling a change: without its conditions' transition times (a
/// condition that changed gets a new time in every pass that still sees the old status).
fn content(status: &Value) -> u64 {
    let mut status = status.clone();
    for condition in status["conditions"].as_array_mut().into_iter().flatten() {
        if let Value::Object(fields) = condition {
            fields.remove("lastTransitionTime");
        }
    }
    BuildHasherDefault::<DefaultHasher>::default().hash_one(status.to_string())
}

impl WrittenStatuses {
    /// Starts a pass at `now`: what was held back is weighed again.
    pub fn start_pass(&mut self, now: Instant) {
        self.now = Some(now);
        self.held_until = None;
        self.last_written.retain(|_, at| now < *at + STATUS_PACE);
    }

    /// Whether a status of the policy that is not urgent waits: it was written less than the
    /// pace before this pass. Then the pass that may write it is [`WrittenStatuses::next_wake`].
    pub fn paced(&mut self, kind: PolicyKind, name: &str) -> bool {
        let (Some(now), Some(at)) = (self.now, self.last_written.get(&(kind, name.to_owned())))
        else {
            return false;
        };
        let due = *at + STATUS_PACE;
        if now >= due {
            return false;
        }
        self.held_until = Some(self.held_until.map_or(due, |h| h.min(due)));
        true
    }

    /// When a status held back this pass may be written.
    pub fn next_wake(&self) -> Option<Instant> {
        self.held_until
    }

    /// Whether `status`, planned for the policy at `version`, is to be written: not when it
    /// was written over that same version already. Records it as handed out if so.
    pub fn to_write(
        &mut self,
        kind: PolicyKind,
        name: &str,
        version: Option<&str>,
        status: &Value,
    ) -> bool {
        let key = (kind, name.to_owned());
        let planned = Written {
            over: version.map(str::to_owned),
            content: content(status),
        };
        if self.written.get(&key) == Some(&planned) {
            return false;
        }
        self.handed.insert(key, planned);
        true
    }

    /// The statuses handed out were performed; `succeeded` are those the server took. A
    /// failed one is compared as usual in the next pass.
    pub fn settle(&mut self, succeeded: &[(PolicyKind, String)]) {
        for key in succeeded {
            if let Some(written) = self.handed.remove(key) {
                if let Some(at) = self.now {
                    self.last_written.insert(key.clone(), at);
                }
                self.written.insert(key.clone(), written);
            }
        }
        self.handed.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const TEAM: PolicyKind = PolicyKind::TeamGpuPolicy;

    fn status(entitlement: u32, at: &str) -> Value {
        json!({"totals": {"entitlement": entitlement},
               "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": at}]})
    }

    #[test]
    fn a_status_written_is_not_written_again_while_the_cache_is_behind() {
        let mut written = WrittenStatuses::default();
        assert!(written.to_write(TEAM, "ml", Some("7"), &status(4, "t1")));
        written.settle(&[(TEAM, "ml".into())]);
        // The next pass: the cache still holds version 7, with the status before the write;
        // the same status is wanted (a condition's time aside).
        assert!(!written.to_write(TEAM, "ml", Some("7"), &status(4, "t2")));
        // Something else changed meanwhile: that is written.
        assert!(written.to_write(TEAM, "ml", Some("7"), &status(5, "t2")));
    }

    #[test]
    fn another_version_in_the_cache_ends_the_record() {
        let mut written = WrittenStatuses::default();
        assert!(written.to_write(TEAM, "ml", Some("7"), &status(4, "t1")));
        written.settle(&[(TEAM, "ml".into())]);
        // The write came back as version 8, and then somebody reverted the status at version 8: compared as usual, written again.
        assert!(written.to_write(TEAM, "ml", Some("8"), &status(4, "t1")));
    }

    #[test]
    fn a_failed_write_is_not_taken_for_written() {
        let mut written = WrittenStatuses::default();
        assert!(written.to_write(TEAM, "ml", Some("7"), &status(4, "t1")));
        written.settle(&[]);
        assert!(written.to_write(TEAM, "ml", Some("7"), &status(4, "t1")));
    }
}
