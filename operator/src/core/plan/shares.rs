//! Phase 4, fair shares: per usable sharing policy, one pool of its available devices among the
//! teams with a quota for it, computed again only when the pool's input changed.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::budgets::{self, Budgets};
use super::cache::{Cache, fingerprint};
use super::counters;
use super::demand::Demand;
use super::identity::name_of;
use super::membership::Membership;
use super::objects::device_class_name;
use super::placement::{self, Placement, PoolRoom};
use super::policies::CompiledPolicy;
use super::shared_counters::SharedCounters;
use super::types::ReclaimOrder;
use crate::api::{Entitlement, TeamGpuPolicy};
use crate::core::fairshare::{self, PoolInput, PoolShares, TeamInput};

/// Fair shares per sharing policy, kept until the fingerprint of the pool's input changes
/// ([`fair_shares`]).
pub type Shares = Cache<String, u64, PoolShares>;

/// What the pools ask for besides the shares: borrowers to reclaim from, and overcommit.
#[derive(Default)]
pub struct Findings {
    pub reclaims: Vec<ReclaimOrder>,
    pub placements: Vec<Placement>,
    pub warnings: Vec<String>,
    /// Per policy, the contested counter groups it was given (see [`counters::allot`]).
    pub allotted: counters::Allotted,
}

/// How many devices a policy's pool has for the teams.
pub type Available<'a> = &'a dyn Fn(&str) -> u32;

/// Where a policy's devices are and how many are free, pool by pool (read only when a team
/// waits below its guarantee, or a claim of the policy's class waits charged).
pub type Rooms<'a> = &'a dyn Fn(&str) -> Vec<PoolRoom>;

/// The fair shares of every usable policy's pool, `available` devices each plus the counter
/// contested counter groups of `shared` it is given, into `shares`; and where a team waits below its
/// guarantee, whether its claims fit the free devices of a node (`rooms`, see
/// [`super::placement`]).
///
/// A pool's teams are read namespace by namespace only when the pool's shares are computed
/// again: at 10,000 team namespaces, reading them for every pool each pass was most of a
/// claim's pass. What decides is a fingerprint of the pool's teams, their entitlements and a
/// hash of their namespaces' demand ([`Demand::mark`], once per team). Pools that contest
/// counter groups are read whole, since what they are given depends on each other's demand.
pub fn fair_shares(
    shares: &mut Shares,
    policies: &[CompiledPolicy],
    teams: &[&TeamGpuPolicy],
    membership: &Membership,
    (demand, available, rooms, shared): (&Demand, Available, Rooms, &SharedCounters),
    budgets: &Budgets,
) -> Findings {
    let mut findings = Findings::default();
    let contested: BTreeSet<&str> = (shared.contested.iter())
        .flat_map(|c| c.more.keys().map(String::as_str))
        .collect();
    // Each team's namespaces' demand, hashed once a pass for all the pools it is in.
    let marks: HashMap<&str, u64> = (membership.namespaces.iter())
        .map(|(team, namespaces)| (team.as_str(), demand.mark(namespaces)))
        .collect();
    // Per pool, its input and, while its namespaces are unread, what they are read with.
    let mut pools: BTreeMap<String, (PoolInput, Option<Unread>)> = BTreeMap::new();
    let mut given: BTreeMap<String, PoolInput> = BTreeMap::new();
    // The pools' rooms read for their claims that fit no node, kept for their placement.
    let mut read_rooms: HashMap<&str, Vec<PoolRoom>> = HashMap::new();
    for policy in policies.iter().filter(|p| p.usable()) {
        let class = device_class_name(&policy.name);
        let held = |node: &str, entitlement| {
            let at = (policy.name.as_str(), class.as_str());
            budgets::held(node, at, (membership, demand), budgets, entitlement)
        };
        // Part of the fingerprint: it says which waiting claims fit no node.
        let most_free = most_free(&policy.name, &class, (demand, rooms), &mut read_rooms);
        let mut input = PoolInput {
            capacity: available(&policy.name),
            teams: teams
                .iter()
                .filter(|team| !team.spec.department)
                .filter_map(|team| team_input(team, policy, membership, &held))
                .collect(),
            departments: departments(teams, policy, membership, &held),
        };
        if contested.contains(policy.name.as_str()) {
            read_namespaces(&mut input, &class, membership, (demand, most_free));
            given.insert(policy.name.clone(), input);
        } else {
            let team_marks: Vec<u64> = (input.teams.iter())
                .map(|t| marks.get(t.team.as_str()).copied().unwrap_or_default())
                .collect();
            let fingerprint = fingerprint(&(&input, team_marks, most_free));
            pools.insert(policy.name.clone(), (input, Some((fingerprint, most_free))));
        }
    }
    findings.allotted = counters::allot(&shared.contested, &mut given);
    for (name, input) in &given {
        let guaranteed = counters::guaranteed(input);
        let others = shared.contested_with(name);
        if !others.is_empty() && u64::from(input.capacity) < guaranteed {
            findings.warnings.push(format!(
                "sharing policy {name}: its teams' guarantees ({guaranteed} devices) do not fit beside those of {others}, whose devices draw on the same counters: it counts {} devices",
                input.capacity
            ));
        }
    }
    pools.extend(given.into_iter().map(|(name, input)| (name, (input, None))));
    for (name, (mut input, unread)) in pools {
        let class = device_class_name(&name);
        // A read pool's fingerprint is its whole input, told apart from an unread one's.
        let fingerprint = unread.map_or_else(|| fingerprint(&("read", &input)), |u| u.0);
        let pool = shares.get(name.clone(), fingerprint, |_| {
            if let Some((_, most_free)) = unread {
                read_namespaces(&mut input, &class, membership, (demand, most_free));
            }
            fairshare::compute_pool(&input)
        });
        let waits =
            (pool.teams.iter()).any(|t| t.pending > 0 && t.allocated < t.effective_guarantee);
        let placement = waits
            .then(|| {
                let claims_of =
                    |team: &str| demand.waiting_claims(namespaces_of(membership, team), &class);
                let read = read_rooms.remove(name.as_str());
                let pools = read.unwrap_or_else(|| rooms(&name));
                let rooms = counters::rooms(pools, &name, shared, &findings.allotted);
                placement::place(&name, pool, &rooms, claims_of)
            })
            .flatten();
        (findings.reclaims).extend(placement::orders(&name, pool, placement.as_ref()));
        findings.placements.extend(placement);
        if let Some(over) = &pool.overcommit {
            findings
                .warnings
                .push(format!("sharing policy {name}: {}", over.message));
        }
    }
    shares.sweep();
    findings
}

/// A pool whose namespaces are not read yet: its fingerprint, and the most free devices on one
/// of its nodes (`None`: not read, no claim of its class waits charged), to read them with.
type Unread = (u64, Option<u32>);

/// The namespaces `team` owns.
fn namespaces_of<'a>(membership: &'a Membership, team: &str) -> &'a [String] {
    membership.namespaces.get(team).map_or(&[], |n| &n[..])
}

/// Fills in each team's use of `class`, namespace by namespace; `most_free` as for
/// [`Demand::of`].
fn read_namespaces(
    input: &mut PoolInput,
    class: &str,
    membership: &Membership,
    (demand, most_free): (&Demand, Option<u32>),
) {
    for team in &mut input.teams {
        team.namespaces = (namespaces_of(membership, &team.team).iter())
            .map(|ns| demand.of(ns, class, most_free))
            .collect();
    }
}

/// The most free devices on one node of `policy`'s pools; `None` when no pool is on a node, or
/// no claim of `class` waits charged (then which claims fit no node does not matter, and the
/// pools are not read). The pools read are kept in `read`, for the policy's placement.
fn most_free<'p>(
    policy: &'p str,
    class: &str,
    (demand, rooms): (&Demand, Rooms),
    read: &mut HashMap<&'p str, Vec<PoolRoom>>,
) -> Option<u32> {
    if !demand.charged_waiting(class) {
        return None;
    }
    let pools = read.entry(policy).or_insert_with(|| rooms(policy));
    (placement::free_per_node(pools).into_iter())
        .filter_map(|(node, free)| node.map(|_| free))
        .max()
}

/// A team in the pool of `policy`, if it has a quota for it whose amounts count in the policy's
/// devices (the status says why not), and owns namespaces; its entitlement `held` to the budgets
/// over it. Its namespaces are not read yet.
fn team_input(
    team: &TeamGpuPolicy,
    policy: &CompiledPolicy,
    membership: &Membership,
    held: Held,
) -> Option<TeamInput> {
    let name = name_of(team);
    let quota = team
        .spec
        .quotas
        .iter()
        .find(|q| q.sharing_policy == policy.name)?;
    let entitlement = held(&name, quota.entitlement(policy.slice()).ok()?);
    // A team without namespaces has no place in the pool.
    membership.namespaces.get(&name)?;
    Some(TeamInput {
        parent: parent_in_pool(&name, &policy.name, membership),
        team: name,
        guaranteed: entitlement.guaranteed,
        limit: entitlement.limit,
        weight: quota.weight.unwrap_or(team.spec.weight),
        lending_limit: entitlement.lending_limit,
        // Read when the pool's shares are computed ([`read_namespaces`]).
        namespaces: Vec::new(),
    })
}

/// A node's entitlement in a pool held to the budgets over it ([`budgets::held`]).
type Held<'a> = &'a dyn Fn(&str, Entitlement) -> Entitlement;

/// The department `team` belongs to in `policy`'s pool: the nearest above it with a quota there.
fn parent_in_pool(team: &str, policy: &str, membership: &Membership) -> Option<String> {
    let tree = &membership.tree;
    let has_quota = |d: &str| tree.quotas.get(d).is_some_and(|q| q.contains(policy));
    tree.ancestor(team, has_quota).map(str::to_owned)
}

/// The departments with a usable quota for `policy`, each under the nearest department above
/// it that has one too (a department without one is passed through in this pool).
fn departments(
    teams: &[&TeamGpuPolicy],
    policy: &CompiledPolicy,
    membership: &Membership,
    held: Held,
) -> Vec<fairshare::DepartmentInput> {
    (teams.iter())
        .filter(|team| team.spec.department)
        .filter_map(|team| {
            let quota = (team.spec.quotas.iter()).find(|q| q.sharing_policy == policy.name)?;
            let name = name_of(*team);
            let entitlement = held(&name, quota.entitlement(policy.slice()).ok()?);
            Some(fairshare::DepartmentInput {
                parent: parent_in_pool(&name, &policy.name, membership),
                guaranteed: entitlement.guaranteed,
                limit: entitlement.limit,
                weight: quota.weight.unwrap_or(team.spec.weight),
                lending_limit: entitlement.lending_limit,
                name,
            })
        })
        .collect()
}

/// The shares of every pool, by policy name.
pub fn by_policy(shares: &Shares) -> BTreeMap<&str, &PoolShares> {
    shares
        .values()
        .map(|(name, pool)| (name.as_str(), pool))
        .collect()
}
