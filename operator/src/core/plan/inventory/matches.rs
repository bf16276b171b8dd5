//! What the class expressions of the policies match in the inventory, pool by pool
//! ([`match_pool`]): counted devices per expression set, overlaps, evaluation errors, and the
//! matching devices a taint keeps from claims.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::{DeviceId, Pool};
use crate::dra_cel::{CompiledExpressions, ExpressionError};

/// Errors of one expression set, in device order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EvaluationErrors {
    pub devices: u32,
    /// The first few failures.
    pub first: Vec<(DeviceId, ExpressionError)>,
}

const ERRORS_KEPT: usize = 5;

/// How many counted devices each named expression set matches.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MatchReport {
    /// Every name, with 0 when nothing matches.
    pub counts: BTreeMap<String, u32>,
    /// Devices matched by two or more names.
    pub overlaps: Vec<(DeviceId, Vec<String>)>,
    /// Number of shared devices per pair of names (first < second).
    pub overlap_pairs: BTreeMap<(String, String), u32>,
    pub errors: BTreeMap<String, EvaluationErrors>,
    /// Per name, the matching devices of usable pools that a taint keeps from claims.
    pub tainted: BTreeMap<String, Tainted>,
    /// Per name, the matching devices of usable pools that draw on a counter set (or counter)
    /// their pool does not publish, which the allocator cannot allocate; the "keys" are the
    /// first few devices with why.
    pub undeclared: BTreeMap<String, Tainted>,
}

/// Matching devices a taint keeps from claims (NoSchedule or NoExecute, as drivers mark
/// unhealthy devices: KEP-5055), and the first few taint keys.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tainted {
    pub devices: u32,
    pub keys: BTreeSet<String>,
}

impl Tainted {
    fn add(&mut self, devices: u32, keys: impl IntoIterator<Item = String>) {
        self.devices += devices;
        for key in keys {
            if self.keys.len() < ERRORS_KEPT {
                self.keys.insert(key);
            }
        }
    }
}

impl MatchReport {
    /// Adds the report of the devices that follow this report's, as if matched in one pass.
    pub fn merge(&mut self, next: &MatchReport) {
        for (name, n) in &next.counts {
            match self.counts.get_mut(name) {
                Some(count) => *count += n,
                None => {
                    self.counts.insert(name.clone(), *n);
                }
            }
        }
        self.overlaps.extend(next.overlaps.iter().cloned());
        for (pair, n) in &next.overlap_pairs {
            *self.overlap_pairs.entry(pair.clone()).or_default() += n;
        }
        for (name, tainted) in &next.tainted {
            let mine = self.tainted.entry(name.clone()).or_default();
            mine.add(tainted.devices, tainted.keys.iter().cloned());
        }
        for (name, undeclared) in &next.undeclared {
            let mine = self.undeclared.entry(name.clone()).or_default();
            mine.add(undeclared.devices, undeclared.keys.iter().cloned());
        }
        for (name, errors) in &next.errors {
            let mine = self.errors.entry(name.clone()).or_default();
            mine.devices += errors.devices;
            let room = ERRORS_KEPT.saturating_sub(mine.first.len());
            mine.first.extend(errors.first.iter().take(room).cloned());
        }
    }
}

/// One pool's devices against every named expression set. Only the names that match a device are
/// counted: a pool's report is kept per pool, and 5,000 pools of 20 mostly-zero counts would be
/// megabytes ([`Inventory::match_sets`] and [`MatchReport::merge`] give every name).
pub fn match_pool<S: Borrow<CompiledExpressions>>(
    pool: &Pool,
    sets: &BTreeMap<String, S>,
) -> MatchReport {
    match_pool_and_groups(pool, sets).0
}

/// Per counter group of a pool, per device of the group (in the group's order), the places of
/// the expression sets that match it (counted devices only: a tainted device still draws on the
/// counters when allocated, but no claim gets it anew).
pub type GroupMatches = Box<[Box<[Arc<[u16]>]>]>;

/// [`match_pool`], and for a pool with counters, what its groups' devices match.
pub fn match_pool_and_groups<S: Borrow<CompiledExpressions>>(
    pool: &Pool,
    sets: &BTreeMap<String, S>,
) -> (MatchReport, Option<GroupMatches>) {
    let mut report = MatchReport::default();
    report_uncounted(pool, sets, &mut report);
    // Devices of one model share their CEL input (a node's 8 GPUs): evaluated once per input.
    let mut by_env: HashMap<*const crate::dra_cel::DeviceEnv, Vec<_>> = HashMap::new();
    for device in pool.counted() {
        let env = device.env();
        let results = by_env.entry(std::ptr::from_ref(env)).or_insert_with(|| {
            (sets.values())
                .map(|set| set.borrow().matches(env))
                .collect()
        });
        let mut names: Vec<&String> = Vec::new();
        for ((name, _), result) in sets.iter().zip(results.iter().cloned()) {
            match result {
                Ok(true) => {
                    names.push(name);
                    match report.counts.get_mut(name) {
                        Some(c) => *c += 1,
                        None => {
                            report.counts.insert(name.clone(), 1);
                        }
                    }
                }
                Ok(false) => {}
                Err(e) => {
                    let errs = report.errors.entry(name.clone()).or_default();
                    errs.devices += 1;
                    if errs.first.len() < ERRORS_KEPT {
                        errs.first.push((device.id(), e));
                    }
                }
            }
        }
        if names.len() > 1 {
            for (i, a) in names.iter().enumerate() {
                for b in &names[i + 1..] {
                    *report
                        .overlap_pairs
                        .entry(((*a).clone(), (*b).clone()))
                        .or_default() += 1;
                }
            }
            report
                .overlaps
                .push((device.id(), names.into_iter().cloned().collect()));
        }
    }
    let groups = pool
        .counters()
        .map(|counters| group_matches(pool, counters, &by_env));
    (report, groups)
}

/// What of a usable pool the sets match but no claim can get: tainted devices, and devices that
/// draw on counters the pool does not publish.
fn report_uncounted<S: Borrow<CompiledExpressions>>(
    pool: &Pool,
    sets: &BTreeMap<String, S>,
    report: &mut MatchReport,
) {
    if !pool.status.usable() {
        return;
    }
    for device in pool.devices().filter(|d| d.tainted()) {
        for (name, set) in sets {
            if set.borrow().matches(device.env()) == Ok(true) {
                let key = device.taint().unwrap_or_default().to_owned();
                report
                    .tainted
                    .entry(name.clone())
                    .or_default()
                    .add(1, [key]);
            }
        }
    }
    if let Some(drawing) = pool.counters().map(|c| &c.drawing) {
        for (place, device) in pool.devices().enumerate() {
            let Some(super::Drawing::Unknown(why)) = drawing.get(place) else {
                continue;
            };
            if device.tainted() {
                continue;
            }
            for (name, set) in sets {
                if set.borrow().matches(device.env()) == Ok(true) {
                    let entry = report.undeclared.entry(name.clone()).or_default();
                    entry.add(1, [format!("{}: {why}", device.name())]);
                }
            }
        }
    }
}

/// Per group of `counters`, per device, the places of the sets that match it (see
/// [`GroupMatches`]), from the results `by_env` holds per CEL input.
fn group_matches(
    pool: &Pool,
    counters: &super::PoolCounters,
    by_env: &HashMap<*const crate::dra_cel::DeviceEnv, Vec<Result<bool, ExpressionError>>>,
) -> GroupMatches {
    let none: Arc<[u16]> = Arc::new([]);
    let mut places: rustc_hash::FxHashMap<*const crate::dra_cel::DeviceEnv, Arc<[u16]>> =
        Default::default();
    let mut counted = vec![false; pool.order.len()];
    for (place, _) in pool.counted_places() {
        counted[place as usize] = true;
    }
    (counters.groups.iter())
        .map(|group| {
            (group.device_places())
                .map(|place| {
                    let Some(device) = pool.device_at(place) else {
                        return none.clone();
                    };
                    let env = std::ptr::from_ref(device.env());
                    let results = match by_env.get(&env) {
                        Some(results) if counted[place as usize] => results,
                        _ => return none.clone(),
                    };
                    (places.entry(env).or_insert_with(|| {
                        (results.iter().enumerate())
                            .filter(|(_, r)| matches!(r, Ok(true)))
                            .map(|(i, _)| u16::try_from(i).unwrap_or(u16::MAX))
                            .collect()
                    }))
                    .clone()
                })
                .collect()
        })
        .collect()
}
