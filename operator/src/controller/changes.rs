//! Which watches changed since the reconciler last looked, and how a watch says so: the one
//! place both the watches (`observe`, `projected`) and the reconciler read, so that neither
//! imports the other.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio::sync::Notify;

use crate::core::diff::Kind;

/// One watch, for [`Changes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watch {
    SharingPolicies,
    Teams,
    Namespaces,
    DeviceClasses,
    Slices,
    Claims,
    PendingPods,
    Pods,
    /// teamgpu's two CustomResourceDefinitions, the owners of its admission objects.
    Crds,
    /// DeviceTaintRules, where the API server serves them.
    TaintRules,
    /// PodDisruptionBudgets, for reclaim.
    Budgets,
    Owned(Kind),
}

impl Watch {
    fn bit(self) -> u32 {
        1 << match self {
            Watch::SharingPolicies => 0,
            Watch::Teams => 1,
            Watch::Namespaces => 2,
            Watch::DeviceClasses => 3,
            Watch::Slices => 4,
            Watch::Claims => 5,
            Watch::PendingPods => 6,
            Watch::Pods => 7,
            Watch::Crds => 8,
            Watch::TaintRules => 9,
            Watch::Budgets => 10,
            Watch::Owned(kind) => 11 + kind as u32,
        }
    }
}

/// Which watches saw an event since the reconciler last looked, so that a pass reads again only
/// the caches that changed. A watch marks its bit after its cache took the event in, so a
/// cleared bit never hides a change the next read of the cache would miss.
#[derive(Debug)]
pub struct Changes(AtomicU32);

impl Default for Changes {
    /// Everything changed: the first pass reads every cache.
    fn default() -> Self {
        Changes(AtomicU32::new(u32::MAX))
    }
}

impl Changes {
    pub(super) fn mark(&self, watch: Watch) {
        self.0.fetch_or(watch.bit(), Ordering::Release);
    }

    /// As if every watch saw an event (a resync reads every cache again).
    pub fn mark_all(&self) {
        self.0.store(u32::MAX, Ordering::Release);
    }

    /// The watches changed since the last call.
    pub fn take(&self) -> Changed {
        Changed(self.0.swap(0, Ordering::Acquire))
    }
}

/// The watches that changed, from [`Changes::take`].
#[derive(Clone, Copy, Debug)]
pub struct Changed(u32);

impl Changed {
    pub fn contains(self, watch: Watch) -> bool {
        self.0 & watch.bit() != 0
    }
}

/// Where a watch reports its events: the reconciler's wake-up and the changed bits.
#[derive(Clone, Debug, Default)]
pub struct Wake {
    pub notify: Arc<Notify>,
    pub changes: Arc<Changes>,
}

impl Wake {
    /// `watch`'s cache took an event in, which starts a pass if it `wakes` (see
    /// [`super::projected::Projector::wakes`]; running Pods wake none, say).
    pub fn mark(&self, watch: Watch, wakes: bool) {
        self.changes.mark(watch);
        if wakes {
            self.notify.notify_one();
        }
    }
}
