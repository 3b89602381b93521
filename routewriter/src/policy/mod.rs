//! Network policy in nftables: what bgpd compiled for this node's pod interfaces
//! (`EndpointPolicy` and `PolicySet` items of the Dataplane stream) held here, checked, and
//! enforced in one table of routewriter's own, `table inet margay-policy`. routewriter decides
//! no policy: which rules an interface gets is bgpd's (`policy` crate) work; this module only
//! renders them and keeps the table as rendered.
//!
//! The table (`render`): one forward base chain that passes established and related traffic
//! (return traffic of allowed flows) and dispatches through two verdict maps keyed by
//! interface name — `from-endpoint` (a pod's egress: the packet came in on its interface) and
//! `to-endpoint` (a pod's ingress) — to one chain per selected interface and direction. Peers
//! are matched through named interval sets (`<set>-v4`, `<set>-v6`), so a rule's cost does not
//! grow with the pods or policies it names, and a pod starting elsewhere changes set elements,
//! never rules. An interface no policy selects in a direction has no chain there: all passes.
//!
//! Reading back (`actual`) and planning (`plan`) are pure: each rule carries a comment with a
//! hash of its text, so the table is compared chain by chain, element by element, and only what
//! differs is written, in one atomic nft transaction. A change from the stream is planned
//! against routewriter's last write; the kernel's table is read back on a full sync (start, the
//! periodic resync) to find drift, and after a refused write. A refused transaction leaves the
//! previous ruleset in force. Nothing outside this table is touched.

pub mod actual;
pub mod plan;
pub mod render;

use std::collections::BTreeMap;
use std::path::Path;

use ipnet::IpNet;
use net_types::IpFamily;
use proto::v1 as pb;

use super::nft::{Interval, NftError, NftRunner, Tables, interval_of, merge};

/// The table's family and default name.
pub const FAMILY: &str = "inet";
pub const DEFAULT_TABLE: &str = "margay-policy";

/// A rule's action, as the contract gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Allow,
    Deny,
    Log,
    Pass,
}

/// A port range, inclusive.
pub type Ports = (u16, u16);

/// One checked rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSpec {
    pub action: Action,
    pub protocol: Option<u8>,
    pub not_protocol: Option<u8>,
    pub src_set: Option<String>,
    pub not_src_set: Option<String>,
    pub dst_set: Option<String>,
    pub not_dst_set: Option<String>,
    pub src_ports: Vec<Ports>,
    pub not_src_ports: Vec<Ports>,
    pub dst_ports: Vec<Ports>,
    pub not_dst_ports: Vec<Ports>,
    pub icmp_type: Option<u8>,
    pub icmp_code: Option<u8>,
    pub not_icmp_type: Option<u8>,
    pub not_icmp_code: Option<u8>,
    /// Only packets of this family.
    pub family: Option<IpFamily>,
    pub origin: String,
}

impl RuleSpec {
    /// The sets the rule names.
    pub fn sets(&self) -> impl Iterator<Item = &str> {
        [
            &self.src_set,
            &self.not_src_set,
            &self.dst_set,
            &self.not_dst_set,
        ]
        .into_iter()
        .filter_map(|s| s.as_deref())
    }
}

/// One pod interface's rules; `None`: no policy selects it in that direction.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EndpointRules {
    pub ingress: Option<Vec<RuleSpec>>,
    pub egress: Option<Vec<RuleSpec>>,
}

/// A set's members, per family ([`IpFamily::index`]), merged.
pub type SetMembers = [Vec<Interval>; 2];

/// What the stream asks of the policy table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PolicyState {
    pub endpoints: BTreeMap<String, EndpointRules>,
    pub sets: BTreeMap<String, SetMembers>,
}

/// A name nft takes as a set or chain name without quoting (and our suffixes fit).
fn plain_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 200
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A Linux interface name routewriter can put in a map and a chain name.
pub(crate) fn interface_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= super::config::IFNAMSIZ_MAX
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

fn byte(what: &str, v: Option<u32>) -> Result<Option<u8>, String> {
    v.map(|n| u8::try_from(n).map_err(|_| format!("{what} {n} is above 255")))
        .transpose()
}

fn ports(what: &str, v: &[pb::PortRange]) -> Result<Vec<Ports>, String> {
    v.iter()
        .map(|r| {
            let first =
                u16::try_from(r.first).map_err(|_| format!("{what} {} > 65535", r.first))?;
            let last = u16::try_from(r.last).map_err(|_| format!("{what} {} > 65535", r.last))?;
            if first > last {
                return Err(format!("{what} {first}-{last} is backwards"));
            }
            Ok((first, last))
        })
        .collect()
}

fn set_ref(what: &str, s: &str) -> Result<Option<String>, String> {
    if s.is_empty() {
        return Ok(None);
    }
    if !plain_name(s) {
        return Err(format!(
            "{what} {s:?} is not a set name (letters, digits, '-', '_')"
        ));
    }
    Ok(Some(s.to_owned()))
}

fn parse_rule(r: &pb::PolicyRule) -> Result<RuleSpec, String> {
    let action = match pb::PolicyAction::try_from(r.action) {
        Ok(pb::PolicyAction::Allow) => Action::Allow,
        Ok(pb::PolicyAction::Deny) => Action::Deny,
        Ok(pb::PolicyAction::Log) => Action::Log,
        Ok(pb::PolicyAction::Pass) => Action::Pass,
        _ => return Err(format!("rule {:?}: unknown action {}", r.origin, r.action)),
    };
    let e = |m: String| format!("rule {:?}: {m}", r.origin);
    Ok(RuleSpec {
        action,
        protocol: byte("protocol", r.protocol).map_err(e)?,
        not_protocol: byte("not protocol", r.not_protocol).map_err(e)?,
        src_set: set_ref("source set", &r.src_set).map_err(e)?,
        not_src_set: set_ref("source set", &r.not_src_set).map_err(e)?,
        dst_set: set_ref("destination set", &r.dst_set).map_err(e)?,
        not_dst_set: set_ref("destination set", &r.not_dst_set).map_err(e)?,
        src_ports: ports("source port", &r.src_ports).map_err(e)?,
        not_src_ports: ports("source port", &r.not_src_ports).map_err(e)?,
        dst_ports: ports("destination port", &r.dst_ports).map_err(e)?,
        not_dst_ports: ports("destination port", &r.not_dst_ports).map_err(e)?,
        icmp_type: byte("icmp type", r.icmp_type).map_err(e)?,
        icmp_code: byte("icmp code", r.icmp_code).map_err(e)?,
        not_icmp_type: byte("not icmp type", r.not_icmp_type).map_err(e)?,
        not_icmp_code: byte("not icmp code", r.not_icmp_code).map_err(e)?,
        family: match r.ip_version {
            None => None,
            Some(4) => Some(IpFamily::V4),
            Some(6) => Some(IpFamily::V6),
            Some(v) => return Err(e(format!("ip version {v} is neither 4 nor 6"))),
        },
        origin: r.origin.clone(),
    })
}

/// Checks one interface's policy from the stream.
pub fn parse_endpoint(p: &pb::EndpointPolicy) -> Result<(String, EndpointRules), String> {
    if !interface_name(&p.interface) {
        return Err(format!(
            "endpoint policy: {:?} is not an interface name",
            p.interface
        ));
    }
    let dir = |selected: bool, rules: &[pb::PolicyRule]| -> Result<_, String> {
        if !selected {
            return Ok(None);
        }
        rules
            .iter()
            .map(parse_rule)
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    };
    let e = |m: String| format!("endpoint policy of {}: {m}", p.interface);
    Ok((
        p.interface.clone(),
        EndpointRules {
            ingress: dir(p.ingress_selected, &p.ingress).map_err(e)?,
            egress: dir(p.egress_selected, &p.egress).map_err(e)?,
        },
    ))
}

/// Checks one address set from the stream.
pub fn parse_set(s: &pb::PolicySet) -> Result<(String, SetMembers), String> {
    if !plain_name(&s.name) {
        return Err(format!("policy set {:?}: not a set name", s.name));
    }
    let mut members: SetMembers = Default::default();
    for m in &s.members {
        let net: IpNet = m
            .parse()
            .or_else(|_| m.parse::<std::net::IpAddr>().map(IpNet::from))
            .map_err(|_| format!("policy set {}: {m:?} is not an address or CIDR", s.name))?;
        members[IpFamily::of(net.addr()).index()].push(interval_of(&net.trunc()));
    }
    Ok((s.name.clone(), members.map(merge)))
}

impl PolicyState {
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty() && self.sets.is_empty()
    }

    /// True when the value changed.
    pub fn upsert_endpoint(&mut self, name: String, rules: EndpointRules) -> bool {
        self.endpoints.insert(name, rules.clone()) != Some(rules)
    }

    pub fn remove_endpoint(&mut self, name: &str) -> bool {
        self.endpoints.remove(name).is_some()
    }

    pub fn upsert_set(&mut self, name: String, members: SetMembers) -> bool {
        self.sets.insert(name, members.clone()) != Some(members)
    }

    pub fn remove_set(&mut self, name: &str) -> bool {
        self.sets.remove(name).is_some()
    }

    /// Counts for the status: interfaces with rules, rules, sets.
    pub fn counts(&self) -> (usize, usize, usize) {
        let rules = self
            .endpoints
            .values()
            .map(|e| e.ingress.as_ref().map_or(0, Vec::len) + e.egress.as_ref().map_or(0, Vec::len))
            .sum();
        (self.endpoints.len(), rules, self.sets.len())
    }
}

/// Runs nft for the policy table, and remembers what it last wrote.
#[derive(Debug)]
pub struct PolicyTable {
    pub runner: NftRunner,
    pub table: String,
    /// The table as routewriter's last successful write left it (`None`: unknown, read it).
    /// Reading a table of thousands of chains back (`nft -j list`) costs far more than the
    /// changes written to it, so changes are planned against this, and the kernel's table is
    /// read back on a full sync (start, the periodic resync) to find drift.
    written: Option<actual::Actual>,
}

impl PolicyTable {
    pub fn new(binary: &Path, table: &str) -> Self {
        PolicyTable {
            runner: NftRunner::new(binary),
            table: table.to_owned(),
            written: None,
        }
    }

    /// Plans against the kernel's table (`read_back`, or when the last write is not known) or
    /// against the last write, and writes what differs in one transaction; true when
    /// something was written.
    /// `known`: the namespace's tables, when the caller listed them (an absent table is not
    /// read).
    pub fn sync(
        &mut self,
        state: &PolicyState,
        read_back: bool,
        known: Option<&Tables>,
    ) -> Result<bool, NftError> {
        let absent = known.is_some_and(|t| !t.contains(FAMILY, &self.table));
        let actual = match (&self.written, read_back) {
            (Some(w), false) => Some(w.clone()),
            _ if absent => None,
            _ => {
                let json = self.runner.list_table(FAMILY, &self.table)?;
                json.map(|j| actual::parse(&j))
                    .transpose()
                    .map_err(NftError::Parse)?
            }
        };
        let desired = render::Rendered::of(state);
        let Some(script) = plan::plan(&self.table, &desired, actual.as_ref()) else {
            self.written = actual;
            return Ok(false);
        };
        match self.runner.apply(&script) {
            Ok(()) => {
                self.written = (!desired.is_empty()).then(|| actual::Actual::as_written(&desired));
                Ok(true)
            }
            Err(e) => {
                // What the kernel holds now is not known for sure: read it next time.
                self.written = None;
                Err(e)
            }
        }
    }
}
