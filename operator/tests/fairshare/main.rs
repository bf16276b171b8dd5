//! Fair-share engine: property tests of every rule in docs/fair-sharing.md and the worked
//! examples from that document, lending limits included.

use proptest::prelude::*;
use teamgpu::core::fairshare::{
    NamespaceUsage, PoolInput, PoolShares, TeamInput, TeamShare, compute_pool, compute_pool_into,
};

mod departments;
mod examples;
mod lending_limits;

// ---------------------------------------------------------------------------------------------
// Builders

fn ns(namespace: &str, requested: u32, allocated: u32, pending: u32) -> NamespaceUsage {
    NamespaceUsage {
        namespace: namespace.to_owned(),
        requested,
        allocated,
        pending,
        unplaceable: 0,
    }
}

/// The same namespace with `devices` of its requested devices charged to claims that fit no
/// node.
fn unplaceable(devices: u32, namespace: NamespaceUsage) -> NamespaceUsage {
    NamespaceUsage {
        unplaceable: devices,
        ..namespace
    }
}

fn team(
    name: &str,
    guaranteed: u32,
    limit: u32,
    weight: u32,
    namespaces: Vec<NamespaceUsage>,
) -> TeamInput {
    TeamInput {
        team: name.to_owned(),
        guaranteed,
        limit,
        weight,
        namespaces,
        lending_limit: None,
        parent: None,
    }
}

/// The same team with a lending limit.
fn lending(limit: u32, team: TeamInput) -> TeamInput {
    TeamInput {
        lending_limit: Some(limit),
        ..team
    }
}

/// A team with one namespace named after it, whose claims are all allocated.
fn using(name: &str, guaranteed: u32, limit: u32, weight: u32, in_use: u32) -> TeamInput {
    team(
        name,
        guaranteed,
        limit,
        weight,
        vec![ns(&format!("{name}-ns"), in_use, in_use, 0)],
    )
}

fn share<'a>(out: &'a PoolShares, name: &str) -> &'a TeamShare {
    out.teams
        .iter()
        .find(|t| t.team == name)
        .unwrap_or_else(|| panic!("no team {name} in {out:#?}"))
}

fn entitlements(out: &PoolShares) -> Vec<(&str, u32)> {
    out.teams
        .iter()
        .map(|t| (t.team.as_str(), t.entitlement))
        .collect()
}

fn reclaims(out: &PoolShares) -> Vec<(&str, u32, &str)> {
    out.reclaims
        .iter()
        .map(|r| (r.borrower.as_str(), r.devices, r.for_team.as_str()))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Properties

/// One team: guarantee, limit, weight, its namespaces' (requested, allocated, pending,
/// unplaceable) and its lending limit.
type RawTeam = (u32, u32, u32, Vec<(u32, u32, u32, u32)>, Option<u32>);

/// A lending limit: mostly none, often 0, small or large.
fn lending_limit_strategy() -> impl Strategy<Value = Option<u32>> {
    prop_oneof![
        3 => Just(None),
        1 => Just(Some(0)),
        1 => (0u32..=30).prop_map(Some),
        1 => any::<u32>().prop_map(Some),
    ]
}

fn team_strategy() -> impl Strategy<Value = RawTeam> {
    (
        // Sometimes a small guarantee: a team that mostly borrows.
        prop_oneof![3 => 0u32..=120, 1 => 0u32..=10],
        prop_oneof![Just(0u32), 0u32..=150, 0u32..=30],
        0u32..=1100,
        // Claims often all allocated, so that what Pods wait for is beyond what is charged.
        prop::collection::vec(
            (
                0u32..=60,
                prop_oneof![0u32..=100, Just(100)],
                0u32..=40,
                // Mostly no claim that fits no node; sometimes some or all of those waiting.
                prop_oneof![6 => Just(0u32), 1 => 0u32..=100, 1 => Just(100)],
            ),
            0..=3,
        ),
        lending_limit_strategy(),
    )
        .prop_map(|(g, extra, w, namespaces, lending_limit)| {
            // Mostly limit >= guarantee, sometimes (extra drawn small) a limit below it.
            let limit = if extra <= 10 && g > 20 {
                g / 2
            } else {
                g + extra
            };
            let namespaces = namespaces
                .into_iter()
                .map(|(requested, allocated_pct, pending, unplaceable_pct)| {
                    let allocated = requested * allocated_pct / 100;
                    let waiting = requested - allocated;
                    (
                        requested,
                        allocated,
                        pending,
                        waiting * unplaceable_pct / 100,
                    )
                })
                .collect();
            (g, limit, w, namespaces, lending_limit)
        })
}

/// A pool of up to `max_teams` uniquely named teams, listed in random order.
fn pool_strategy(max_teams: usize) -> impl Strategy<Value = PoolInput> {
    prop::collection::vec(team_strategy(), 0..=max_teams)
        .prop_flat_map(|raw| {
            let guaranteed: u32 = raw.iter().map(|t| t.0).sum();
            let requested: u32 = raw.iter().flat_map(|t| t.3.iter().map(|n| n.0)).sum();
            let held: u32 = raw
                .iter()
                .map(|t| t.0.max(t.3.iter().map(|n| n.0).sum()))
                .sum();
            let pending: u32 = raw.iter().flat_map(|t| t.3.iter().map(|n| n.2)).sum();
            // Capacity anywhere, or close to the guarantees, the use or what the teams hold,
            // where the rules bite.
            let capacity = prop_oneof![
                0u32..=10_000,
                (guaranteed / 2)..=(guaranteed + guaranteed / 2 + 1),
                (requested / 2)..=(requested + requested / 4 + 1),
                held..=(held + held / 2 + 1),
                // Idle devices beyond what the teams hold, fewer than their Pods wait for.
                held..=(held + pending / 2 + 1),
            ];
            (Just(raw), capacity.prop_map(|c| c.min(10_000)))
        })
        .prop_map(|(raw, capacity)| PoolInput {
            departments: Vec::new(),
            capacity,
            teams: raw
                .into_iter()
                .enumerate()
                .map(|(i, (g, limit, weight, namespaces, lending_limit))| {
                    let name = format!("team-{i:03}");
                    let namespaces = namespaces
                        .into_iter()
                        .enumerate()
                        .map(|(j, (r, a, p, u))| {
                            unplaceable(u, ns(&format!("{name}-ns{j}"), r, a, p))
                        })
                        .collect();
                    TeamInput {
                        lending_limit,
                        ..team(&name, g, limit, weight, namespaces)
                    }
                })
                .collect(),
        })
        .prop_shuffle_teams()
}

/// Shuffles the team order, so that tests never rely on sorted input.
trait ShuffleTeams: Strategy<Value = PoolInput> + Sized {
    fn prop_shuffle_teams(self) -> BoxedStrategy<PoolInput>
    where
        Self: 'static,
    {
        self.prop_flat_map(|pool| {
            let capacity = pool.capacity;
            Just(pool.teams)
                .prop_shuffle()
                .prop_map(move |teams| PoolInput {
                    departments: Vec::new(),
                    capacity,
                    teams,
                })
        })
        .boxed()
    }
}

impl<S: Strategy<Value = PoolInput> + Sized> ShuffleTeams for S {}

fn input_of<'a>(pool: &'a PoolInput, name: &str) -> &'a TeamInput {
    pool.teams
        .iter()
        .find(|t| t.team == name)
        .unwrap_or_else(|| panic!("no input for {name}"))
}

/// Unused guaranteed devices: effective guarantee minus use, at least 0.
fn unused(t: &TeamShare) -> u64 {
    u64::from(t.effective_guarantee.saturating_sub(t.requested))
}

/// What the team's lending limit lets it lend of its unused guarantee.
fn lendable_of(t: &TeamShare) -> u64 {
    unused(t).min(t.lending_limit.map_or(u64::MAX, u64::from))
}

/// What a team holds without borrowing, and how much more it may borrow at most: up to its
/// limit, and no more than the lendable idle devices minus what it lends itself.
fn base_and_cap(t: &TeamShare, lendable: u64) -> (u64, u64) {
    let (eg, used, limit) = (
        u64::from(t.effective_guarantee),
        u64::from(t.requested),
        u64::from(t.limit),
    );
    let base = eg.max(used);
    let cap = limit
        .saturating_sub(base)
        .min(lendable.saturating_sub(lendable_of(t)));
    (base, cap)
}

/// Rule 3a: a team's other waiting Pods reuse the devices its claims that fit no node are
/// charged: as many as they need beyond what it holds and was lent (`lent`, in `out`'s order),
/// within its limit and its guarantee, and never another team's.
fn check_reuse(input: &PoolInput, out: &PoolShares, lent: &[u64]) {
    for (t, &b) in out.teams.iter().zip(lent) {
        let unplaceable: u64 = (input_of(input, &t.team).namespaces.iter())
            .map(|n| u64::from(n.unplaceable.min(n.requested)))
            .sum();
        let base = u64::from(t.effective_guarantee.max(t.requested));
        let waits = (u64::from(t.allocated) + u64::from(t.pending)).saturating_sub(base + b);
        let room = u64::from(t.limit).saturating_sub(base + b);
        let within =
            u64::from(t.effective_guarantee).saturating_sub(u64::from(t.requested) - unplaceable);
        assert_eq!(
            u64::from(t.reused),
            unplaceable.min(waits).min(room).min(within),
            "{}: reuses {} of {unplaceable} its claims that fit no node are charged",
            t.team,
            t.reused
        );
        assert_eq!(
            t.explanation.to_string().contains(&format!(
                " + {} of the {unplaceable} its claims that fit no node are charged, for its \
                 other Pods",
                t.reused
            )),
            t.reused > 0,
            "{}",
            t.explanation
        );
    }
}

/// Every rule of docs/fair-sharing.md that holds for a single pool.
fn check_pool(input: &PoolInput, out: &PoolShares) {
    let capacity = u64::from(input.capacity);
    let names: Vec<&str> = out.teams.iter().map(|t| t.team.as_str()).collect();
    assert!(
        names.windows(2).all(|w| w[0] < w[1]),
        "teams sorted and unique"
    );
    assert_eq!(out.teams.len(), input.teams.len());

    // Rule 1: effective guarantees.
    let g_sum: u64 = out.teams.iter().map(|t| u64::from(t.guaranteed)).sum();
    let eg_sum: u64 = out
        .teams
        .iter()
        .map(|t| u64::from(t.effective_guarantee))
        .sum();
    assert_eq!(
        eg_sum,
        g_sum.min(capacity),
        "guarantees fill the capacity when overcommitted"
    );
    assert_eq!(out.overcommit.is_some(), g_sum > capacity);
    for t in &out.teams {
        let input = input_of(input, &t.team);
        assert_eq!(t.guaranteed, input.guaranteed);
        assert_eq!(
            t.limit,
            input.limit.max(input.guaranteed),
            "limit below guarantee counts as guarantee"
        );
        assert_eq!(t.weight, input.weight.clamp(1, 1000));
        assert_eq!(t.lending_limit, input.lending_limit);
        assert!(t.effective_guarantee <= t.guaranteed);
        assert_eq!(t.scaled_down, t.effective_guarantee < t.guaranteed);
        // Proportional: never below the floor of the exact share.
        if let Some(floor) = (capacity.min(g_sum) * u64::from(t.guaranteed)).checked_div(g_sum) {
            assert!(
                u64::from(t.effective_guarantee) >= floor,
                "{} below its proportional share",
                t.team
            );
        }
        // Always claimable at once.
        assert!(t.entitlement >= t.effective_guarantee);
        assert_eq!(t.borrowed, t.entitlement - t.effective_guarantee);
        let reqs: u32 = input.namespaces.iter().map(|n| n.requested).sum();
        assert_eq!(t.requested, reqs);
        if t.scaled_down {
            assert!(
                t.explanation.to_string().contains("scaled down"),
                "{}",
                t.explanation
            );
        }
    }

    // Rules 2 and 3: idle devices are lent, never twice, max-min fair by weight, all of them
    // unless every borrower is full. Lending limits keep part of the unused guarantees out of
    // the idle devices that are lent.
    let used_sum: u64 = out.teams.iter().map(|t| u64::from(t.requested)).sum();
    let idle = capacity.saturating_sub(used_sum);
    assert_eq!(u64::from(out.idle), idle);
    for t in &out.teams {
        assert_eq!(
            u64::from(t.reserved),
            unused(t) - lendable_of(t),
            "{}: reserved is the unused guarantee beyond the lending limit",
            t.team
        );
        assert_eq!(
            t.explanation.to_string().contains(&format!(
                "; {} of {} unused kept unlent (lending limit ",
                t.reserved,
                unused(t)
            )),
            t.reserved > 0,
            "{}",
            t.explanation
        );
    }
    let reserved_sum: u64 = out.teams.iter().map(|t| u64::from(t.reserved)).sum();
    let lendable = idle.saturating_sub(reserved_sum);
    assert_eq!(u64::from(out.lendable), lendable);
    let base_sum: u64 = out.teams.iter().map(|t| base_and_cap(t, lendable).0).sum();
    let waiting_owner = |t: &TeamShare| t.pending > 0 && t.allocated < t.effective_guarantee;
    // Over-lent: borrowers eat into guarantees, and some waiting owner's claims do not cover
    // its guarantee, or the devices no claim is allocated do not cover what the waiting owners
    // lack.
    let uncharged = (out.teams.iter().filter(|t| waiting_owner(t)))
        .any(|t| t.requested < t.effective_guarantee);
    let lacking: u64 = (out.teams.iter().filter(|t| waiting_owner(t)))
        .map(|t| u64::from(t.pending.min(t.effective_guarantee - t.allocated)))
        .sum();
    let allocated: u64 = out.teams.iter().map(|t| u64::from(t.allocated)).sum();
    let uncovered = lacking > capacity.saturating_sub(allocated);
    let over_lent = base_sum > capacity && (uncharged || uncovered);
    // While over-lent, only owners waiting below their guarantee borrow, for their own waiting
    // Pods, from the idle devices beyond every such owner's lendable unused guarantee.
    let pool = match over_lent {
        true => lendable.saturating_sub(
            out.teams
                .iter()
                .filter(|t| waiting_owner(t))
                .map(lendable_of)
                .sum(),
        ),
        false => lendable,
    };
    let mut lent_sum = 0;
    let mut lent = Vec::new();
    // What each team's waiting Pods need beyond what it holds, within its cap.
    let mut wanted = Vec::new();
    for t in &out.teams {
        let (base, cap) = base_and_cap(t, lendable);
        let waits_for = (u64::from(t.allocated) + u64::from(t.pending)).saturating_sub(base);
        let cap = match (over_lent, waiting_owner(t)) {
            (false, _) => cap,
            (true, true) => cap.min(waits_for),
            (true, false) => 0,
        };
        // What it reuses of the devices charged to claims that fit no node is not lent.
        let b = u64::from(t.entitlement) - base - u64::from(t.reused);
        assert!(b <= cap, "{} borrows {b} beyond its cap {cap}", t.team);
        lent_sum += b;
        lent.push((b, cap, u64::from(t.weight), base));
        wanted.push(waits_for.min(cap));
    }
    // Never lent twice, and never a device a lending limit keeps.
    assert!(lent_sum <= pool, "lent {lent_sum} of {pool} lendable idle");
    // What is lent comes from the owners' lendable unused guarantees and from the capacity
    // nobody is guaranteed.
    let lendable_guarantees: u64 = out.teams.iter().map(lendable_of).sum();
    assert!(
        lent_sum <= lendable_guarantees + (capacity - eg_sum),
        "lent {lent_sum}: more than {lendable_guarantees} lendable guaranteed and {} unguaranteed",
        capacity - eg_sum
    );
    if lent_sum < pool {
        assert!(
            lent.iter().all(|&(b, cap, _, _)| b == cap),
            "lendable idle left while a team may borrow"
        );
    }
    check_reuse(input, out, &lent.iter().map(|l| l.0).collect::<Vec<_>>());
    // Teams whose Pods wait borrow first, weighted max-min up to what they wait for. Only when
    // every such want is met is the rest lent, weighted max-min up to the caps, counting what
    // each team already borrowed: a team given more than it waits for sits no higher than the
    // next device of any team below its cap. A team's level counts what it holds without
    // borrowing (`base`): the weighted max-min share of what teams hold, guarantees as floors.
    let wanted_sum: u64 = wanted.iter().sum();
    let rounds: Vec<(u64, u64, u64, u64, u64)> = if wanted_sum >= pool {
        lent.iter()
            .zip(&wanted)
            .map(|(&(b, _, w, base), &want)| (b, want, w, 0, base))
            .collect()
    } else {
        lent.iter()
            .zip(&wanted)
            .map(|(&(b, cap, w, base), &want)| (b, cap, w, want, base))
            .collect()
    };
    for &(b, cap, _, floor, _) in &rounds {
        assert!(
            floor <= b && b <= cap,
            "a team's Pods wait while others borrow beyond theirs: {lent:?} {wanted:?}"
        );
    }
    for &(bs, _, ws, floor, base_s) in &rounds {
        for &(bt, capt, wt, _, base_t) in &rounds {
            if bs > floor && bt < capt {
                // s's last device is at level (base + bs)/ws, t's next one at (base + bt + 1)/wt.
                assert!(
                    (base_s + bs) * wt <= (base_t + bt + 1) * ws,
                    "weighted max-min violated: {rounds:?}"
                );
            }
        }
    }

    // Rules 4 and 5: limits, use and the namespace split.
    for t in &out.teams {
        let input = input_of(input, &t.team);
        assert!(t.entitlement >= t.requested, "quota below use");
        assert!(t.entitlement <= t.limit.max(t.requested), "limit exceeded");
        assert_eq!(t.namespaces.len(), input.namespaces.len());
        let hard_sum: u64 = t.namespaces.iter().map(|n| u64::from(n.hard)).sum();
        if !t.namespaces.is_empty() {
            assert_eq!(
                hard_sum,
                u64::from(t.entitlement),
                "namespace hards add up to the entitlement"
            );
        }
        let headroom = t.entitlement - t.requested;
        let pending_sum: u32 = input.namespaces.iter().map(|n| n.pending).sum();
        for share in &t.namespaces {
            let usage = input
                .namespaces
                .iter()
                .find(|n| n.namespace == share.namespace)
                .expect("namespace");
            assert!(share.hard >= usage.requested, "namespace quota below use");
            if pending_sum <= headroom {
                assert!(
                    share.hard >= usage.requested + usage.pending,
                    "pending demand served first"
                );
            }
        }
    }

    // Rule 6: reclaims cover the waiting owners' shortfall, never take a borrower below its
    // guarantee and only happen when an owner waits.
    let need = |t: &TeamShare| {
        t.pending
            .min(t.effective_guarantee.saturating_sub(t.allocated))
    };
    let need_sum: u64 = out.teams.iter().map(|t| u64::from(need(t))).sum();
    let allocated_sum: u64 = out.teams.iter().map(|t| u64::from(t.allocated)).sum();
    let free = capacity.saturating_sub(allocated_sum);
    let reclaimed: u64 = out.reclaims.iter().map(|r| u64::from(r.devices)).sum();
    assert_eq!(
        reclaimed,
        need_sum.saturating_sub(free),
        "reclaim covers the shortfall: {:?}",
        out.reclaims
    );
    for t in &out.teams {
        let given: u32 = out
            .reclaims
            .iter()
            .filter(|r| r.borrower == t.team)
            .map(|r| r.devices)
            .sum();
        let got: u32 = out
            .reclaims
            .iter()
            .filter(|r| r.for_team == t.team)
            .map(|r| r.devices)
            .sum();
        assert!(
            given == 0 || t.allocated - given >= t.effective_guarantee,
            "{} reclaimed below guarantee",
            t.team
        );
        assert!(got <= need(t), "{} gets more than it waits for", t.team);
        assert!(given == 0 || got == 0);
    }
    assert!(out.reclaims.iter().all(|r| r.devices > 0));
    // An owner lent at most its lending limit: when the free devices cover every owner's need
    // beyond its lending limit, nobody is reclaimed more for than it may have lent, and a team
    // that lends nothing is never reclaimed for.
    let never_lent = |t: &TeamShare| {
        t.lending_limit
            .map_or(0, |l| u64::from(need(t)).saturating_sub(u64::from(l)))
    };
    let never_lent_sum: u64 = out.teams.iter().map(never_lent).sum();
    if never_lent_sum <= free {
        for t in &out.teams {
            let got: u64 = out
                .reclaims
                .iter()
                .filter(|r| r.for_team == t.team)
                .map(|r| u64::from(r.devices))
                .sum();
            assert!(
                got <= u64::from(need(t)) - never_lent(t),
                "{} gets {got} reclaimed beyond its lending limit {:?}",
                t.team,
                t.lending_limit
            );
        }
    }
}

proptest! {
    // The regressions beside this file (fairshare/main.proptest-regressions): the default would
    // look for a `main.rs` folder and share one file with every other test folder.
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_rule_holds(pool in pool_strategy(200)) {
        check_pool(&pool, &compute_pool(&pool));
    }

    /// Small pools, where a few teams' waiting Pods often want every idle device.
    #[test]
    fn every_rule_holds_in_small_pools(pool in pool_strategy(4)) {
        check_pool(&pool, &compute_pool(&pool));
    }

    #[test]
    fn independent_of_input_order(pool in pool_strategy(60), seed in any::<u64>()) {
        let mut shuffled = pool.clone();
        shuffled.teams.reverse();
        let len = shuffled.teams.len().max(1);
        shuffled.teams.rotate_left((seed as usize) % len);
        for t in &mut shuffled.teams {
            t.namespaces.reverse();
        }
        prop_assert_eq!(compute_pool(&pool), compute_pool(&shuffled));
    }

    #[test]
    fn reusing_an_old_answer_gives_the_same_answer(a in pool_strategy(40), b in pool_strategy(40)) {
        let mut out = compute_pool(&a);
        compute_pool_into(&b, &mut out);
        prop_assert_eq!(out, compute_pool(&b));
    }

    /// More capacity never lowers a guarantee, and takes from a team at most what it had
    /// borrowed: in an overcommitted pool more capacity raises the effective guarantees, and an
    /// owner that now waits below its raised guarantee stops the lending (e.g. capacity
    /// 191 -> 236 took team-003 from 79 to 74, all of it borrowed).
    #[test]
    fn more_capacity_never_lowers_a_guarantee_and_takes_only_borrowed_devices(
        pool in pool_strategy(60),
        more in 1u32..=50,
    ) {
        let before = compute_pool(&pool);
        let bigger = PoolInput { capacity: pool.capacity + more, ..pool.clone() };
        let after = compute_pool(&bigger);
        for (b, a) in before.teams.iter().zip(&after.teams) {
            prop_assert!(a.effective_guarantee >= b.effective_guarantee, "{}", a.team);
            prop_assert!(
                a.entitlement + b.borrowed >= b.entitlement,
                "{}: {} (borrowed {}) -> {}", a.team, b.entitlement, b.borrowed, a.entitlement
            );
        }
    }

    #[test]
    fn more_weight_never_lowers_the_own_entitlement(
        pool in pool_strategy(60),
        pick in any::<prop::sample::Index>(),
        more in 1u32..=500,
    ) {
        prop_assume!(!pool.teams.is_empty());
        let i = pick.index(pool.teams.len());
        let before = compute_pool(&pool);
        let mut heavier = pool.clone();
        heavier.teams[i].weight = heavier.teams[i].weight.saturating_add(more);
        let after = compute_pool(&heavier);
        let name = &pool.teams[i].team;
        prop_assert!(share(&after, name).entitlement >= share(&before, name).entitlement);
    }

    #[test]
    fn arbitrary_input_never_panics(
        capacity in any::<u32>(),
        teams in prop::collection::vec(
            ("[a-c]", any::<u32>(), any::<u32>(), any::<u32>(),
             prop::collection::vec(("[x-z]", any::<u32>(), any::<u32>(), any::<u32>()), 0..3),
             any::<Option<u32>>()),
            0..8),
    ) {
        let pool = PoolInput { departments: Vec::new(),
            capacity,
            teams: teams.into_iter().map(|(name, g, l, w, nss, lending_limit)| TeamInput {
                lending_limit,
                ..team(&name, g, l, w,
                    nss.into_iter().map(|(n, r, a, p)| ns(&n, r, a, p)).collect())
            }).collect(),
        };
        let out = compute_pool(&pool);
        for t in &out.teams {
            prop_assert!(t.entitlement >= t.effective_guarantee);
            prop_assert!(t.entitlement <= t.limit.max(t.requested));
            prop_assert!(t.reserved <= t.effective_guarantee);
        }
        prop_assert!(out.lendable <= out.idle);
    }

    /// No lending limit is the same as a lending limit nothing can reach: `Some(u32::MAX)`, or
    /// any limit at least the effective guarantee (a team never lends or is reclaimed for more
    /// than that). Only the echoed `lending_limit` differs.
    #[test]
    fn no_lending_limit_is_an_unreachable_lending_limit(
        pool in pool_strategy(60),
        picks in prop::collection::vec((any::<bool>(), 0u32..=100), 60),
    ) {
        let mut none = pool.clone();
        for t in &mut none.teams {
            t.lending_limit = None;
        }
        let expected = compute_pool(&none);
        let mut high = none.clone();
        for (t, &(max, extra)) in high.teams.iter_mut().zip(&picks) {
            // The effective guarantee is at most the guarantee.
            t.lending_limit = Some(if max { u32::MAX } else { t.guaranteed + extra });
        }
        let mut got = compute_pool(&high);
        for t in &mut got.teams {
            prop_assert!(t.lending_limit.is_some());
            t.lending_limit = None;
        }
        prop_assert_eq!(got, expected);
    }

    /// Raising one team's lending limit (up to none) never lowers another team's entitlement:
    /// it only adds idle devices others may borrow.
    #[test]
    fn a_higher_lending_limit_never_lowers_another_entitlement(
        pool in pool_strategy(60),
        pick in any::<prop::sample::Index>(),
        raise in prop_oneof![Just(None), (1u32..=40).prop_map(Some)],
    ) {
        prop_assume!(!pool.teams.is_empty());
        let i = pick.index(pool.teams.len());
        let mut lower = pool.clone();
        let mut higher = pool.clone();
        let current = pool.teams[i].lending_limit;
        match (current, raise) {
            // Compare with a lower limit instead when the team already lends everything.
            (None, None) => lower.teams[i].lending_limit = Some(0),
            (None, Some(by)) => lower.teams[i].lending_limit = Some(by),
            (Some(_), None) => higher.teams[i].lending_limit = None,
            (Some(l), Some(by)) => higher.teams[i].lending_limit = Some(l.saturating_add(by)),
        }
        let before = compute_pool(&lower);
        let after = compute_pool(&higher);
        let name = &pool.teams[i].team;
        for (b, a) in before.teams.iter().zip(&after.teams) {
            if &a.team != name {
                prop_assert!(
                    a.entitlement >= b.entitlement,
                    "{}: {} -> {} when {name}'s lending limit rises from {:?} to {:?}",
                    a.team, b.entitlement, a.entitlement,
                    share(&before, name).lending_limit, share(&after, name).lending_limit
                );
            }
        }
        prop_assert!(after.lendable >= before.lendable);
    }

    /// What a lending limit keeps is never owed back. Start from a pool whose kept devices are
    /// really idle (nobody's claims eat into them); let every team allocate any amount up to
    /// what it requested plus what it was lent (so nobody takes kept devices), and let any Pods
    /// wait. Then no owner is reclaimed for more than its lending limit, and a team with
    /// `Some(0)` keeps at least its effective guarantee and is never reclaimed for.
    #[test]
    fn what_is_never_lent_is_never_reclaimed(
        pool in pool_strategy(60),
        next in prop::collection::vec(
            (prop_oneof![Just(100u32), 0u32..=100], prop_oneof![Just(100u32), 0u32..=150]),
            60,
        ),
    ) {
        // Every device allocated at once, as below, is a state that claims fitting no node
        // never reach (their team's other Pods reuse their devices while they wait): none here.
        let mut pool = pool;
        for n in pool.teams.iter_mut().flat_map(|t| &mut t.namespaces) {
            n.unplaceable = 0;
        }
        let requested: u64 = pool.teams.iter()
            .flat_map(|t| t.namespaces.iter().map(|n| u64::from(n.requested)))
            .sum();
        // The smallest capacity (from the drawn one up) that has room for every claim and every
        // kept device; more capacity raises effective guarantees and so the kept devices.
        let mut before = compute_pool(&pool);
        for _ in 0..8 {
            let kept: u64 = before.teams.iter().map(|t| u64::from(t.reserved)).sum();
            if requested + kept <= u64::from(pool.capacity) {
                break;
            }
            pool.capacity = u32::try_from(requested + kept).unwrap();
            before = compute_pool(&pool);
        }
        let kept: u64 = before.teams.iter().map(|t| u64::from(t.reserved)).sum();
        prop_assume!(requested + kept <= u64::from(pool.capacity));
        let mut after = pool.clone();
        for (t, &(allocated_pct, pending_pct)) in after.teams.iter_mut().zip(&next) {
            let was = share(&before, &t.team);
            let lent = u64::from(was.entitlement)
                - u64::from(was.effective_guarantee.max(was.requested));
            let allocated = (u64::from(was.requested) + lent) * u64::from(allocated_pct) / 100;
            let allocated = u32::try_from(allocated).unwrap();
            let pending = was.effective_guarantee * pending_pct / 100;
            t.namespaces = vec![ns("only", allocated, allocated, pending)];
        }
        let out = compute_pool(&after);
        let allocated: u64 = out.teams.iter().map(|t| u64::from(t.allocated)).sum();
        prop_assert!(allocated <= u64::from(after.capacity));
        for t in &out.teams {
            let need = t.pending.min(t.effective_guarantee.saturating_sub(t.allocated));
            let got: u32 = out.reclaims.iter()
                .filter(|r| r.for_team == t.team)
                .map(|r| r.devices)
                .sum();
            prop_assert!(
                got <= need.min(t.lending_limit.unwrap_or(u32::MAX)),
                "{} is reclaimed for {got}, beyond its lending limit {:?}: {:?}",
                t.team, t.lending_limit, out.reclaims
            );
            if t.lending_limit == Some(0) {
                prop_assert!(t.entitlement >= t.effective_guarantee);
                prop_assert_eq!(got, 0);
            }
        }
    }
}

/// The random pools reach every regime the rules talk about, so that the properties above are
/// exercised and not passed vacuously.
#[test]
fn random_pools_reach_every_regime() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (mut overcommitted, mut lending, mut reclaiming, mut over_lent, mut at_limit) =
        (0, 0, 0, 0, 0);
    let (mut keeping, mut limited_lending, mut reusing) = (0, 0, 0);
    // Teams whose Pods wait borrow first: all the lendable devices, or their wants and more.
    let (mut waiting_take_all, mut waiting_then_others) = (0, 0);
    // Large pools, and small ones where a few teams' waiting Pods often want every idle device.
    for max_teams in std::iter::repeat_n(200, 500).chain(std::iter::repeat_n(4, 500)) {
        let Ok(tree) = pool_strategy(max_teams).new_tree(&mut runner) else {
            continue;
        };
        let pool = tree.current();
        let out = compute_pool(&pool);
        let held: u64 = out
            .teams
            .iter()
            .map(|t| u64::from(t.effective_guarantee.max(t.requested)))
            .sum();
        overcommitted += u32::from(out.overcommit.is_some());
        lending += u32::from(
            out.teams
                .iter()
                .any(|t| t.entitlement > t.effective_guarantee.max(t.requested)),
        );
        reclaiming += u32::from(!out.reclaims.is_empty());
        over_lent += u32::from(held > u64::from(pool.capacity));
        at_limit +=
            u32::from(out.teams.iter().any(|t| {
                t.entitlement == t.limit && t.limit > t.effective_guarantee.max(t.requested)
            }));
        let text: Vec<String> = out
            .teams
            .iter()
            .map(|t| t.explanation.to_string())
            .collect();
        let lent: u32 = out
            .teams
            .iter()
            .map(|t| t.entitlement - t.effective_guarantee.max(t.requested) - t.reused)
            .sum();
        waiting_take_all += u32::from(
            lent > 0
                && lent == out.lendable
                && text.iter().any(|t| t.contains("first: its Pods wait"))
                && !text.iter().any(|t| t.contains("lent first to teams")),
        );
        waiting_then_others += u32::from(
            text.iter()
                .any(|t| t.contains("lent first to teams whose Pods wait")),
        );
        keeping += u32::from(out.lendable < out.idle);
        reusing += u32::from(out.teams.iter().any(|t| t.reused > 0));
        limited_lending += u32::from(
            out.lendable < out.idle
                && out
                    .teams
                    .iter()
                    .any(|t| t.entitlement > t.effective_guarantee.max(t.requested)),
        );
    }
    for (regime, count) in [
        ("overcommitted", overcommitted),
        ("lending", lending),
        ("reclaiming", reclaiming),
        ("over-lent", over_lent),
        ("borrower at its limit", at_limit),
        ("keeping idle devices unlent", keeping),
        ("reusing what claims that fit no node are charged", reusing),
        ("lending beside devices kept unlent", limited_lending),
        (
            "lending all idle devices to teams whose Pods wait",
            waiting_take_all,
        ),
        (
            "lending to others after the waiting teams",
            waiting_then_others,
        ),
    ] {
        assert!(
            count >= 25,
            "only {count} of 1000 random pools are {regime}"
        );
    }
}
