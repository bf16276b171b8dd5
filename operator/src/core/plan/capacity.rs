//! Phase 2, capacity: which devices each policy's class expressions match, pool by pool (a changed
//! pool is matched again, the others are not); which matching devices are allocated outside teams;
//! and which DeviceClasses not teamgpu's can select governed devices.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

use k8s_openapi::api::resource::v1::DeviceClass;

use super::cache::Cache;
use super::identity::{identity, name_of};
use super::inventory::{self, DeviceId, Inventory, MatchReport, PoolKey};
use super::objects::is_teamgpu_class;
use super::policies::CompiledPolicy;
use super::usage::Usage;
use crate::dra_cel::CompiledExpressions;

/// Device matching kept between plans: per pool, for the pool's fingerprint and the
/// expressions' identity; all pools together, for the inventory's version and the expressions.
#[derive(Debug)]
pub struct Matching {
    /// Per pool, its report and, for a pool with counters, what its groups' devices match.
    pools: Cache<PoolKey, (u64, u64), (PoolMatch, Option<inventory::GroupMatches>)>,
    total: Cache<(), (u64, u64), MatchReport>,
}

/// One pool's [`MatchReport`] as the cache keeps it. Most pools only count devices for a name
/// or two: those counts are kept by the name's place among the expression sets (which the
/// expressions' identity in the cache's input pins), not as a map of names; 5,000 pools of
/// one-name maps were 3 MiB. A pool with overlaps or evaluation errors keeps its whole report.
#[derive(Debug)]
enum PoolMatch {
    Counts(Box<[(u32, u32)]>),
    Whole(Box<MatchReport>),
}

impl PoolMatch {
    fn new(report: MatchReport, names: &[&String]) -> Self {
        let only_counts = report.overlaps.is_empty()
            && report.overlap_pairs.is_empty()
            && report.errors.is_empty()
            && report.tainted.is_empty()
            && report.undeclared.is_empty();
        let place = |name: &String| {
            let place = names.iter().position(|n| *n == name)?;
            u32::try_from(place).ok()
        };
        let counts: Option<Box<[(u32, u32)]>> = only_counts
            .then(|| {
                report
                    .counts
                    .iter()
                    .map(|(name, n)| Some((place(name)?, *n)))
                    .collect()
            })
            .flatten();
        match counts {
            Some(counts) => PoolMatch::Counts(counts),
            None => PoolMatch::Whole(Box::new(report)),
        }
    }

    /// How many of the pool's devices set `name` (at `place` among the sets) matches.
    fn count(&self, name: &str, place: usize) -> u32 {
        match self {
            PoolMatch::Counts(counts) => (counts.iter())
                .find(|(p, _)| *p as usize == place)
                .map_or(0, |(_, n)| *n),
            PoolMatch::Whole(report) => report.counts.get(name).copied().unwrap_or(0),
        }
    }

    /// Adds this pool's counts to `total`, which names every set.
    fn add_to(&self, total: &mut MatchReport, names: &[&String]) {
        match self {
            PoolMatch::Counts(counts) => {
                for &(place, n) in counts.iter() {
                    if let Some(count) = names
                        .get(place as usize)
                        .and_then(|name| total.counts.get_mut(*name))
                    {
                        *count += n;
                    }
                }
            }
            PoolMatch::Whole(report) => total.merge(report),
        }
    }
}

impl Matching {
    pub fn new(keep: bool) -> Self {
        Self {
            pools: Cache::new(keep),
            total: Cache::new(keep),
        }
    }

    /// What `sets` (whose identity is `expressions`) match in `inventory`.
    pub fn update(
        &mut self,
        inventory: &Inventory,
        expressions: u64,
        sets: &BTreeMap<String, &CompiledExpressions>,
    ) -> &MatchReport {
        let pools = &mut self.pools;
        let names: Vec<&String> = sets.keys().collect();
        self.total.get((), (inventory.version(), expressions), |_| {
            for (key, pool) in inventory.pools() {
                pools.get(key.clone(), (pool.fingerprint(), expressions), |_| {
                    let (report, groups) = inventory::match_pool_and_groups(pool, sets);
                    (PoolMatch::new(report, &names), groups)
                });
            }
            pools.sweep();
            let mut total = MatchReport {
                counts: sets.keys().map(|k| (k.clone(), 0)).collect(),
                ..MatchReport::default()
            };
            for (_, (report, _)) in pools.values() {
                report.add_to(&mut total, &names);
            }
            total
        })
    }
}

/// What nothing matches: before the first [`Matching::update`].
static NOTHING: MatchReport = MatchReport {
    counts: BTreeMap::new(),
    overlaps: Vec::new(),
    overlap_pairs: BTreeMap::new(),
    errors: BTreeMap::new(),
    tainted: BTreeMap::new(),
    undeclared: BTreeMap::new(),
};

impl Matching {
    /// What the last [`Matching::update`] found.
    pub fn total(&self) -> &MatchReport {
        self.total.value(&()).unwrap_or(&NOTHING)
    }

    /// Per pool, how many counted devices the set `name` matched in the last
    /// [`Matching::update`] with `sets`; pools it matches none of are left out.
    pub fn pool_counts(
        &self,
        name: &str,
        sets: &BTreeMap<String, &CompiledExpressions>,
    ) -> Vec<(&PoolKey, u32)> {
        let Some(place) = sets.keys().position(|n| n == name) else {
            return Vec::new();
        };
        (self.pools.values())
            .map(|(pool, (found, _))| (pool, found.count(name, place)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

impl Matching {
    /// What the devices of `pool`'s counter groups match, as of the last [`Matching::update`].
    pub fn group_matches(&self, pool: &PoolKey) -> Option<&inventory::GroupMatches> {
        self.pools.value(pool)?.1.as_ref()
    }
}

impl Default for Matching {
    fn default() -> Self {
        Self::new(true)
    }
}

/// What `name`'s pool has for the teams: the devices it matches (those whose capacity is shared
/// as `shared` counts them) less those allocated through other classes, which no team's quota
/// counts (`outside`).
pub fn available(
    name: &str,
    matches: &MatchReport,
    shared: &super::shared_counters::SharedCounters,
    outside: &BTreeMap<String, BTreeMap<&DeviceId, &str>>,
) -> u32 {
    let matched = shared.capacity(name, matches.counts.get(name).copied().unwrap_or(0));
    let outside = outside
        .get(name)
        .map_or(0, |o| u32::try_from(o.len()).unwrap_or(u32::MAX));
    matched.saturating_sub(outside)
}

/// A warning per pool whose devices are not counted because not all its slices are published.
pub fn incomplete_pool_warnings(inventory: &Inventory) -> impl Iterator<Item = String> + '_ {
    inventory.incomplete_pools().map(|pool| {
        format!(
            "pool {} of driver {} is incomplete (not all of its ResourceSlices are published): its devices are not counted",
            pool.pool, pool.driver
        )
    })
}

/// Per sharing policy, the devices it matches that are allocated outside teams, each with the
/// claim holding it.
pub fn used_outside_teams<'u>(
    usage: impl IntoIterator<Item = &'u Usage>,
    inventory: &Inventory,
    sets: &BTreeMap<String, &CompiledExpressions>,
) -> BTreeMap<String, BTreeMap<&'u DeviceId, &'u str>> {
    let mut outside: BTreeMap<String, BTreeMap<&DeviceId, &str>> = BTreeMap::new();
    for allocation in usage.into_iter().flat_map(|u| &u.outside) {
        let key = PoolKey {
            driver: allocation.device.driver.clone(),
            pool: allocation.device.pool.clone(),
        };
        let Some(device) = inventory.pools().get(&key).and_then(|pool| {
            pool.counted()
                .find(|d| d.name() == &*allocation.device.device)
        }) else {
            continue;
        };
        // What an allocation takes of a device that many claims share is what it consumes,
        // which the policies' capacity already leaves out (`consumable::add_consumable`).
        if device.consumable().is_some() {
            continue;
        }
        for (name, set) in sets {
            if set.matches(device.env()).unwrap_or(false) {
                outside
                    .entry(name.clone())
                    .or_default()
                    .insert(&allocation.device, &allocation.claim);
            }
        }
    }
    outside
}

/// Per foreign DeviceClass: whether it selects devices a policy governs, for the identity of
/// the class, the inventory and the policies' expressions.
pub type Governed = Cache<String, u64, bool>;

/// The DeviceClasses not teamgpu's that can select devices teamgpu governs (with their
/// extended resource name): those that name a governed driver, or select a device some policy
/// matches. Evaluating a class against every device is costly: `governed` keeps its answer
/// until the class, the inventory or a policy's expressions change.
pub fn governed_foreign(
    governed: &mut Governed,
    classes: &[DeviceClass],
    policies: &[CompiledPolicy],
    inventory: &Inventory,
    (sets, expressions): (&BTreeMap<String, &CompiledExpressions>, u64),
) -> BTreeMap<String, Option<String>> {
    let drivers: BTreeSet<&str> = policies
        .iter()
        .map(|p| p.policy.spec.driver.as_str())
        .collect();
    let mut foreign = BTreeMap::new();
    for class in classes {
        let name = name_of(class);
        if is_teamgpu_class(&name) {
            continue;
        }
        let names_driver = class
            .spec
            .selectors
            .iter()
            .flatten()
            .filter_map(|s| s.cel.as_ref())
            .any(|cel| {
                drivers.iter().any(|d| {
                    cel.expression.contains(&format!("'{d}'"))
                        || cel.expression.contains(&format!("\"{d}\""))
                })
            });
        let mut selects_governed = || {
            let mut hasher = std::hash::DefaultHasher::new();
            identity(class, &mut hasher);
            (inventory.version(), expressions).hash(&mut hasher);
            *governed.get(name.clone(), hasher.finish(), |_| {
                inventory::compile_class(class).is_ok_and(|compiled| {
                    inventory.counted().any(|d| {
                        compiled.matches(d.env()).unwrap_or(false)
                            && sets.values().any(|p| p.matches(d.env()).unwrap_or(false))
                    })
                })
            })
        };
        if names_driver || selects_governed() {
            foreign.insert(name, class.spec.extended_resource_name.clone());
        }
    }
    governed.sweep();
    foreign
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::plan::inventory::EvaluationErrors;

    fn report(counts: &[(&str, u32)]) -> MatchReport {
        MatchReport {
            counts: counts.iter().map(|(n, c)| ((*n).to_owned(), *c)).collect(),
            ..MatchReport::default()
        }
    }

    #[test]
    fn pools_kept_by_place_add_up_to_the_same_counts_as_whole_reports() {
        let (a, b, c) = ("a".to_owned(), "b".to_owned(), "c".to_owned());
        let names = [&a, &b, &c];
        let mut errors = report(&[("a", 1)]);
        errors.errors.insert(
            "c".into(),
            EvaluationErrors {
                devices: 3,
                first: Vec::new(),
            },
        );
        let pools = [report(&[("b", 2)]), report(&[("a", 4), ("b", 1)]), errors];
        let kept: Vec<PoolMatch> = pools
            .iter()
            .map(|r| PoolMatch::new(r.clone(), &names))
            .collect();
        assert!(matches!(kept[0], PoolMatch::Counts(_)));
        assert!(matches!(kept[2], PoolMatch::Whole(_)), "errors are kept");
        let mut total = report(&[("a", 0), ("b", 0), ("c", 0)]);
        for pool in &kept {
            pool.add_to(&mut total, &names);
        }
        assert_eq!(total.counts, report(&[("a", 5), ("b", 3), ("c", 0)]).counts);
        assert_eq!(total.errors["c"].devices, 3);
    }
}
