//! The worked examples of docs/fair-sharing.md.

use super::*;

#[test]
fn a_team_is_told_when_the_only_idle_devices_are_its_own_guarantee() {
    // alpha uses 4 of its 8 guaranteed devices, and may hold 16: the 4 idle devices are its own,
    // which it may claim without borrowing, and beta (guaranteed none) borrows them.
    let out = compute_pool(&PoolInput {
        departments: Vec::new(),
        capacity: 8,
        teams: vec![using("alpha", 8, 16, 1, 4), using("beta", 0, 16, 1, 0)],
    });
    assert_eq!(entitlements(&out), [("alpha", 8), ("beta", 4)]);
    assert_eq!(
        share(&out, "alpha").explanation.to_string(),
        "8 guaranteed; the idle devices are its own unused guarantee"
    );
    assert_eq!(
        share(&out, "beta").explanation.to_string(),
        "0 guaranteed + 4 borrowed of 4 idle at weight 1/1"
    );
}

#[test]
fn no_contention_everyone_can_reach_its_limit() {
    let out = compute_pool(&PoolInput {
        departments: Vec::new(),
        capacity: 32,
        teams: vec![
            using("alpha", 8, 16, 1, 3),
            using("beta", 8, 16, 3, 5),
            using("gamma", 8, 8, 1, 8),
        ],
    });
    assert_eq!(out.idle, 16);
    assert_eq!(
        entitlements(&out),
        [("alpha", 16), ("beta", 16), ("gamma", 8)]
    );
    assert_eq!(share(&out, "alpha").borrowed, 8);
    assert_eq!(
        share(&out, "alpha").explanation.to_string(),
        "8 guaranteed + 8 borrowed of 16 idle at weight 1/4; limit 16 reached"
    );
    assert_eq!(share(&out, "gamma").explanation.to_string(), "8 guaranteed");
    assert!(out.reclaims.is_empty());
    assert_eq!(out.overcommit, None);
}

#[test]
fn one_team_idle_two_borrow_at_weights_1_and_3() {
    let out = compute_pool(&PoolInput {
        departments: Vec::new(),
        capacity: 24,
        teams: vec![
            using("alpha", 8, 24, 1, 8),
            using("beta", 8, 24, 3, 8),
            using("gamma", 8, 8, 1, 0),
        ],
    });
    // Weighted max-min of what the teams hold: at weights 1 and 3 the 24 devices would be 6
    // and 18; alpha's guarantee lifts it to 8, so beta's level is still below alpha's after
    // all 8 idle devices (16 / 3 < 9 / 1).
    assert_eq!(out.idle, 8);
    assert_eq!(
        entitlements(&out),
        [("alpha", 8), ("beta", 16), ("gamma", 8)]
    );
    assert_eq!(
        share(&out, "alpha").explanation.to_string(),
        "8 guaranteed; the idle devices went to other borrowers, who hold less for their weight"
    );
    assert_eq!(
        share(&out, "beta").explanation.to_string(),
        "8 guaranteed + 8 borrowed of 8 idle at weight 3/4"
    );
    // gamma can still claim its whole guarantee at once.
    assert_eq!(share(&out, "gamma").namespaces[0].hard, 8);
}

#[test]
fn owner_returns_and_the_reclaim_is_named() {
    // alpha and beta used what they borrowed; gamma's Pods now wait for 4 devices.
    let out = compute_pool(&PoolInput {
        departments: Vec::new(),
        capacity: 24,
        teams: vec![
            using("alpha", 8, 24, 1, 10),
            using("beta", 8, 24, 3, 14),
            team("gamma", 8, 8, 1, vec![ns("gamma-ns", 4, 0, 4)]),
        ],
    });
    assert_eq!(out.idle, 0);
    // Quotas never drop below use: the borrowers keep their claims, but cannot add any.
    assert_eq!(
        entitlements(&out),
        [("alpha", 10), ("beta", 14), ("gamma", 8)]
    );
    // Excess over weight is 2/1 for alpha and 6/3 for beta: both give back, beta more.
    assert_eq!(
        reclaims(&out),
        [("alpha", 1, "gamma"), ("beta", 3, "gamma")]
    );
}

#[test]
fn borrowers_give_back_from_above_their_weighted_share_of_the_pool() {
    // 24 devices, 16 guaranteed. gamma (8) waits for all of its guarantee while alpha (4,
    // weight 1) holds 8 and beta (4, weight 3) holds 16. Their weighted shares of the 16 not
    // guaranteed to gamma are 4 and 12: each holds 4 beyond its share, and each gives 4 back
    // (split by weight on top of the guarantees, it would have been 2 and 6).
    let out = compute_pool(&PoolInput {
        departments: Vec::new(),
        capacity: 24,
        teams: vec![
            using("alpha", 4, 24, 1, 8),
            using("beta", 4, 24, 3, 16),
            team("gamma", 8, 8, 1, vec![ns("gamma-ns", 0, 0, 8)]),
        ],
    });
    assert_eq!(
        reclaims(&out),
        [("alpha", 4, "gamma"), ("beta", 4, "gamma")]
    );
}

#[test]
fn guarantees_above_capacity_are_scaled_down() {
    let out = compute_pool(&PoolInput {
        departments: Vec::new(),
        capacity: 20,
        teams: vec![
            using("alpha", 12, 12, 1, 8),
            using("beta", 8, 8, 1, 5),
            using("gamma", 10, 10, 1, 7),
        ],
    });
    let effective: Vec<u32> = out.teams.iter().map(|t| t.effective_guarantee).collect();
    assert_eq!(effective, [8, 5, 7]);
    assert!(out.teams.iter().all(|t| t.scaled_down));
    let overcommit = out.overcommit.as_ref().expect("overcommit condition");
    assert_eq!((overcommit.guaranteed, overcommit.capacity), (30, 20));
    assert_eq!(
        overcommit.message,
        "guarantees add up to 30 devices but the pool has 20 (10 too many): effective guarantees scaled down in proportion"
    );
    assert_eq!(
        share(&out, "beta").explanation.to_string(),
        "5 guaranteed (scaled down from 8: guarantees exceed capacity by 10); no idle device to borrow"
    );
}

#[test]
fn limit_reached_the_rest_goes_to_the_other_borrower() {
    let out = compute_pool(&PoolInput {
        departments: Vec::new(),
        capacity: 16,
        teams: vec![using("alpha", 4, 6, 1, 4), using("beta", 4, 16, 1, 4)],
    });
    assert_eq!(entitlements(&out), [("alpha", 6), ("beta", 10)]);
    assert_eq!(
        share(&out, "alpha").explanation.to_string(),
        "4 guaranteed + 2 borrowed of 8 idle at weight 1/2; limit 6 reached"
    );
}

#[test]
fn zero_guarantee_team_only_borrows() {
    let out = compute_pool(&PoolInput {
        departments: Vec::new(),
        capacity: 10,
        teams: vec![using("guest", 0, 10, 1, 0), using("owner", 6, 6, 1, 2)],
    });
    assert_eq!(entitlements(&out), [("guest", 8), ("owner", 6)]);
    assert_eq!(
        share(&out, "guest").explanation.to_string(),
        "0 guaranteed + 8 borrowed of 8 idle at weight 1/1"
    );
    // When the owner needs its devices back, the guest is named.
    let out = compute_pool(&PoolInput {
        departments: Vec::new(),
        capacity: 10,
        teams: vec![
            using("guest", 0, 10, 1, 8),
            team("owner", 6, 6, 1, vec![ns("owner-ns", 6, 2, 4)]),
        ],
    });
    assert_eq!(share(&out, "guest").entitlement, 8);
    assert_eq!(reclaims(&out), [("guest", 4, "owner")]);
}

#[test]
fn namespace_split_serves_pending_demand_first_then_evenly() {
    let out = compute_pool(&PoolInput {
        departments: Vec::new(),
        capacity: 20,
        teams: vec![team(
            "alpha",
            12,
            12,
            1,
            vec![
                ns("train", 4, 4, 3),
                ns("infer", 2, 2, 0),
                ns("dev", 0, 0, 0),
            ],
        )],
    });
    let hards: Vec<(&str, u32)> = share(&out, "alpha")
        .namespaces
        .iter()
        .map(|n| (n.namespace.as_str(), n.hard))
        .collect();
    // 12 - 6 in use = 6 headroom: 3 to train's pending Pods, then 1 each.
    assert_eq!(hards, [("dev", 1), ("infer", 3), ("train", 8)]);
}

#[test]
fn use_above_limit_keeps_existing_claims_valid() {
    // The limit was lowered below what the team already uses.
    let out = compute_pool(&PoolInput {
        departments: Vec::new(),
        capacity: 20,
        teams: vec![using("alpha", 2, 4, 1, 7)],
    });
    let alpha = share(&out, "alpha");
    assert_eq!((alpha.entitlement, alpha.namespaces[0].hard), (7, 7));
    assert_eq!(
        alpha.explanation.to_string(),
        "2 guaranteed + 5 borrowed, in use; 7 in use is above limit 4: quota held at use until claims are released"
    );
}

#[test]
fn teams_whose_pods_wait_borrow_the_idle_devices_first() {
    // 16 idle devices. alpha (weight 3) waits for nothing more; beta (weight 1) has 10 devices'
    // worth of Pods waiting. Lent by weight alone, alpha would get 12 of them and beta's Pods
    // would wait beside idle devices; beta borrows its 10 first, alpha the other 6.
    let waiting = |name: &str, weight: u32, pending: u32| {
        team(name, 8, 40, weight, vec![ns(name, 8, 8, pending)])
    };
    let pool = |beta_waits: u32| PoolInput {
        departments: Vec::new(),
        capacity: 32,
        teams: vec![waiting("alpha", 3, 0), waiting("beta", 1, beta_waits)],
    };
    let out = compute_pool(&pool(10));
    assert_eq!(entitlements(&out), [("alpha", 14), ("beta", 18)]);
    assert_eq!(
        share(&out, "alpha").explanation.to_string(),
        "8 guaranteed + 6 borrowed of 16 idle at weight 3/4, after 10 lent first to teams whose Pods wait"
    );
    assert_eq!(
        share(&out, "beta").explanation.to_string(),
        "8 guaranteed + 10 borrowed of 16 idle at weight 1/4, first: its Pods wait"
    );
    // Waiting for more than is idle, beta gets all of it, and alpha is told why.
    let out = compute_pool(&pool(30));
    assert_eq!(entitlements(&out), [("alpha", 8), ("beta", 24)]);
    assert_eq!(
        share(&out, "alpha").explanation.to_string(),
        "8 guaranteed; the idle devices went to teams whose Pods wait"
    );
    // Nobody waits: by weight, the 32 are 24 and 8.
    let out = compute_pool(&pool(0));
    assert_eq!(entitlements(&out), [("alpha", 24), ("beta", 8)]);
}

#[test]
fn an_owner_whose_next_claim_is_larger_than_what_it_lacks_borrows_the_rest_of_it() {
    // vision is guaranteed 32 and holds 28; its next Pod asks for 8. research borrows 4 beyond
    // its guarantee, so the pool is over-lent, and serving's 16 sit idle. Lending nothing while
    // an owner waits would hold vision's quota at 32: its 8-GPU claim (28 + 8) refused, for as
    // long as research borrows, with 16 devices idle. vision may borrow the 4 beyond its
    // guarantee that its Pod needs; research, not waiting below its guarantee, gets nothing.
    let pool = |serving_waits: u32| PoolInput {
        departments: Vec::new(),
        capacity: 56,
        teams: vec![
            team("vision", 32, 64, 3, vec![ns("vision", 28, 28, 8)]),
            team("research", 8, 40, 1, vec![ns("research", 12, 12, 2)]),
            team(
                "serving",
                16,
                16,
                1,
                vec![ns("serving", 0, 0, serving_waits)],
            ),
        ],
    };
    let out = compute_pool(&pool(0));
    assert_eq!(out.idle, 16);
    assert_eq!(
        entitlements(&out),
        [("research", 12), ("serving", 16), ("vision", 36)]
    );
    assert_eq!(
        share(&out, "vision").explanation.to_string(),
        "32 guaranteed + 4 borrowed of 12 lendable idle at weight 3/3, first: its Pods wait"
    );
    assert_eq!(
        share(&out, "research").explanation.to_string(),
        "8 guaranteed + 4 borrowed, in use; nothing lent: the 16 idle devices are owed to owners below their guarantee"
    );
    // The free devices cover what vision lacks of its guarantee: nobody is reclaimed from.
    assert!(out.reclaims.is_empty());
    // serving's Pods now wait for 12 of its 16: the idle devices are serving's and vision's
    // unused 4, and vision borrows none.
    let out = compute_pool(&pool(12));
    assert_eq!(
        entitlements(&out),
        [("research", 12), ("serving", 16), ("vision", 32)]
    );
}

#[test]
fn a_claim_that_fits_no_node_does_not_keep_its_teams_other_pods_waiting() {
    // language is guaranteed 32 and holds 24; its 8-GPU claim is made and charged, but the 8
    // free devices are spread over nodes, so it fits none. Its 1- and 4-GPU Pods wait beside
    // it (13 waiting in all). research borrows 12 of speech's unused guarantee. Counted by
    // charge, nothing is idle and language's quota stays at 32 (24 + 8), so quota refuses the
    // small Pods while 8 devices sit idle below its guarantee.
    let pool = |language: NamespaceUsage, research: NamespaceUsage| PoolInput {
        departments: Vec::new(),
        capacity: 64,
        teams: vec![
            team("language", 32, 80, 3, vec![language]),
            team("research", 8, 48, 1, vec![research]),
            team("speech", 24, 48, 2, vec![ns("speech", 12, 12, 0)]),
        ],
    };
    let language = ns("language", 32, 24, 13);
    let research = ns("research", 20, 20, 0);
    let before = compute_pool(&pool(language.clone(), research.clone()));
    assert_eq!(before.idle, 0);
    assert_eq!(
        entitlements(&before),
        [("language", 32), ("research", 20), ("speech", 24)]
    );
    // Its small Pods may use the 5 of them they wait for: they are within its guarantee.
    let out = compute_pool(&pool(unplaceable(8, language.clone()), research));
    assert_eq!(out.idle, 0);
    assert_eq!(
        entitlements(&out),
        [("language", 37), ("research", 20), ("speech", 24)]
    );
    assert_eq!(share(&out, "language").reused, 5);
    assert_eq!(
        share(&out, "language").explanation.to_string(),
        "32 guaranteed + 5 of the 8 its claims that fit no node are charged, for its other Pods; \
         no idle device to borrow"
    );
    // The free devices cover what language lacks, counted: the engine asks nobody back (room
    // for the 8-GPU claim on one node is the placement's to order).
    assert!(out.reclaims.is_empty());

    // research's Pods wait too, a 2-GPU one that would fit a node among them: they are
    // language's, not research's to borrow.
    let out = compute_pool(&pool(unplaceable(8, language), ns("research", 20, 20, 2)));
    assert_eq!(
        entitlements(&out),
        [("language", 37), ("research", 20), ("speech", 24)]
    );
    // language holds 30: of the 8, only the 2 left of its guarantee are its small Pods'.
    let out = compute_pool(&pool(
        unplaceable(8, ns("language", 38, 30, 13)),
        ns("research", 20, 20, 0),
    ));
    assert_eq!(share(&out, "language").reused, 2);
}
