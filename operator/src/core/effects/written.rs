//! The statuses teamgpu wrote whose watch event has not come back yet.
//!
//! A pass that follows a status write closely (the write's own watch events wake it) may
//! still find the status from before the write in the cache, and would write the same status
//! again. On the real control plane at 1,000 namespaces that was 9 of the 15 statuses a claim
//! changes, written twice, and a second pass holding up the next event. So a status written
//! over version `v` of its policy is not written again while the cache still holds `v` and
//! the status wanted is the one written. Any other version (the write's own, or somebody
//! else's) is compared as usual.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};

use serde_json::Value;

use super::PolicyKind;

/// How many statuses of one policy, each of other content, may be on their way at once (the
/// executor's batches overlap passes). Beyond that the oldest is forgotten: its write, if it
/// succeeds, is then compared as usual, at worst written once more.
const ON_THE_WAY: usize = 4;

/// See the module doc.
#[derive(Debug, Default)]
pub struct WrittenStatuses {
    /// Handed out and not answered yet, oldest first, per policy.
    handed: HashMap<(PolicyKind, String), VecDeque<Written>>,
    /// Written. A record holds while the cache has the version it was written over; a later
    /// version never matches it again, and the next write of the policy replaces it.
    written: HashMap<(PolicyKind, String), Written>,
}

#[derive(Debug, Clone, PartialEq)]
struct Written {
    /// The policy's resourceVersion the status was planned against.
    over: Option<String>,
    /// [`content`] of what was written.
    content: u64,
}

/// A status the API server took, as the executor reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenStatus {
    pub kind: PolicyKind,
    pub name: String,
    content: u64,
}

impl WrittenStatus {
    pub fn of(kind: PolicyKind, name: &str, status: &Value) -> Self {
        Self {
            kind,
            name: name.to_owned(),
            content: content(status),
        }
    }
}

/// What a status says, for telling a change: without its conditions' transition times (a
/// condition that changed gets a new time in every pass that still sees the old status).
pub fn content(status: &Value) -> u64 {
    let mut status = status.clone();
    for condition in status["conditions"].as_array_mut().into_iter().flatten() {
        if let Value::Object(fields) = condition {
            fields.remove("lastTransitionTime");
        }
    }
    BuildHasherDefault::<DefaultHasher>::default().hash_one(status.to_string())
}

impl WrittenStatuses {
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
        let handed = self.handed.entry(key).or_default();
        if handed.back() != Some(&planned) {
            if handed.len() == ON_THE_WAY {
                handed.pop_front();
            }
            handed.push_back(planned);
        }
        true
    }

    /// The API server took the statuses `written`. One answered supersedes the ones of its
    /// policy handed out before it.
    pub fn settle(&mut self, written: &[WrittenStatus]) {
        for w in written {
            let key = (w.kind, w.name.clone());
            let Some(handed) = self.handed.get_mut(&key) else {
                continue;
            };
            if let Some(at) = handed.iter().rposition(|h| h.content == w.content) {
                let record = handed.drain(..=at).next_back();
                if handed.is_empty() {
                    self.handed.remove(&key);
                }
                if let Some(record) = record {
                    self.written.insert(key, record);
                }
            }
        }
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
        written.settle(&[WrittenStatus::of(TEAM, "ml", &status(4, "t1"))]);
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
        written.settle(&[WrittenStatus::of(TEAM, "ml", &status(4, "t1"))]);
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

    #[test]
    fn only_the_status_the_server_took_counts_as_written() {
        let mut written = WrittenStatuses::default();
        // Two passes before the first batch is answered: 4, then 5 devices.
        assert!(written.to_write(TEAM, "ml", Some("7"), &status(4, "t1")));
        assert!(written.to_write(TEAM, "ml", Some("7"), &status(5, "t2")));
        written.settle(&[WrittenStatus::of(TEAM, "ml", &status(4, "t1"))]);
        // The second failed: it is written again, though the cache still holds version 7.
        written.settle(&[]);
        assert!(written.to_write(TEAM, "ml", Some("7"), &status(5, "t3")));
        assert!(!written.to_write(TEAM, "ml", Some("7"), &status(4, "t3")));
    }
}
