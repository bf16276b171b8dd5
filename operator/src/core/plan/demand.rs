//! Demand per namespace and class: what its claims use and what its Pods wait for, as the
//! shares, the budgets and the status read it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::cache::{Cache, fingerprint};
use super::types::clamp;
use super::usage::{ClassUsage, Usage};
use crate::core::fairshare::NamespaceUsage;
use crate::core::state::PendingDemand;

/// What each namespace uses of each class, and what its Pods wait for.
pub struct Demand<'a> {
    /// Each namespace's usage and the input it was counted from (equal inputs, equal usage),
    /// hashed: the shares look up every team namespace each pass, and the usage cache's ordered
    /// map costs a dozen string comparisons, far apart in memory, per lookup.
    usage: HashMap<&'a str, (&'a Usage, u64), rustc_hash::FxBuildHasher>,
    pending: BTreeMap<(&'a str, &'a str), u32>,
    /// A hash of `pending`: what every pool's shares read of the Pods that wait.
    pending_mark: u64,
    /// The devices of each waiting claim, per (namespace, class).
    claims: BTreeMap<(&'a str, &'a str), &'a [u32]>,
    /// Of those, the claims that exist (quota charges them), largest first.
    charged: BTreeMap<(&'a str, &'a str), &'a [u32]>,
    /// The classes of `charged`.
    charged_classes: BTreeSet<&'a str>,
    oldest: BTreeMap<(&'a str, &'a str), k8s_openapi::jiff::Timestamp>,
}

impl<'a> Demand<'a> {
    pub fn new(usage: &'a Cache<String, u64, Usage>, pending: &'a [PendingDemand]) -> Self {
        let mut waiting: BTreeMap<(&str, &str), u32> = BTreeMap::new();
        let mut oldest = BTreeMap::new();
        let mut claims = BTreeMap::new();
        let mut charged = BTreeMap::new();
        for p in pending {
            let key = (p.namespace.as_str(), p.device_class.as_str());
            *waiting.entry(key).or_default() += p.devices;
            if !p.claims.is_empty() {
                claims.insert(key, p.claims.as_slice());
            }
            if !p.charged.is_empty() {
                charged.insert(key, p.charged.as_slice());
            }
            if let Some(t) = p.oldest {
                oldest
                    .entry(key)
                    .and_modify(|o| *o = t.min(*o))
                    .or_insert(t);
            }
        }
        Self {
            usage: (usage.entries())
                .map(|(ns, input, u)| (ns.as_str(), (u, *input)))
                .collect(),
            pending_mark: fingerprint(&waiting),
            pending: waiting,
            claims,
            charged_classes: charged.keys().map(|(_, class)| *class).collect(),
            charged,
            oldest,
        }
    }

    /// The devices of each claim `namespaces`' Pods wait for in `class`, largest first.
    pub fn waiting_claims(&self, namespaces: &[String], class: &str) -> Vec<u32> {
        let mut out: Vec<u32> = (namespaces.iter())
            .filter_map(|ns| self.claims.get(&(ns.as_str(), class)))
            .flat_map(|c| c.iter().copied())
            .collect();
        out.sort_unstable_by(|a, b| b.cmp(a));
        out
    }

    /// When the longest-waiting Pod of `namespaces` for `class` was created.
    pub fn oldest_pending(
        &self,
        namespaces: &[String],
        class: &str,
    ) -> Option<k8s_openapi::jiff::Timestamp> {
        (namespaces.iter())
            .filter_map(|ns| self.oldest.get(&(ns.as_str(), class)).copied())
            .min()
    }

    /// What `namespace`'s claims use of `class`.
    pub fn usage(&self, namespace: &str, class: &str) -> ClassUsage {
        (self.usage.get(namespace))
            .map(|(u, _)| u.of_class(class))
            .unwrap_or_default()
    }

    /// A hash of what `namespaces` use and wait for, of every class: equal marks, equal
    /// [`Demand::of`] for each of them and any class.
    pub fn mark(&self, namespaces: &[String]) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::hash::DefaultHasher::new();
        self.pending_mark.hash(&mut hasher);
        for ns in namespaces {
            let input = self.usage.get(ns.as_str()).map(|(_, input)| *input);
            (ns, input).hash(&mut hasher);
        }
        hasher.finish()
    }

    /// Whether a claim of `class` exists and waits for a node, in any namespace.
    pub fn charged_waiting(&self, class: &str) -> bool {
        self.charged_classes.contains(class)
    }

    /// `namespace`'s use of `class`, as the fair-share engine reads it; its waiting claims larger
    /// than `most_free` (the most free devices of one node, `None`: not known) fit no node.
    pub(super) fn of(
        &self,
        namespace: &str,
        class: &str,
        most_free: Option<u32>,
    ) -> NamespaceUsage {
        let usage = self.usage(namespace, class);
        let charged = self
            .charged
            .get(&(namespace, class))
            .copied()
            .unwrap_or(&[]);
        let unplaceable = most_free.map_or(0, |most| {
            (charged.iter().copied())
                .filter(|&size| size > most)
                .fold(0u32, u32::saturating_add)
        });
        NamespaceUsage {
            namespace: namespace.to_owned(),
            requested: clamp(usage.requested),
            allocated: clamp(usage.allocated),
            pending: self.pending.get(&(namespace, class)).copied().unwrap_or(0),
            unplaceable,
        }
    }
}
