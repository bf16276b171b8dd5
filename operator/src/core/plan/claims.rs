//! The claims the kept planner counts usage from, by namespace, kept up to date claim by claim:
//! a claim's event touches its namespace only.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::usage::ClaimView;
use crate::core::state::Delta;

/// Every claim, by namespace and name (as the API server tells claims apart), shared with the
/// watch cache.
#[derive(Debug, Default)]
pub struct Claims {
    by_namespace: HashMap<Arc<str>, BTreeMap<Arc<str>, Arc<ClaimView>>>,
}

impl Claims {
    /// Takes in `claims`; returns the namespaces whose claims changed (or may have).
    pub fn update(&mut self, claims: Delta<'_, ClaimView>) -> BTreeSet<Arc<str>> {
        let mut touched = BTreeSet::new();
        match claims {
            Delta::All(all) => {
                touched.extend(self.by_namespace.keys().cloned());
                self.by_namespace.clear();
                for claim in all {
                    self.insert(claim, &mut touched);
                }
            }
            Delta::Changed { upserted, removed } => {
                for claim in removed {
                    self.remove(claim, &mut touched);
                }
                for claim in upserted {
                    self.insert(claim, &mut touched);
                }
            }
        }
        touched
    }

    /// The claims of `namespace`, by name; `None` when it has none.
    pub fn of(&self, namespace: &str) -> Option<&BTreeMap<Arc<str>, Arc<ClaimView>>> {
        self.by_namespace.get(namespace)
    }

    /// Every claim, namespace by namespace.
    pub fn all(&self) -> impl Iterator<Item = &Arc<ClaimView>> {
        self.by_namespace.values().flat_map(BTreeMap::values)
    }

    fn insert(&mut self, claim: &Arc<ClaimView>, touched: &mut BTreeSet<Arc<str>>) {
        let namespace = self
            .by_namespace
            .entry(claim.namespace.clone())
            .or_default();
        namespace.insert(claim.name.clone(), claim.clone());
        touched.insert(claim.namespace.clone());
    }

    fn remove(&mut self, claim: &ClaimView, touched: &mut BTreeSet<Arc<str>>) {
        let Some(namespace) = self.by_namespace.get_mut(&claim.namespace) else {
            return;
        };
        if namespace.remove(&claim.name).is_some() {
            touched.insert(claim.namespace.clone());
        }
        if namespace.is_empty() {
            self.by_namespace.remove(&claim.namespace);
        }
    }
}
