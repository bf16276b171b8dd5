//! Rules 2 and 3 of one pool: which idle devices are lent, and to whom.

use super::apportion::water_fill_above;
use super::reclaim::needs_and_free;
use super::{Explanation, LevelRules, Team, to_u32};

/// How one pool's idle devices are lent (rules 2 and 3), per team in the order of `teams`.
pub(super) struct Lending {
    /// Devices charged to the team's claims.
    used: Vec<u64>,
    /// What the team holds without borrowing: max(effective guarantee, use).
    base: Vec<u64>,
    /// Unused guaranteed devices kept out of the idle pool (by a lending limit, or for a
    /// department's waiting members).
    pub(super) reserved: Vec<u64>,
    /// Of `reserved`, what a department keeps for its waiting members.
    kept: Vec<u64>,
    pub(super) idle: u64,
    pub(super) lendable: u64,
    over_lent: bool,
    /// What is lent: `lendable`, or while over-lent what the waiting owners are not owed.
    pool: u64,
    lent: Vec<u64>,
    /// Per team: devices charged to its claims that fit no node, which its other waiting Pods
    /// may use meanwhile (rule 3a).
    pub(super) reused: Vec<u64>,
    borrower_weight: u64,
    /// Devices lent to teams for their waiting Pods, before the rest is lent by weight.
    to_waiting: u64,
    /// Per team: how many of the devices it was lent its waiting Pods need.
    wants: Vec<u64>,
}

impl Lending {
    /// What team `i` may claim: what it holds without borrowing, plus what it is lent.
    pub(super) fn entitlement(&self, i: usize) -> u64 {
        self.base[i] + self.lent[i] + self.reused[i]
    }

    /// The numbers behind team `i`'s share (`team`, its effective guarantee `effective`, the
    /// pool's guarantees `over_by` its capacity), for its one-line explanation.
    pub(super) fn explanation(
        &self,
        i: usize,
        team: &Team<'_>,
        effective: u64,
        over_by: u64,
    ) -> Explanation {
        // What a lending limit keeps, beside what a department keeps for its members.
        let by_limit = self.reserved[i] - self.kept[i];
        Explanation {
            guaranteed: team.guaranteed,
            effective: to_u32(effective),
            limit: team.limit,
            weight: team.weight,
            requested: to_u32(self.used[i]),
            lent: to_u32(self.lent[i]),
            reused: to_u32(self.reused[i]),
            unplaceable: to_u32(team.unplaceable),
            entitlement: to_u32(self.entitlement(i)),
            idle: to_u32(self.idle),
            lendable: to_u32(self.pool),
            unused: to_u32(self.base[i] - self.used[i]),
            reserved: to_u32(by_limit),
            // Only a lending limit that keeps devices shows in the line.
            lending_limit: team.lending_limit.filter(|_| by_limit > 0).unwrap_or(0),
            borrower_weight: self.borrower_weight,
            over_by,
            can_borrow: u64::from(team.limit) > self.base[i],
            over_lent: self.over_lent,
            kept_for_members: to_u32(self.kept[i]),
            to_waiting: to_u32(self.to_waiting),
            waits: self.wants[i] > 0,
        }
    }
}

/// Lends the idle devices of one pool (or one level of a tree) to `teams`, whose effective
/// guarantees are `effective`.
pub(super) fn lend(
    teams: &[Team<'_>],
    capacity: u64,
    effective: &[u64],
    level: &LevelRules<'_>,
) -> Lending {
    let n = teams.len();
    // Rules 2 and 3: lend the devices no claim is charged for. A team holds max(guarantee, use)
    // without borrowing; it may borrow up to its limit, and never its own unused guarantee.
    // While borrowers hold devices some owner is guaranteed (the pool is over-lent) *and* such an
    // owner waits on them (`waiting_owners`), every idle device is owed to the waiting owners and
    // lent to nobody else. While no owner waits, lending stays as it was:
    // a borrower's quota must not shrink merely because it used what it was lent.
    let used: Vec<u64> = teams
        .iter()
        .map(|t| t.requested.min(u64::from(u32::MAX)))
        .collect();
    let used_sum: u64 = used.iter().sum();
    let capacity = capacity.saturating_sub(level.withheld);
    let idle = capacity.saturating_sub(used_sum);
    let base: Vec<u64> = (0..n).map(|i| effective[i].max(used[i])).collect();
    let (kept, reserved) = unlent(teams, &base, &used, level);
    let reserved_sum: u64 = reserved.iter().sum();
    let lendable = idle.saturating_sub(reserved_sum);
    // Owners below their guarantee whose Pods wait, and whether the pool is over-lent.
    let (waiting_owner, over_lent) = waiting_owners(teams, effective, &base, capacity);
    // While over-lent, the idle devices are the waiting owners': only they borrow, and only for
    // their own waiting Pods (a claim larger than what an owner lacks of its guarantee needs
    // devices beyond it, else it waits with the devices idle), from what is idle beyond every
    // waiting owner's lendable unused guarantee.
    let pool = match over_lent {
        true => lendable.saturating_sub(
            (0..n)
                .filter(|&i| waiting_owner[i])
                .map(|i| base[i] - used[i] - reserved[i])
                .sum(),
        ),
        false => lendable,
    };
    // What each team's waiting Pods need beyond what it holds (its allocated devices plus what
    // it waits for, beyond `base`).
    let waits_for: Vec<u64> = (0..n)
        .map(|i| (teams[i].allocated + teams[i].pending).saturating_sub(base[i]))
        .collect();
    let caps: Vec<(u64, u32)> = (0..n)
        .map(|i| {
            let by_limit = u64::from(teams[i].limit).saturating_sub(base[i]);
            // Equals the lendable idle devices minus the team's own lendable unused guarantee.
            let by_idle = (used[i] + reserved[i] + lendable).saturating_sub(base[i]);
            let cap = match (over_lent, waiting_owner[i]) {
                (false, _) => by_limit.min(by_idle),
                (true, true) => by_limit.min(by_idle).min(waits_for[i]),
                (true, false) => 0,
            };
            (cap, teams[i].weight)
        })
        .collect();
    // Teams whose Pods wait borrow first, up to what those Pods need beyond what the team
    // holds; the rest is lent by weight to every team with room, so a team creating claims fast
    // still finds some headroom.
    let wants: Vec<(u64, u32)> = (0..n)
        .map(|i| (caps[i].0.min(waits_for[i]), caps[i].1))
        .collect();
    let none = vec![0; n];
    let mut lent = fill_over_holdings(pool, &base, &wants, &none);
    let to_waiting: u64 = lent.iter().sum();
    let waiting_take_all = to_waiting == pool && to_waiting > 0;
    if !waiting_take_all {
        lent = fill_over_holdings(pool, &base, &caps, &lent);
    }
    let reused = reuse(teams, effective, (&base, &lent), &waits_for);
    let weighed = if waiting_take_all { &wants } else { &caps };
    let borrower_weight: u64 = weighed
        .iter()
        .filter(|c| c.0 > 0)
        .map(|c| u64::from(c.1))
        .sum();
    Lending {
        used,
        base,
        reserved,
        kept,
        idle,
        lendable,
        over_lent,
        pool,
        lent,
        reused,
        borrower_weight,
        to_waiting,
        wants: wants.iter().map(|w| w.0).collect(),
    }
}

/// Per team, whether it is an owner below its effective guarantee whose Pods wait; and whether
/// the pool is over-lent: borrowers' claims eat into guarantees (Σ`base` above `capacity`) while
/// such an owner waits on them.
fn waiting_owners(
    teams: &[Team<'_>],
    effective: &[u64],
    base: &[u64],
    capacity: u64,
) -> (Vec<bool>, bool) {
    let waiting_owner: Vec<bool> = (0..teams.len())
        .map(|i| teams[i].pending > 0 && teams[i].allocated < effective[i])
        .collect();
    // They wait on borrowers while their claims do not cover their guarantee (the devices they
    // lack are idle or held by borrowers), or while the free devices (no claim allocated) do not
    // cover what they lack (reclaim acts, rule 6). An owner whose claims cover its guarantee,
    // on their way to free devices, waits on nobody: else lending would stop, and every
    // borrower's quota shrink (its own too, when it borrows), for the moment between its
    // claims being made and allocated.
    let uncharged = (0..teams.len()).any(|i| waiting_owner[i] && teams[i].requested < effective[i]);
    let (needs, free) = needs_and_free(teams, capacity, effective);
    let uncovered = needs.iter().sum::<u64>() > free;
    let over_lent = (uncharged || uncovered) && base.iter().sum::<u64>() > capacity;
    (waiting_owner, over_lent)
}

/// Per team, of its unused guarantee (`base - used`): what a department keeps for its waiting
/// members, and everything kept out of the idle devices others borrow (that, plus what the
/// lending limit keeps).
fn unlent(
    teams: &[Team<'_>],
    base: &[u64],
    used: &[u64],
    level: &LevelRules<'_>,
) -> (Vec<u64>, Vec<u64>) {
    // A department keeps as much of its unused guarantee as its members wait for.
    let kept: Vec<u64> = (0..teams.len())
        .map(|i| match level.departments.contains(teams[i].name) {
            true => (base[i] - used[i]).min(teams[i].pending),
            false => 0,
        })
        .collect();
    // Lending limits: of the rest, only `lending_limit` devices enter the pool others borrow
    // from; the rest stays reserved for the team.
    let reserved = (0..teams.len())
        .map(|i| {
            let lendable = base[i] - used[i] - kept[i];
            let by_limit = teams[i]
                .lending_limit
                .map_or(0, |limit| lendable.saturating_sub(u64::from(limit)));
            kept[i] + by_limit
        })
        .collect();
    (kept, reserved)
}

/// Rule 3a: a team's claims that fit no node are charged (`Team::unplaceable`) while their devices
/// sit idle. Its other waiting Pods may use them meanwhile: as many as they need beyond what it
/// holds (`base`) and was `lent`, within its limit, and within its `effective` guarantee, so
/// that nobody has to take them back while those claims wait. Nobody else's: other teams' Pods
/// given room there made nodes harder to free for those claims, or were charged for room no
/// node had, and were reclaimed (docs/fair-sharing.md).
fn reuse(
    teams: &[Team<'_>],
    effective: &[u64],
    (base, lent): (&[u64], &[u64]),
    waits_for: &[u64],
) -> Vec<u64> {
    (teams.iter().enumerate())
        .map(|(i, t)| {
            let by_limit = u64::from(t.limit).saturating_sub(base[i] + lent[i]);
            let waits = waits_for[i].saturating_sub(lent[i]);
            // What the team holds or is charged for besides those claims, under its guarantee.
            let within = effective[i].saturating_sub(t.requested - t.unplaceable);
            t.unplaceable.min(by_limit).min(waits).min(within)
        })
        .collect()
}

/// Water-fills `pool` idle devices over the teams, each already `given` some (at most its cap
/// in `items`), where a team's level counts what it holds without borrowing: its next device
/// sits at (base + lent + 1) / weight. Idle devices go first to the teams holding the least per
/// weight, guarantees as floors: the weighted max-min share of what teams hold, not of what
/// each was lent this pass (a team that borrowed much waits behind one that borrowed little).
fn fill_over_holdings(pool: u64, base: &[u64], items: &[(u64, u32)], given: &[u64]) -> Vec<u64> {
    let held: u64 = base.iter().sum();
    let shifted: Vec<(u64, u32)> = (items.iter().zip(base))
        .map(|(&(cap, weight), b)| (b + cap, weight))
        .collect();
    let floors: Vec<u64> = base.iter().zip(given).map(|(b, g)| b + g).collect();
    let filled = water_fill_above(pool + held, &shifted, &floors);
    filled
        .iter()
        .zip(base)
        .map(|(total, b)| total - b)
        .collect()
}
