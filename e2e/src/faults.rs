//! Fault injection and request counters.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

/// Faults to inject, per stand-in. All rates are probabilities in [0, 1] per request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Faults {
    /// Rate of `500 InternalError` answers (any verb; a watch fails before its stream starts).
    pub rate_500: f64,
    /// Rate of `429 TooManyRequests` answers (any verb; a watch fails before its stream starts).
    pub rate_429: f64,
    /// `Retry-After` seconds of injected 500/429 answers.
    pub retry_after_secs: u64,
    /// Rate of `409 Conflict` answers to writes (create, update, patch, delete).
    pub rate_conflict: f64,
    /// Close every watch stream this long after it starts.
    pub watch_close_after: Option<Duration>,
    /// Rate at which a watch that resumes from a resourceVersion gets `410 Gone` (an ERROR event
    /// with `Expired`, like a compacted API server).
    pub rate_watch_gone: f64,
    /// Added to every request (before it is served).
    pub latency: Duration,
    /// Only inject into requests for these resources (plural, e.g. "resourceclaims"); empty = all.
    pub only_resources: Vec<String>,
}

/// What an injected fault does to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Injected {
    /// 500.
    InternalError,
    /// 429.
    TooManyRequests,
    /// 409.
    Conflict,
}

/// Faults plus a deterministic random source.
#[derive(Debug)]
pub struct FaultState {
    faults: Mutex<(Faults, u64)>,
}

impl Default for FaultState {
    fn default() -> Self {
        FaultState {
            faults: Mutex::new((Faults::default(), 0x9E37_79B9_7F4A_7C15)),
        }
    }
}

impl FaultState {
    /// Replaces the faults.
    pub fn set(&self, f: Faults) {
        self.faults.lock().unwrap_or_else(|e| e.into_inner()).0 = f;
    }

    /// The current faults.
    pub fn get(&self) -> Faults {
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .clone()
    }

    fn roll(&self, rate: f64) -> bool {
        if rate <= 0.0 {
            return false;
        }
        let mut g = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        let s = &mut g.1;
        *s ^= *s >> 12;
        *s ^= *s << 25;
        *s ^= *s >> 27;
        let x = s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11;
        (x as f64 / (1u64 << 53) as f64) < rate
    }

    fn applies(&self, f: &Faults, resource: &str) -> bool {
        f.only_resources.is_empty() || f.only_resources.iter().any(|r| r == resource)
    }

    /// The fault to inject into a non-watch request, if any.
    pub fn inject(&self, resource: &str, is_write: bool) -> Option<Injected> {
        let f = self.get();
        if !self.applies(&f, resource) {
            return None;
        }
        if self.roll(f.rate_500) {
            return Some(Injected::InternalError);
        }
        if self.roll(f.rate_429) {
            return Some(Injected::TooManyRequests);
        }
        if is_write && self.roll(f.rate_conflict) {
            return Some(Injected::Conflict);
        }
        None
    }

    /// Whether a watch resuming from a resourceVersion gets 410.
    pub fn watch_gone(&self, resource: &str) -> bool {
        let f = self.get();
        self.applies(&f, resource) && self.roll(f.rate_watch_gone)
    }
}

/// Requests by verb and resource: those the stand-in served, or those one client made
/// ([`crate::TestCluster::recorded_client`]).
#[derive(Debug, Default)]
pub struct Counters {
    counts: Mutex<BTreeMap<(String, String), u64>>,
    codes: Mutex<BTreeMap<u16, u64>>,
    errors: Mutex<Vec<String>>,
}

/// Error answers kept by [`Counters::errors`].
const KEPT_ERRORS: usize = 200;

/// Verbs that write.
pub const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

impl Counters {
    /// Counts one request. `resource` is `plural` or `plural.group` (e.g.
    /// `resourceclaims.resource.k8s.io`), with `/subresource` appended for subresources.
    pub fn record(&self, verb: &str, resource: &str) {
        *self
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((verb.to_string(), resource.to_string()))
            .or_default() += 1;
    }

    /// Requests with this verb and resource.
    pub fn get(&self, verb: &str, resource: &str) -> u64 {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(verb.to_string(), resource.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Write requests (create, update, patch, delete, deletecollection) for a resource (all
    /// subresources included), or for every resource with `None`.
    pub fn writes(&self, resource: Option<&str>) -> u64 {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|((v, r), _)| {
                WRITE_VERBS.contains(&v.as_str())
                    && resource.is_none_or(|want| r == want || r.starts_with(&format!("{want}/")))
            })
            .map(|(_, n)| n)
            .sum()
    }

    /// All counts.
    pub fn snapshot(&self) -> BTreeMap<(String, String), u64> {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Counts one answer by HTTP status; keeps the message of error answers.
    pub fn record_answer(&self, code: u16, what: impl FnOnce() -> String) {
        *self
            .codes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(code)
            .or_default() += 1;
        if code >= 400 {
            let mut errors = self.errors.lock().unwrap_or_else(|e| e.into_inner());
            if errors.len() == KEPT_ERRORS {
                errors.remove(0);
            }
            errors.push(what());
        }
    }

    /// Answers by HTTP status code (watch streams count as their initial 200).
    pub fn status_codes(&self) -> BTreeMap<u16, u64> {
        self.codes.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The last error answers (`<code> <METHOD> <path>: <message>`), oldest first.
    pub fn errors(&self) -> Vec<String> {
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Resets all counts.
    pub fn reset(&self) {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.codes.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}
