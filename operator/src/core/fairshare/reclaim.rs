//! Rule 6 of one pool: which borrowers give devices back to owners waiting below their guarantee.

use super::apportion::{water_fill, water_fill_above};
use super::{Reclaim, Team, to_u32};

/// Rule 6: owners below their effective guarantee with pending demand, when the free devices do
/// not cover them, get devices back from teams holding more than their fair entitlement. An
/// owner with a lending limit lent at most that many devices: the rest of its need is served
/// from the free devices first.
pub(super) fn reclaims(teams: &[Team<'_>], capacity: u64, effective: &[u64]) -> Vec<Reclaim> {
    let (needs, free) = needs_and_free(teams, capacity, effective);
    let need_sum: u64 = needs.iter().sum();
    if need_sum <= free {
        return Vec::new();
    }
    // Fair entitlement: the weighted max-min share of the capacity, effective guarantees as
    // floors and limits as caps (as idle devices are lent). What a team holds above it (never
    // counting below its guarantee) is excess.
    let limits: Vec<(u64, u32)> = teams
        .iter()
        .zip(effective)
        .map(|(t, &eg)| (u64::from(t.limit).max(eg), t.weight))
        .collect();
    let fair = water_fill_above(capacity, &limits, effective);
    let excess: Vec<(u64, u32)> = teams
        .iter()
        .enumerate()
        .map(|(i, t)| (t.allocated.saturating_sub(fair[i]), t.weight))
        .collect();
    let excess_sum: u64 = excess.iter().map(|e| e.0).sum();
    let wanted = (need_sum - free).min(excess_sum);
    if wanted == 0 {
        return Vec::new();
    }
    // Largest excess per weight gives back first: keep the lowest-level excess units.
    let keep = water_fill(excess_sum - wanted, &excess);
    let mut gives: Vec<(usize, u64)> = (0..teams.len())
        .map(|i| (i, excess[i].0 - keep[i]))
        .filter(|g| g.1 > 0)
        .collect();
    // Free devices serve first what owners never lent (need beyond the lending limit), then the
    // rest of the needs, both in name order; what is left is matched to borrowers in name order.
    let mut free_left = free;
    let never_lent: Vec<u64> = teams
        .iter()
        .zip(&needs)
        .map(|(t, &need)| {
            let kept = t
                .lending_limit
                .map_or(0, |limit| need.saturating_sub(u64::from(limit)));
            let from_free = kept.min(free_left);
            free_left -= from_free;
            from_free
        })
        .collect();
    let mut out = Vec::new();
    let mut giver = 0;
    for (owner, &need) in needs.iter().enumerate() {
        let need = need - never_lent[owner];
        let from_free = need.min(free_left);
        free_left -= from_free;
        let mut short = need - from_free;
        while short > 0 && giver < gives.len() {
            let (borrower, left) = &mut gives[giver];
            let take = short.min(*left);
            *left -= take;
            short -= take;
            if *left == 0 {
                giver += 1;
            }
            out.push(Reclaim {
                borrower: teams[*borrower].name.to_owned(),
                devices: to_u32(take),
                for_team: teams[owner].name.to_owned(),
            });
        }
    }
    out.sort_by(|a, b| (&a.for_team, &a.borrower).cmp(&(&b.for_team, &b.borrower)));
    out
}

/// What each team lacks of its `effective` guarantee that its Pods wait for (0 unless it is an
/// owner below its guarantee whose Pods wait), and the free devices: `capacity` less every
/// allocated device. Reclaim acts, and lending stops for all but the owners, when the needs
/// add up to more than the free devices.
pub(super) fn needs_and_free(
    teams: &[Team<'_>],
    capacity: u64,
    effective: &[u64],
) -> (Vec<u64>, u64) {
    let needs = (teams.iter().zip(effective))
        .map(|(t, &eg)| t.pending.min(eg.saturating_sub(t.allocated)))
        .collect();
    let allocated: u64 = teams.iter().map(|t| t.allocated).sum();
    (needs, capacity.saturating_sub(allocated))
}
