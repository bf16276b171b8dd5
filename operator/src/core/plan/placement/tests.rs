use super::*;
use crate::core::fairshare::{Reclaim, TeamShare};

fn share(team: &str, guaranteed: u32, allocated: u32, pending: u32) -> TeamShare {
    TeamShare {
        team: team.into(),
        guaranteed,
        effective_guarantee: guaranteed,
        weight: 1,
        allocated,
        requested: allocated + pending,
        pending,
        ..TeamShare::default()
    }
}

/// `nodes` nodes of one pool each, with the free devices given.
fn pools(free: &[u32]) -> Vec<PoolRoom> {
    (free.iter().enumerate())
        .map(|(i, f)| PoolRoom {
            pool: PoolKey {
                driver: Arc::from("gpu.nvidia.com"),
                pool: Arc::from(format!("node-{i}").as_str()),
            },
            node: Some(Arc::from(format!("node-{i}").as_str())),
            free: *f,
            shared: false,
        })
        .collect()
}

fn shares(teams: Vec<TeamShare>) -> PoolShares {
    PoolShares {
        teams,
        ..PoolShares::default()
    }
}

#[test]
fn an_eight_device_claim_fits_no_node_when_every_node_has_one_free() {
    // 4 nodes of 8: the borrower's 28 one-device Pods leave one free device on each; the owner
    // (guarantee 8, nothing allocated) waits for one claim of 8.
    let pool = shares(vec![share("borrower", 0, 28, 0), share("owner", 8, 0, 8)]);
    let placement = place("p", &pool, &pools(&[1, 1, 1, 1]), |t| {
        if t == "owner" { vec![8] } else { vec![] }
    })
    .expect("the claim fits nowhere");
    assert_eq!(
        placement.unplaced,
        BTreeMap::from([("owner".into(), vec![8])])
    );
    assert_eq!(placement.free.values().sum::<u32>(), 4);
    assert_eq!(placement.nodes.len(), 4);
    // The engine, counting, orders nothing (4 free, 8 needed would be 4; here it is left out):
    // placement asks the borrower for the claim's 8 devices.
    let orders = orders("p", &pool, Some(&placement));
    assert_eq!(
        orders,
        [ReclaimOrder {
            sharing_policy: "p".into(),
            borrower: "borrower".into(),
            devices: 8,
            for_team: "owner".into(),
        }]
    );
}

#[test]
fn claims_that_fit_a_node_need_no_placement() {
    let pool = shares(vec![share("borrower", 0, 24, 0), share("owner", 8, 0, 8)]);
    // One node has 8 free: the claim fits.
    assert_eq!(place("p", &pool, &pools(&[8, 0, 0, 0]), |_| vec![8]), None);
    // Two claims of 4 fit two nodes of 4 each.
    assert_eq!(
        place("p", &pool, &pools(&[4, 4, 0, 0]), |_| vec![4, 4]),
        None
    );
    // Devices without a node: counting is all there is.
    let mut anywhere = pools(&[1, 1, 1, 1, 1, 1, 1, 1]);
    anywhere.iter_mut().for_each(|p| p.node = None);
    assert_eq!(place("p", &pool, &anywhere, |_| vec![8]), None);
}

#[test]
fn only_claims_within_the_guarantee_count_and_the_largest_go_first() {
    // Guarantee 8, 2 allocated: room for 6. Waiting: 8 (beyond the guarantee), 4, 2, 1.
    let pool = shares(vec![share("borrower", 0, 20, 0), share("owner", 8, 2, 15)]);
    let placement =
        place("p", &pool, &pools(&[3, 2, 0]), |_| vec![8, 4, 2, 1]).expect("the 4 fits nowhere");
    // 4 and 2 are within the room (1 would exceed it); the 2 goes to the node with 2 free.
    assert_eq!(placement.unplaced["owner"], [4]);
    assert_eq!(
        placement.free.values().copied().collect::<Vec<_>>(),
        [3, 0, 0]
    );
}

#[test]
fn placement_adds_to_what_the_engine_orders_and_never_below_a_guarantee() {
    // The engine orders 2 from a; the owner's two claims of 8 fit nowhere: 14 more are asked,
    // a first (furthest above its guarantee), then b, each at most what it holds above it.
    let mut pool = shares(vec![
        share("a", 4, 14, 0),
        share("b", 4, 12, 0),
        share("owner", 16, 0, 16),
    ]);
    pool.reclaims = vec![Reclaim {
        borrower: "a".into(),
        devices: 2,
        for_team: "owner".into(),
    }];
    let placement = place("p", &pool, &pools(&[2, 0, 0]), |t| {
        if t == "owner" { vec![8, 8] } else { vec![] }
    });
    let found: Vec<(String, u32)> = orders("p", &pool, placement.as_ref())
        .into_iter()
        .map(|o| (o.borrower, o.devices))
        .collect();
    assert_eq!(found, [("a".into(), 10), ("b".into(), 6)]);
}

#[test]
fn a_team_below_its_guarantee_whose_next_claim_is_larger_than_what_it_lacks_gets_room_for_it() {
    // Guarantee 8, limit 12, 6 allocated: it lacks 2, and its next Pod asks for 4. Nothing is
    // free. Counting, the engine orders its 2 back, which it cannot use: its claim needs 4
    // devices on one node. Placement asks for the claim's 4.
    let owner = TeamShare {
        limit: 12,
        ..share("owner", 8, 6, 4)
    };
    let mut pool = shares(vec![share("borrower", 4, 8, 0), owner.clone()]);
    pool.reclaims = vec![Reclaim {
        borrower: "borrower".into(),
        devices: 2,
        for_team: "owner".into(),
    }];
    let claims = |t: &str| if t == "owner" { vec![4] } else { vec![] };
    let placement = place("p", &pool, &pools(&[0, 0]), claims).expect("no node has 4 free");
    assert_eq!(placement.unplaced["owner"], [4]);
    let found: Vec<(String, u32)> = orders("p", &pool, Some(&placement))
        .into_iter()
        .map(|o| (o.borrower, o.devices))
        .collect();
    assert_eq!(found, [("borrower".into(), 4)]);
    // With 4 free on one node it fits: nothing more is asked than the engine's count.
    assert_eq!(place("p", &pool, &pools(&[4, 0]), claims), None);
    // Its limit leaves no room beyond the guarantee: the claim is not counted.
    let capped = TeamShare { limit: 8, ..owner };
    let pool = shares(vec![share("borrower", 4, 8, 0), capped]);
    assert_eq!(place("p", &pool, &pools(&[0, 0]), claims), None);
    // Of claims larger than what it lacks, the smallest.
    let pool = shares(vec![
        share("borrower", 4, 8, 0),
        TeamShare {
            limit: 16,
            ..share("owner", 8, 6, 12)
        },
    ]);
    let placement = place("p", &pool, &pools(&[1, 1]), |_| vec![8, 4]).expect("fits nowhere");
    assert_eq!(placement.unplaced["owner"], [4]);
}
