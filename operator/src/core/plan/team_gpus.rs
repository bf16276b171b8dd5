//! Memory slices on GPUs of a team's own (`memorySlices.placement: TeamGpus`): each GPU of the
//! policy belongs to one team at most, and a team's templates select its GPUs by the driver's
//! `uuid` attribute, so the scheduler puts its slices nowhere else. Pure.
//!
//! Which GPUs a team gets, at every pass ([`assign`]):
//! 1. a GPU that holds slices keeps belonging to the team that holds the most of them there (ties
//!    by name); one held only by claims outside teams is nobody's;
//! 2. a team whose GPUs hold fewer slices than its entitlement (what its GPUs hold and can still
//!    hold) gets empty GPUs, one at a time, the team short of the most first (ties by name), the
//!    GPUs in device order, until its GPUs hold its entitlement or no empty GPU is left;
//! 3. an empty GPU no team needs is nobody's. A team gives a GPU back once its slices there end
//!    and its entitlement no longer needs it.
//!
//! A GPU whose driver publishes no `uuid` cannot be selected, so it is nobody's (and said so).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::cel::string_literal;
use super::membership::Membership;
use super::shared_counters::SharedCounters;
use super::shared_counters::SliceGpu;
use crate::core::fairshare::PoolShares;

/// The GPUs of each team of one policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TeamGpus {
    pub teams: BTreeMap<String, OwnGpus>,
    /// GPUs that could not be given to anyone: no `uuid` attribute.
    pub without_uuid: u32,
}

/// The GPUs of one team.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnGpus {
    /// Their `uuid`s, sorted.
    pub uuids: Vec<Arc<str>>,
    /// The team's slices on them and what they can still hold.
    pub slices: u32,
}

/// The GPUs of each team, given the policy's `gpus`, each team's entitlement (`wanted`, in
/// slices) and the team of a namespace.
pub fn assign<'a>(
    gpus: &[SliceGpu],
    wanted: &BTreeMap<String, u32>,
    team_of: impl Fn(&str) -> Option<&'a str>,
) -> TeamGpus {
    let mut out = TeamGpus::default();
    let mut free: Vec<&SliceGpu> = Vec::new();
    let mut sorted: Vec<&SliceGpu> = gpus.iter().collect();
    sorted.sort_by(|a, b| a.id.cmp(&b.id));
    for gpu in sorted {
        let Some(uuid) = &gpu.uuid else {
            out.without_uuid += 1;
            continue;
        };
        if gpu.held.is_empty() {
            free.push(gpu);
            continue;
        }
        let mut by_team: BTreeMap<&str, u32> = BTreeMap::new();
        for (ns, n) in &gpu.held {
            if let Some(team) = team_of(ns) {
                *by_team.entry(team).or_default() += n;
            }
        }
        // The most slices, ties by name: `max_by` keeps the last of equals, so compare names
        // the other way round.
        let owner = (by_team.iter())
            .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
            .map(|(team, held)| (team.to_string(), *held));
        if let Some((owner, held)) = owner.filter(|(t, _)| wanted.contains_key(t)) {
            // Its own slices there and what is free; others' slices stay until they end.
            let others: u32 = gpu.held.values().sum::<u32>() - held;
            let own = out.teams.entry(owner).or_default();
            own.uuids.push(uuid.clone());
            own.slices += gpu.slices.saturating_sub(others);
        }
    }
    let short = |out: &TeamGpus, team: &str, entitlement: u32| {
        entitlement.saturating_sub(out.teams.get(team).map_or(0, |o| o.slices))
    };
    let mut free = free.into_iter();
    loop {
        let neediest = (wanted.iter())
            .map(|(team, e)| (team, short(&out, team, *e)))
            .filter(|(_, n)| *n > 0)
            .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(a.0)));
        let Some((team, _)) = neediest else { break };
        let Some(gpu) = free.next() else { break };
        let own = out.teams.entry(team.clone()).or_default();
        own.uuids.extend(gpu.uuid.clone());
        own.slices += gpu.slices;
    }
    for own in out.teams.values_mut() {
        own.uuids.sort();
    }
    out
}

/// The GPUs of each team of every policy whose teams get GPUs of their own (those of
/// [`SharedCounters::slice_gpus`]), for the teams' entitlements in `shares`.
pub fn of_policies(
    shared: &SharedCounters,
    shares: &BTreeMap<&str, &PoolShares>,
    membership: &Membership,
) -> BTreeMap<String, TeamGpus> {
    (shared.slice_gpus.iter())
        .map(|(policy, gpus)| {
            let wanted: BTreeMap<String, u32> = (shares.get(policy.as_str()).into_iter())
                .flat_map(|pool| pool.teams.iter())
                .map(|t| (t.team.clone(), t.entitlement))
                .collect();
            (
                policy.clone(),
                assign(gpus, &wanted, |ns| membership.team_of(ns)),
            )
        })
        .collect()
}

/// The CEL expression a team's templates select its GPUs with (`false`: it has none yet).
pub fn expression(driver: &str, uuids: &[Arc<str>]) -> String {
    if uuids.is_empty() {
        return "false".to_owned();
    }
    let uuid = format!("device.attributes[{}].uuid", string_literal(driver));
    let list: Vec<String> = uuids.iter().map(|u| string_literal(u)).collect();
    format!("has({uuid}) && {uuid} in [{}]", list.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::plan::inventory::DeviceId;

    fn gpu(device: &str, slices: u32, held: &[(&str, u32)]) -> SliceGpu {
        SliceGpu {
            id: DeviceId {
                driver: "gpu.nvidia.com".into(),
                pool: "node-m".into(),
                device: device.into(),
            },
            uuid: Some(Arc::from(format!("GPU-{device}"))),
            slices,
            held: held.iter().map(|(ns, n)| (Arc::from(*ns), *n)).collect(),
        }
    }

    fn team_of(ns: &str) -> Option<&'static str> {
        match ns {
            "nb" => Some("notebooks"),
            "inf" => Some("inference"),
            _ => None,
        }
    }

    fn uuids(out: &TeamGpus, team: &str) -> Vec<String> {
        (out.teams.get(team).into_iter())
            .flat_map(|o| o.uuids.iter().map(|u| u.to_string()))
            .collect()
    }

    #[test]
    fn a_gpu_stays_with_the_team_holding_most_and_empty_ones_go_to_the_teams_short_of_most() {
        let gpus = [
            gpu("gpu-0", 7, &[("nb", 2), ("inf", 1)]),
            gpu("gpu-1", 7, &[]),
            gpu("gpu-2", 7, &[]),
            gpu("gpu-3", 7, &[("legacy", 3)]),
        ];
        // notebooks wants 10 (gpu-0 holds 7 for it: 3 short), inference 7 (7 short).
        let wanted = [("notebooks".to_owned(), 10), ("inference".to_owned(), 7)].into();
        let out = assign(&gpus, &wanted, team_of);
        assert_eq!(uuids(&out, "notebooks"), ["GPU-gpu-0", "GPU-gpu-2"]);
        assert_eq!(uuids(&out, "inference"), ["GPU-gpu-1"]);
        // gpu-0: its 2 and the 4 free (inference's slice stays until it ends); gpu-2: 7.
        assert_eq!(out.teams["notebooks"].slices, 13);
        // gpu-3 is held by a claim outside teams: nobody's.
        assert!(
            !out.teams
                .values()
                .any(|o| o.uuids.iter().any(|u| &**u == "GPU-gpu-3"))
        );
    }

    #[test]
    fn no_gpu_is_given_beyond_the_entitlement_nor_twice() {
        let gpus = [gpu("gpu-0", 7, &[]), gpu("gpu-1", 7, &[])];
        let wanted = [("notebooks".to_owned(), 3), ("inference".to_owned(), 0)].into();
        let out = assign(&gpus, &wanted, team_of);
        assert_eq!(uuids(&out, "notebooks"), ["GPU-gpu-0"]);
        assert_eq!(uuids(&out, "inference"), Vec::<String>::new());
        let mut no_uuid = gpu("gpu-9", 7, &[]);
        no_uuid.uuid = None;
        let out = assign(&[no_uuid], &wanted, team_of);
        assert_eq!((out.without_uuid, out.teams.len()), (1, 0));
    }

    #[test]
    fn the_expression_selects_the_uuids_and_nothing_when_there_are_none() {
        assert_eq!(expression("gpu.nvidia.com", &[]), "false");
        assert_eq!(
            expression("gpu.nvidia.com", &[Arc::from("GPU-a"), Arc::from("GPU-b")]),
            "has(device.attributes['gpu.nvidia.com'].uuid) && device.attributes['gpu.nvidia.com'].uuid in ['GPU-a', 'GPU-b']"
        );
    }
}
