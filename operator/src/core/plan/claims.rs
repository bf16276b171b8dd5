//! The claims the kept planner counts usage from, by namespace, kept up to date claim by claim:
//! a claim's event touches its namespace only.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::inventory::PoolKey;
use super::usage::ClaimView;
use crate::core::state::Delta;

/// Every claim, by namespace and name (as the API server tells claims apart), shared with the
/// watch cache; and the devices allocated in each pool, kept claim by claim, so that what is
/// computed per pool from them (the fits of shared counters) is computed again for the pools a
/// claim changed only.
#[derive(Debug, Default)]
pub struct Claims {
    by_namespace: HashMap<Arc<str>, BTreeMap<Arc<str>, Arc<ClaimView>>>,
    by_pool: BTreeMap<PoolKey, PoolAllocations>,
    /// Counts the changes of any pool's allocations.
    version: u64,
}

/// The devices allocated in one pool (admin access left out: it takes nothing from anyone), with
/// how many results name each (a device many claims share has several).
#[derive(Debug, Default)]
pub struct PoolAllocations {
    pub devices: BTreeMap<Arc<str>, u32>,
    /// Counts the changes of `devices`, from the claims' count of every change.
    pub version: u64,
}

impl Claims {
    /// Takes in `claims`; returns the namespaces whose claims changed (or may have).
    pub fn update(&mut self, claims: Delta<'_, ClaimView>) -> BTreeSet<Arc<str>> {
        let mut touched = BTreeSet::new();
        match claims {
            Delta::All(all) => {
                touched.extend(self.by_namespace.keys().cloned());
                self.by_namespace.clear();
                self.by_pool.clear();
                self.version += 1;
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

    /// The devices allocated in `pool`.
    pub fn allocated_in(&self, pool: &PoolKey) -> Option<&PoolAllocations> {
        self.by_pool.get(pool)
    }

    /// The devices allocated in every pool that has any, in pool order.
    pub fn allocations(&self) -> &BTreeMap<PoolKey, PoolAllocations> {
        &self.by_pool
    }

    /// Changes whenever the devices allocated in some pool changed.
    pub fn allocation_version(&self) -> u64 {
        self.version
    }

    fn insert(&mut self, claim: &Arc<ClaimView>, touched: &mut BTreeSet<Arc<str>>) {
        let namespace = self
            .by_namespace
            .entry(claim.namespace.clone())
            .or_default();
        let replaced = namespace.insert(claim.name.clone(), claim.clone());
        touched.insert(claim.namespace.clone());
        if let Some(old) = replaced {
            if old.devices == claim.devices {
                return;
            }
            self.allocate(&old, false);
        }
        self.allocate(claim, true);
    }

    fn remove(&mut self, claim: &ClaimView, touched: &mut BTreeSet<Arc<str>>) {
        let Some(namespace) = self.by_namespace.get_mut(&claim.namespace) else {
            return;
        };
        let removed = namespace.remove(&claim.name);
        if namespace.is_empty() {
            self.by_namespace.remove(&claim.namespace);
        }
        if let Some(old) = removed {
            touched.insert(claim.namespace.clone());
            self.allocate(&old, false);
        }
    }

    /// Adds (`add`) or takes out what `claim` allocated from its pools' allocations.
    fn allocate(&mut self, claim: &ClaimView, add: bool) {
        let devices = claim.devices.iter().filter(|d| !d.admin_access);
        for d in devices {
            self.version += 1;
            let key = PoolKey {
                driver: d.id.driver.clone(),
                pool: d.id.pool.clone(),
            };
            let pool = self.by_pool.entry(key.clone()).or_default();
            pool.version = self.version;
            let count = pool.devices.entry(d.id.device.clone()).or_default();
            if add {
                *count += 1;
            } else {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    pool.devices.remove(&d.id.device);
                }
            }
            if pool.devices.is_empty() {
                self.by_pool.remove(&key);
            }
        }
    }
}
