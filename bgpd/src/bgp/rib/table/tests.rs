//! PrefixTable against `HashMap` as the model: any sequence of inserts and removals leaves
//! both with the same entries, through growth, wrap-around and shifting back.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use bgp_wire::Ipv4Prefix;
use proptest::prelude::*;

use super::PrefixTable;

fn pfx(a: u32, len: u8) -> Ipv4Prefix {
    Ipv4Prefix::new(Ipv4Addr::from(a), len).unwrap()
}

/// Asserts the table holds exactly what the model does, by lookup and by iteration.
fn assert_same(t: &PrefixTable<Ipv4Prefix, u32>, model: &HashMap<Ipv4Prefix, u32>) {
    assert_eq!(t.len(), model.len());
    assert_eq!(t.iter().len(), model.len());
    for (k, v) in model {
        assert_eq!(t.get(k), Some(v), "{k}");
    }
    let mut listed: Vec<(Ipv4Prefix, u32)> = t.iter().map(|(k, v)| (*k, *v)).collect();
    listed.sort_unstable();
    let mut want: Vec<(Ipv4Prefix, u32)> = model.iter().map(|(k, v)| (*k, *v)).collect();
    want.sort_unstable();
    assert_eq!(listed, want);
}

#[derive(Debug, Clone)]
enum Op {
    Insert(Ipv4Prefix, u32),
    Remove(Ipv4Prefix),
}

/// Keys from a small space (so removals hit and probes collide), the default route among them.
fn key() -> impl Strategy<Value = Ipv4Prefix> {
    (0u32..96, prop_oneof![Just(0u8), Just(24u8), Just(32u8)]).prop_map(|(n, len)| pfx(n << 8, len))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (key(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
        2 => key().prop_map(Op::Remove),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn behaves_like_a_hash_map(ops in proptest::collection::vec(op(), 0..400)) {
        let mut t = PrefixTable::default();
        let mut model = HashMap::new();
        for op in ops {
            match op {
                Op::Insert(k, v) => prop_assert_eq!(t.insert(k, v), model.insert(k, v)),
                Op::Remove(k) => prop_assert_eq!(t.remove(&k), model.remove(&k)),
            }
            prop_assert_eq!(t.len(), model.len());
        }
        assert_same(&t, &model);
        for k in (0u32..96).map(|n| pfx(n << 8, 24)) {
            prop_assert_eq!(t.contains_key(&k), model.contains_key(&k));
        }
    }
}

#[test]
fn the_default_route_is_a_key_like_any_other() {
    let mut t = PrefixTable::default();
    let d = Ipv4Prefix::default();
    assert_eq!(d, pfx(0, 0));
    assert_eq!(t.get(&d), None);
    assert_eq!(t.insert(d, 7u32), None);
    assert_eq!(t.insert(pfx(0x0a00_0000, 8), 8), None);
    assert_eq!(t.insert(d, 9), Some(7));
    assert_eq!(t.len(), 2);
    assert_eq!(t.keys().filter(|k| **k == d).count(), 1);
    assert_eq!(t.remove(&d), Some(9));
    assert_eq!(t.get(&d), None);
    assert_eq!(t.len(), 1);
}

#[test]
fn many_keys_survive_growth_and_half_of_them_removal() {
    let mut t = PrefixTable::default();
    let mut model = HashMap::new();
    for n in 0..300_000u32 {
        let k = pfx(n << 8, 24);
        assert_eq!(t.insert(k, n), None);
        model.insert(k, n);
    }
    // Never more than 7/8 full, never more than twice what that needs.
    assert!(t.slots.len() * 7 >= t.len() * 8 && t.slots.len() * 7 / 2 < t.len() * 8);
    for n in (0..300_000u32).step_by(2) {
        let k = pfx(n << 8, 24);
        assert_eq!(t.remove(&k), Some(n));
        model.remove(&k);
    }
    let keys: Vec<Ipv4Prefix> = model.keys().copied().take(100).collect();
    for i in 0..keys.len() {
        t.prefetch_for(&keys, i);
    }
    assert_same(&t, &model);
}
