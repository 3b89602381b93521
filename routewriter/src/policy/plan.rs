//! What to write to make the table as rendered (sans-IO): nothing when it already is; the
//! changed sets' elements, map entries and chains when its frame is intact; the whole table,
//! deleted and written again in the same transaction, when its frame is not (a base chain
//! hooked elsewhere, a map or set of the wrong type). Commands are ordered so that everything
//! a command names exists when it runs, and nothing is deleted while it is still named.

use std::fmt::Write;

use net_types::IpFamily;

use super::FAMILY;
use super::actual::Actual;
use super::render::{BASE_CHAIN, BASE_RULES, FROM_MAP, Rendered, RenderedRule, TO_MAP};
use crate::nft::{addr_type, elements};

/// The nft script that makes `have` into `want`; `None` when they agree.
pub fn plan(table: &str, want: &Rendered, have: Option<&Actual>) -> Option<String> {
    let Some(have) = have else {
        return (!want.is_empty()).then(|| full(table, want, false));
    };
    if want.is_empty() {
        return Some(format!("delete table {FAMILY} {table}\n"));
    }
    if !frame_intact(want, have) {
        return Some(full(table, want, true));
    }
    let s = changes(table, want, have);
    (!s.is_empty()).then_some(s)
}

fn base_comments() -> Vec<String> {
    BASE_RULES.iter().map(|(_, c)| c.to_string()).collect()
}

fn frame_intact(want: &Rendered, have: &Actual) -> bool {
    have.base_ok
        && have.chains.get(BASE_CHAIN) == Some(&base_comments())
        && [FROM_MAP, TO_MAP]
            .iter()
            .all(|m| have.maps.get(*m).is_some_and(|(typed, _)| *typed))
        && want.sets.iter().all(|(name, (f, _))| {
            have.sets
                .get(name)
                .is_none_or(|(have_f, _)| *have_f == Some(*f))
        })
}

fn set_elements(table: &str, name: &str, family: IpFamily, iv: &[crate::nft::Interval]) -> String {
    let e = elements(family, iv);
    if e.is_empty() {
        String::new()
    } else {
        format!(
            "add element {FAMILY} {table} {name} {{ {} }}\n",
            e.join(", ")
        )
    }
}

fn add_rules(s: &mut String, table: &str, chain: &str, rules: &[RenderedRule]) {
    for r in rules {
        let _ = writeln!(s, "add rule {FAMILY} {table} {chain} {}", r.statement());
    }
}

fn map_element(table: &str, map: &str, iface: &str, chain: &str) -> String {
    format!("add element {FAMILY} {table} {map} {{ \"{iface}\" : jump {chain} }}\n")
}

/// The whole table, in dependency order.
fn full(table: &str, want: &Rendered, delete_first: bool) -> String {
    let mut s = String::new();
    if delete_first {
        let _ = writeln!(s, "delete table {FAMILY} {table}");
    }
    let _ = writeln!(s, "add table {FAMILY} {table}");
    let _ = writeln!(
        s,
        "add chain {FAMILY} {table} {BASE_CHAIN} {{ type filter hook forward priority 0; policy accept; }}"
    );
    for chain in want.chains.keys() {
        let _ = writeln!(s, "add chain {FAMILY} {table} {chain}");
    }
    for (name, (family, iv)) in &want.sets {
        let _ = writeln!(
            s,
            "add set {FAMILY} {table} {name} {{ type {}; flags interval; }}",
            addr_type(*family)
        );
        s.push_str(&set_elements(table, name, *family, iv));
    }
    for (map, entries) in [(FROM_MAP, &want.from_map), (TO_MAP, &want.to_map)] {
        let _ = writeln!(
            s,
            "add map {FAMILY} {table} {map} {{ type ifname : verdict; }}"
        );
        for (iface, chain) in entries {
            s.push_str(&map_element(table, map, iface, chain));
        }
    }
    let base: Vec<RenderedRule> = BASE_RULES
        .iter()
        .map(|(t, c)| RenderedRule {
            text: t.to_string(),
            comment: c.to_string(),
        })
        .collect();
    add_rules(&mut s, table, BASE_CHAIN, &base);
    for (chain, rules) in &want.chains {
        add_rules(&mut s, table, chain, rules);
    }
    s
}

/// Only what differs, the frame being intact.
fn changes(table: &str, want: &Rendered, have: &Actual) -> String {
    let mut s = String::new();
    // 1. Sets first: rules about to be written may name new ones.
    for (name, (family, iv)) in &want.sets {
        match have.sets.get(name) {
            None => {
                let _ = writeln!(
                    s,
                    "add set {FAMILY} {table} {name} {{ type {}; flags interval; }}",
                    addr_type(*family)
                );
                s.push_str(&set_elements(table, name, *family, iv));
            }
            Some((_, have_iv)) if have_iv != iv => {
                let _ = writeln!(s, "flush set {FAMILY} {table} {name}");
                s.push_str(&set_elements(table, name, *family, iv));
            }
            Some(_) => {}
        }
    }
    // 2. Map entries that go or change, before their chains do.
    let maps = [(FROM_MAP, &want.from_map), (TO_MAP, &want.to_map)];
    for (map, entries) in maps {
        let empty = Default::default();
        let have_entries = have.maps.get(map).map_or(&empty, |(_, e)| e);
        for (iface, chain) in have_entries {
            if entries.get(iface) != Some(chain) {
                let _ = writeln!(s, "delete element {FAMILY} {table} {map} {{ \"{iface}\" }}");
            }
        }
    }
    // 3. New and changed chains.
    for (chain, rules) in &want.chains {
        let comments: Vec<String> = rules.iter().map(|r| r.comment.clone()).collect();
        match have.chains.get(chain) {
            None => {
                let _ = writeln!(s, "add chain {FAMILY} {table} {chain}");
            }
            Some(c) if *c == comments => continue,
            Some(_) => {
                let _ = writeln!(s, "flush chain {FAMILY} {table} {chain}");
            }
        }
        add_rules(&mut s, table, chain, rules);
    }
    // 4. Map entries that come, now that their chains exist.
    for (map, entries) in maps {
        let empty = Default::default();
        let have_entries = have.maps.get(map).map_or(&empty, |(_, e)| e);
        for (iface, chain) in entries {
            if have_entries.get(iface) != Some(chain) {
                s.push_str(&map_element(table, map, iface, chain));
            }
        }
    }
    // 5. Chains no longer wanted: all emptied first (one may jump to another), then
    // deleted; then the sets and maps no rule names any more.
    let gone: Vec<&String> = have
        .chains
        .keys()
        .filter(|c| *c != BASE_CHAIN && !want.chains.contains_key(*c))
        .collect();
    for chain in &gone {
        let _ = writeln!(s, "flush chain {FAMILY} {table} {chain}");
    }
    for chain in &gone {
        let _ = writeln!(s, "delete chain {FAMILY} {table} {chain}");
    }
    for name in have.sets.keys() {
        if !want.sets.contains_key(name) {
            let _ = writeln!(s, "delete set {FAMILY} {table} {name}");
        }
    }
    for name in have.maps.keys() {
        if name != FROM_MAP && name != TO_MAP {
            let _ = writeln!(s, "delete map {FAMILY} {table} {name}");
        }
    }
    s
}

impl Actual {
    /// The table as the reader would see it right after `r` was written: what routewriter
    /// plans against between read-backs (reading a big table back costs more than the write).
    pub fn as_written(r: &Rendered) -> Actual {
        let mut a = Actual {
            base_ok: true,
            ..Default::default()
        };
        a.chains.insert(BASE_CHAIN.into(), base_comments());
        for (c, rules) in &r.chains {
            a.chains
                .insert(c.clone(), rules.iter().map(|r| r.comment.clone()).collect());
        }
        for (n, (f, iv)) in &r.sets {
            a.sets.insert(n.clone(), (Some(*f), iv.clone()));
        }
        a.maps.insert(FROM_MAP.into(), (true, r.from_map.clone()));
        a.maps.insert(TO_MAP.into(), (true, r.to_map.clone()));
        a
    }
}

#[cfg(test)]
mod tests {
    use super::super::render::Rendered;
    use super::super::{Action, EndpointRules, PolicyState, RuleSpec};
    use super::*;

    fn allow_from(set: &str) -> RuleSpec {
        RuleSpec {
            action: Action::Allow,
            protocol: Some(6),
            not_protocol: None,
            src_set: Some(set.into()),
            not_src_set: None,
            dst_set: None,
            not_dst_set: None,
            src_ports: vec![],
            not_src_ports: vec![],
            dst_ports: vec![(80, 80)],
            not_dst_ports: vec![],
            icmp_type: None,
            icmp_code: None,
            not_icmp_type: None,
            not_icmp_code: None,
            family: None,
            origin: "knp/ns/web ingress[0]".into(),
        }
    }

    fn state(ifaces: &[&str], members: &[&str]) -> PolicyState {
        let mut s = PolicyState::default();
        for i in ifaces {
            s.upsert_endpoint(
                i.to_string(),
                EndpointRules {
                    ingress: Some(vec![allow_from("p-web")]),
                    egress: None,
                },
            );
        }
        let set = proto::v1::PolicySet {
            name: "p-web".into(),
            members: members.iter().map(|m| m.to_string()).collect(),
        };
        let (n, m) = super::super::parse_set(&set).unwrap();
        s.upsert_set(n, m);
        s
    }

    #[test]
    fn nothing_is_written_when_the_table_is_as_rendered() {
        let want = Rendered::of(&state(&["cali1", "cali2"], &["10.0.0.1"]));
        assert!(plan("t", &want, Some(&Actual::as_written(&want))).is_none());
        assert!(plan("t", &Rendered::default(), None).is_none());
    }

    #[test]
    fn a_new_table_is_written_in_dependency_order() {
        let want = Rendered::of(&state(&["cali1"], &["10.0.0.1"]));
        let s = plan("t", &want, None).unwrap();
        let at = |needle: &str| s.find(needle).unwrap_or_else(|| panic!("{needle} in {s}"));
        assert!(at("add table inet t") < at("add chain inet t ingress-cali1"));
        assert!(at("add chain inet t ingress-cali1") < at("\"cali1\" : jump ingress-cali1"));
        assert!(at("add set inet t p-web-v4") < at("add rule inet t ingress-cali1"));
        assert!(s.contains("add element inet t p-web-v4 { 10.0.0.1/32 }"));
        assert!(!s.contains("delete"));
    }

    #[test]
    fn a_pod_elsewhere_changes_only_set_elements() {
        let before = Rendered::of(&state(&["cali1"], &["10.0.0.1"]));
        let after = Rendered::of(&state(&["cali1"], &["10.0.0.1", "10.0.1.7"]));
        let s = plan("t", &after, Some(&Actual::as_written(&before))).unwrap();
        assert_eq!(
            s,
            "flush set inet t p-web-v4\nadd element inet t p-web-v4 { 10.0.0.1/32, 10.0.1.7/32 }\n"
        );
    }

    #[test]
    fn an_endpoint_that_goes_loses_its_map_entry_before_its_chain() {
        let before = Rendered::of(&state(&["cali1", "cali2"], &[]));
        let after = Rendered::of(&state(&["cali1"], &[]));
        let s = plan("t", &after, Some(&Actual::as_written(&before))).unwrap();
        let del_elem = s
            .find("delete element inet t to-endpoint { \"cali2\" }")
            .unwrap();
        let del_chain = s.find("delete chain inet t ingress-cali2").unwrap();
        assert!(del_elem < del_chain, "{s}");
        assert!(!s.contains("cali1"), "{s}");
    }

    #[test]
    fn a_drifted_chain_is_rewritten_and_a_broken_frame_rewrites_all() {
        let want = Rendered::of(&state(&["cali1"], &[]));
        let mut have = Actual::as_written(&want);
        // Someone deleted a rule.
        have.chains.get_mut("ingress-cali1").unwrap().remove(1);
        let s = plan("t", &want, Some(&have)).unwrap();
        assert!(s.starts_with("flush chain inet t ingress-cali1\n"), "{s}");
        // Someone hooked the base chain elsewhere.
        let mut have = Actual::as_written(&want);
        have.base_ok = false;
        let s = plan("t", &want, Some(&have)).unwrap();
        assert!(
            s.starts_with("delete table inet t\nadd table inet t\n"),
            "{s}"
        );
        // Nothing wanted: the table goes.
        assert_eq!(
            plan("t", &Rendered::default(), Some(&have)).unwrap(),
            "delete table inet t\n"
        );
    }
}
