//! The policy state as the nft table that enforces it (sans-IO). Everything rendered is
//! deterministic, so the same state gives the same table, and a restarted routewriter finds
//! nothing to write.
//!
//! Verdicts: in an egress chain (`egress-<if>`) an allowed packet `return`s to the base chain,
//! which goes on to the destination's ingress map (a packet between two pods of this node
//! passes both); in an ingress chain (`ingress-<if>`) it is accepted. Deny drops; Log logs and
//! goes on; Pass ends the policies as an allow (one tier: what follows is the namespace's
//! profile, which allows). A selected direction ends in a drop.

use std::collections::BTreeMap;
use std::fmt::Write;

use net_types::IpFamily;

use super::{Action, EndpointRules, PolicyState, Ports, RuleSpec, SetMembers};
use crate::nft::Interval;

pub const BASE_CHAIN: &str = "forward";
pub const FROM_MAP: &str = "from-endpoint";
pub const TO_MAP: &str = "to-endpoint";

/// The base chain's rules (text, comment), in order.
pub const BASE_RULES: [(&str, &str); 3] = [
    (
        "ct state established,related accept",
        "margay: established and related",
    ),
    ("iifname vmap @from-endpoint", "margay: egress of pods"),
    ("oifname vmap @to-endpoint", "margay: ingress of pods"),
];

/// The first rule of every endpoint chain and the last.
pub const INVALID_RULE: (&str, &str) = ("ct state invalid drop", "margay: invalid");
pub const DEFAULT_DENY: (&str, &str) = ("drop", "margay: default deny");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    pub fn chain(self, interface: &str) -> String {
        match self {
            Direction::Ingress => format!("ingress-{interface}"),
            Direction::Egress => format!("egress-{interface}"),
        }
    }
}

/// One rule as written: its text and the comment that identifies it when read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedRule {
    pub text: String,
    pub comment: String,
}

impl RenderedRule {
    fn fixed((text, comment): (&str, &str)) -> Self {
        RenderedRule {
            text: text.to_owned(),
            comment: comment.to_owned(),
        }
    }

    /// The rule with a comment naming its origin and a hash of its text: a rule changed in
    /// the kernel under the same origin reads back with another comment.
    fn of(text: String, origin: &str) -> Self {
        let comment = clean(&format!("{:08x} {origin}", fnv1a(text.as_bytes())), 120);
        RenderedRule { text, comment }
    }

    /// The rule as an nft statement.
    pub fn statement(&self) -> String {
        format!("{} comment \"{}\"", self.text, self.comment)
    }
}

/// The whole table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rendered {
    /// nft set name (`<set>-v4`, `<set>-v6`) → family and elements.
    pub sets: BTreeMap<String, (IpFamily, Vec<Interval>)>,
    /// Endpoint chains by name.
    pub chains: BTreeMap<String, Vec<RenderedRule>>,
    /// Interface → chain, for `from-endpoint` (egress) and `to-endpoint` (ingress).
    pub from_map: BTreeMap<String, String>,
    pub to_map: BTreeMap<String, String>,
}

/// FNV-1a, 32 bits: a short, stable fingerprint of a rule's text (not a security boundary;
/// a collision would only hide a hand edit of one rule from the drift check).
fn fnv1a(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// Text safe inside an nft quoted string, at most `max` bytes.
fn clean(s: &str, max: usize) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .take(max)
        .collect()
}

pub fn set_name(set: &str, family: IpFamily) -> String {
    match family {
        IpFamily::V4 => format!("{set}-v4"),
        IpFamily::V6 => format!("{set}-v6"),
    }
}

fn protocol_name(p: u8) -> String {
    match p {
        1 => "icmp".into(),
        6 => "tcp".into(),
        17 => "udp".into(),
        58 => "ipv6-icmp".into(),
        132 => "sctp".into(),
        n => n.to_string(),
    }
}

fn port_list(p: &[Ports]) -> String {
    let one = |&(a, b): &Ports| {
        if a == b {
            a.to_string()
        } else {
            format!("{a}-{b}")
        }
    };
    if p.len() == 1 {
        one(&p[0])
    } else {
        format!("{{ {} }}", p.iter().map(one).collect::<Vec<_>>().join(", "))
    }
}

/// The families a rule must be written for: `None` for one family-agnostic rule.
fn families(r: &RuleSpec) -> Vec<Option<IpFamily>> {
    let by_protocol = match r.protocol {
        Some(1) => Some(IpFamily::V4),
        Some(58) => Some(IpFamily::V6),
        _ => None,
    };
    match (by_protocol, r.family) {
        (Some(a), Some(b)) if a != b => vec![],
        (Some(f), _) | (None, Some(f)) => vec![Some(f)],
        _ if r.sets().next().is_some() => vec![Some(IpFamily::V4), Some(IpFamily::V6)],
        _ => vec![None],
    }
}

/// The nft text of one rule for one family (without its comment).
fn rule_text(r: &RuleSpec, family: Option<IpFamily>, dir: Direction) -> String {
    let mut t = String::new();
    if let Some(p) = r.protocol {
        let _ = write!(t, "meta l4proto {} ", protocol_name(p));
    }
    if let Some(p) = r.not_protocol {
        let _ = write!(t, "meta l4proto != {} ", protocol_name(p));
    }
    if let Some(f) = family
        && r.sets().next().is_none()
        && r.protocol.is_none()
    {
        // An ipVersion alone: the family is the match.
        let nfproto = match f {
            IpFamily::V4 => "ipv4",
            IpFamily::V6 => "ipv6",
        };
        let _ = write!(t, "meta nfproto {nfproto} ");
    }
    if let Some(f) = family {
        let ip = match f {
            IpFamily::V4 => "ip",
            IpFamily::V6 => "ip6",
        };
        for (field, set, op) in [
            ("saddr", &r.src_set, ""),
            ("saddr", &r.not_src_set, "!= "),
            ("daddr", &r.dst_set, ""),
            ("daddr", &r.not_dst_set, "!= "),
        ] {
            if let Some(s) = set {
                let _ = write!(t, "{ip} {field} {op}@{} ", set_name(s, f));
            }
        }
    }
    let has_ports = !(r.src_ports.is_empty()
        && r.not_src_ports.is_empty()
        && r.dst_ports.is_empty()
        && r.not_dst_ports.is_empty());
    if has_ports && !matches!(r.protocol, Some(6 | 17 | 132)) {
        // Ports mean a transport header: only where there is one.
        t.push_str("meta l4proto { tcp, udp, sctp } ");
    }
    for (field, p, op) in [
        ("sport", &r.src_ports, ""),
        ("sport", &r.not_src_ports, "!= "),
        ("dport", &r.dst_ports, ""),
        ("dport", &r.not_dst_ports, "!= "),
    ] {
        if !p.is_empty() {
            let _ = write!(t, "th {field} {op}{} ", port_list(p));
        }
    }
    let icmp = match r.protocol {
        Some(1) => Some("icmp"),
        Some(58) => Some("icmpv6"),
        _ => None,
    };
    if let Some(icmp) = icmp {
        if let Some(ty) = r.icmp_type {
            let _ = write!(t, "{icmp} type {ty} ");
        }
        if let Some(code) = r.icmp_code {
            let _ = write!(t, "{icmp} code {code} ");
        }
        match (r.not_icmp_type, r.not_icmp_code) {
            (Some(ty), None) => {
                let _ = write!(t, "{icmp} type != {ty} ");
            }
            (Some(ty), Some(code)) => {
                let _ = write!(t, "{icmp} type . {icmp} code != {{ {ty} . {code} }} ");
            }
            _ => {}
        }
    }
    match (r.action, dir) {
        (Action::Allow | Action::Pass, Direction::Ingress) => t.push_str("accept"),
        (Action::Allow | Action::Pass, Direction::Egress) => t.push_str("return"),
        (Action::Deny, _) => t.push_str("drop"),
        (Action::Log, _) => {
            let _ = write!(t, "log prefix \"{}: \"", clean(&r.origin, 100));
        }
    }
    t
}

fn chain_rules(rules: &[RuleSpec], dir: Direction) -> Vec<RenderedRule> {
    let mut out = vec![RenderedRule::fixed(INVALID_RULE)];
    for r in rules {
        for f in families(r) {
            out.push(RenderedRule::of(rule_text(r, f, dir), &r.origin));
        }
    }
    out.push(RenderedRule::fixed(DEFAULT_DENY));
    out
}

impl Rendered {
    pub fn of(state: &PolicyState) -> Rendered {
        let mut r = Rendered::default();
        let mut named: Vec<&str> = Vec::new();
        for (iface, EndpointRules { ingress, egress }) in &state.endpoints {
            for (dir, rules, map) in [
                (Direction::Ingress, ingress, &mut r.to_map),
                (Direction::Egress, egress, &mut r.from_map),
            ] {
                let Some(rules) = rules else { continue };
                let chain = dir.chain(iface);
                map.insert(iface.clone(), chain.clone());
                r.chains.insert(chain, chain_rules(rules, dir));
                named.extend(rules.iter().flat_map(RuleSpec::sets));
            }
        }
        let empty: SetMembers = Default::default();
        // Every set a rule names exists (empty if the stream has not sent it), or nft would
        // refuse the whole table.
        let sets = state
            .sets
            .iter()
            .map(|(n, m)| (n.as_str(), m))
            .chain(named.into_iter().map(|n| (n, &empty)));
        for (name, members) in sets {
            for f in IpFamily::ALL {
                r.sets
                    .entry(set_name(name, f))
                    .or_insert_with(|| (f, members[f.index()].clone()));
            }
        }
        r
    }

    pub fn is_empty(&self) -> bool {
        self.sets.is_empty() && self.chains.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn rule(action: Action) -> RuleSpec {
        RuleSpec {
            action,
            protocol: None,
            not_protocol: None,
            src_set: None,
            not_src_set: None,
            dst_set: None,
            not_dst_set: None,
            src_ports: vec![],
            not_src_ports: vec![],
            dst_ports: vec![],
            not_dst_ports: vec![],
            icmp_type: None,
            icmp_code: None,
            not_icmp_type: None,
            not_icmp_code: None,
            family: None,
            origin: "knp/ns1/p ingress[0]".into(),
        }
    }

    #[test]
    fn rules_render_per_family_with_sets_and_ports() {
        let mut r = rule(Action::Allow);
        r.protocol = Some(6);
        r.src_set = Some("p-1".into());
        r.dst_ports = vec![(80, 80), (8000, 8080)];
        let v4 = rule_text(&r, Some(IpFamily::V4), Direction::Ingress);
        assert_eq!(
            v4,
            "meta l4proto tcp ip saddr @p-1-v4 th dport { 80, 8000-8080 } accept"
        );
        assert_eq!(families(&r), vec![Some(IpFamily::V4), Some(IpFamily::V6)]);
        assert_eq!(
            rule_text(&r, Some(IpFamily::V6), Direction::Egress),
            "meta l4proto tcp ip6 saddr @p-1-v6 th dport { 80, 8000-8080 } return"
        );
        let mut d = rule(Action::Deny);
        d.not_dst_set = Some("p-2".into());
        d.not_dst_ports = vec![(53, 53)];
        assert_eq!(
            rule_text(&d, Some(IpFamily::V4), Direction::Egress),
            "ip daddr != @p-2-v4 meta l4proto { tcp, udp, sctp } th dport != 53 drop"
        );
        let mut ping = rule(Action::Allow);
        ping.protocol = Some(1);
        ping.icmp_type = Some(8);
        ping.src_set = Some("p-3".into());
        assert_eq!(families(&ping), vec![Some(IpFamily::V4)]);
        assert_eq!(
            rule_text(&ping, Some(IpFamily::V4), Direction::Ingress),
            "meta l4proto icmp ip saddr @p-3-v4 icmp type 8 accept"
        );
        let mut not_echo = ping.clone();
        not_echo.icmp_type = None;
        not_echo.not_icmp_type = Some(8);
        not_echo.not_icmp_code = Some(0);
        assert_eq!(
            rule_text(&not_echo, Some(IpFamily::V4), Direction::Ingress),
            "meta l4proto icmp ip saddr @p-3-v4 icmp type . icmp code != { 8 . 0 } accept"
        );
        let mut v6_only = rule(Action::Deny);
        v6_only.family = Some(IpFamily::V6);
        assert_eq!(families(&v6_only), vec![Some(IpFamily::V6)]);
        assert_eq!(
            rule_text(&v6_only, Some(IpFamily::V6), Direction::Egress),
            "meta nfproto ipv6 drop"
        );
        v6_only.protocol = Some(1);
        assert!(
            families(&v6_only).is_empty(),
            "ICMPv4 in IPv6 never matches"
        );
        let all = rule(Action::Log);
        assert_eq!(families(&all), vec![None]);
        assert_eq!(
            rule_text(&all, None, Direction::Ingress),
            "log prefix \"knp/ns1/p ingress[0]: \""
        );
    }

    #[test]
    fn a_table_has_chains_only_for_selected_directions_and_every_named_set() {
        let mut state = PolicyState::default();
        let mut r = rule(Action::Allow);
        r.src_set = Some("p-a".into());
        state.upsert_endpoint(
            "cali1".into(),
            EndpointRules {
                ingress: Some(vec![r]),
                egress: None,
            },
        );
        state.upsert_endpoint(
            "cali2".into(),
            EndpointRules {
                ingress: None,
                egress: Some(vec![]),
            },
        );
        let t = Rendered::of(&state);
        assert_eq!(
            t.chains.keys().collect::<Vec<_>>(),
            vec!["egress-cali2", "ingress-cali1"]
        );
        assert_eq!(t.to_map.get("cali1").unwrap(), "ingress-cali1");
        assert_eq!(t.from_map.get("cali2").unwrap(), "egress-cali2");
        assert!(!t.to_map.contains_key("cali2"));
        // The set the stream never sent exists, empty, in both families.
        assert_eq!(t.sets.get("p-a-v4"), Some(&(IpFamily::V4, vec![])));
        assert_eq!(t.sets.get("p-a-v6"), Some(&(IpFamily::V6, vec![])));
        // Egress with no rules: only the invalid drop and the default deny.
        let e = &t.chains["egress-cali2"];
        assert_eq!(e.len(), 2);
        assert_eq!(e[1].text, "drop");
        let i = &t.chains["ingress-cali1"];
        assert_eq!(i.len(), 4);
        assert!(i[1].comment.ends_with("knp/ns1/p ingress[0]"));
        assert_ne!(i[1].comment, i[2].comment, "the two families' rules differ");
        assert_eq!(Rendered::of(&state), t, "deterministic");
    }
}
