//! Random sequences of assign / assign-ip / release / GC against the real allocator on a SQLite
//! store, compared with a simple model: the same answers, no address ever held twice, and
//! `check` clean at the end.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;

use ipam::IpamError;
use ipam::allocator::{AssignRequest, Ipam, ReleaseRequest};
use ipam::model::IpPool;
use ipam::store::sqlite::{SqliteOptions, SqliteStore};
use proptest::prelude::*;

const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];

#[derive(Debug, Clone)]
enum Action {
    Assign {
        node: usize,
        handle: u8,
        n: u32,
    },
    AssignIp {
        node: usize,
        handle: u8,
        last_octet: u8,
    },
    ReleaseHandle {
        handle: u8,
    },
    ReleaseIp {
        last_octet: u8,
        guard: Option<u8>,
    },
    Gc {
        node: usize,
        live: Vec<u8>,
    },
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        // A handle is one container's: it always belongs to the same node.
        4 => (0..12u8, 1..4u32).prop_map(|(handle, n)| Action::Assign { node: handle as usize % 3, handle, n }),
        1 => (0..12u8, 0..16u8).prop_map(|(handle, last_octet)| Action::AssignIp { node: handle as usize % 3, handle, last_octet }),
        2 => (0..12u8).prop_map(|handle| Action::ReleaseHandle { handle }),
        1 => (0..16u8, proptest::option::of(0..12u8)).prop_map(|(last_octet, guard)| Action::ReleaseIp { last_octet, guard }),
        1 => (0..3usize, proptest::collection::vec(0..12u8, 0..6)).prop_map(|(node, live)| Action::Gc { node, live }),
    ]
}

fn handle(h: u8) -> String {
    format!("net.h{h}")
}

fn addr(last: u8) -> IpAddr {
    format!("10.9.0.{last}").parse().unwrap()
}

/// What the model expects: handle → (node, addresses).
#[derive(Default)]
struct Model {
    held: BTreeMap<String, (String, BTreeSet<IpAddr>)>,
}

impl Model {
    fn used(&self) -> usize {
        self.held.values().map(|(_, a)| a.len()).sum()
    }
    fn holder(&self, a: IpAddr) -> Option<String> {
        self.held
            .iter()
            .find(|(_, (_, s))| s.contains(&a))
            .map(|(h, _)| h.clone())
    }
}

async fn run(actions: Vec<Action>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(
        dir.path().join("s.db"),
        SqliteOptions {
            sync: ipam::store::sqlite::Sync::Normal,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let ipam = Ipam::new(store);
    // 16 addresses in blocks of 4: claims, exhaustion and borrowing all happen.
    let mut pool = IpPool::new("p", "10.9.0.0/28".parse().unwrap());
    pool.block_size = 30;
    ipam.create_pool(&pool).await.unwrap();

    let mut model = Model::default();
    for action in actions {
        match action.clone() {
            Action::Assign { node, handle: h, n } => {
                let req = AssignRequest {
                    handle: handle(h),
                    num_v4: n,
                    node: NODES[node].into(),
                    ..Default::default()
                };
                let result = ipam.auto_assign(&req).await;
                let free = 16 - model.used();
                match result {
                    Ok((v4, v6)) => {
                        prop_assert!(v6.is_empty());
                        prop_assert_eq!(v4.len(), n as usize, "{:?}", action);
                        for a in &v4 {
                            prop_assert!(
                                model.holder(a.address).is_none(),
                                "{} handed out twice ({:?})",
                                a.address,
                                action
                            );
                        }
                        let entry = model
                            .held
                            .entry(handle(h))
                            .or_insert_with(|| (NODES[node].into(), BTreeSet::new()));
                        entry.0 = NODES[node].into();
                        entry.1.extend(v4.iter().map(|a| a.address));
                    }
                    Err(IpamError::Exhausted(_)) => {
                        prop_assert!(
                            free < n as usize,
                            "exhausted with {free} free for {n} ({:?})",
                            action
                        );
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("{action:?}: {e}"))),
                }
            }
            Action::AssignIp {
                node,
                handle: h,
                last_octet,
            } => {
                let a = addr(last_octet);
                let result = ipam
                    .assign_ip(a, &handle(h), &BTreeMap::new(), NODES[node])
                    .await;
                match (result, model.holder(a)) {
                    (Ok(got), None) => {
                        prop_assert_eq!(got.address, a);
                        let entry = model
                            .held
                            .entry(handle(h))
                            .or_insert_with(|| (NODES[node].into(), BTreeSet::new()));
                        entry.0 = NODES[node].into();
                        entry.1.insert(a);
                    }
                    (Err(IpamError::InUse(_)), Some(_)) => {}
                    (r, holder) => {
                        return Err(TestCaseError::fail(format!(
                            "{action:?}: {r:?} while held by {holder:?}"
                        )));
                    }
                }
            }
            Action::ReleaseHandle { handle: h } => {
                let freed: BTreeSet<IpAddr> = ipam
                    .release_by_handle(&handle(h))
                    .await
                    .unwrap()
                    .into_iter()
                    .collect();
                let want = model
                    .held
                    .remove(&handle(h))
                    .map(|(_, s)| s)
                    .unwrap_or_default();
                prop_assert_eq!(freed, want, "{:?}", action);
            }
            Action::ReleaseIp { last_octet, guard } => {
                let a = addr(last_octet);
                let req = ReleaseRequest {
                    address: a,
                    handle: guard.map(handle),
                    seq: None,
                };
                let freed = ipam.release_ips(&[req]).await.unwrap();
                let holder = model.holder(a);
                let should = holder.is_some() && (guard.is_none() || holder == guard.map(handle));
                prop_assert_eq!(freed == vec![a], should, "{:?} holder {:?}", action, holder);
                if should {
                    let h = holder.unwrap();
                    let entry = model.held.get_mut(&h).unwrap();
                    entry.1.remove(&a);
                    if entry.1.is_empty() {
                        model.held.remove(&h);
                    }
                }
            }
            Action::Gc { node, live } => {
                let live: HashSet<String> = live.into_iter().map(handle).collect();
                let released = ipam.gc(NODES[node], &live, "net.", false).await.unwrap();
                let got: BTreeSet<String> = released.into_iter().map(|(h, _)| h).collect();
                let want: BTreeSet<String> = model
                    .held
                    .iter()
                    .filter(|(h, (n, _))| n == NODES[node] && !live.contains(*h))
                    .map(|(h, _)| h.clone())
                    .collect();
                prop_assert_eq!(&got, &want, "{:?}", action);
                for h in want {
                    model.held.remove(&h);
                }
            }
        }
        // The allocator agrees with the model on every handle.
        for (h, (_, want)) in &model.held {
            let got: BTreeSet<IpAddr> = ipam
                .handle_allocations(h)
                .await
                .unwrap()
                .into_iter()
                .map(|a| a.address)
                .collect();
            prop_assert_eq!(&got, want, "handle {} after {:?}", h, action);
        }
    }
    let report = ipam.check().await.unwrap();
    prop_assert!(
        report
            .problems
            .iter()
            .all(|p| p.contains("unfinished claim")),
        "{:?}",
        report.problems
    );
    prop_assert_eq!(report.allocations as usize, model.used());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn the_allocator_matches_the_model(actions in proptest::collection::vec(action(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(run(actions))?;
    }
}
