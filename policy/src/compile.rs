//! What one node enforces: for each of its endpoints' interfaces, the rules per direction in
//! evaluation order, and the address sets those rules name. Sans-IO and deterministic: the
//! same cluster gives the same `NodePolicy`, so the renderer can diff it.
//!
//! Semantics (Kubernetes' and Calico's, one tier): policies in order of (order, id), each
//! policy's rules in its order; the first Allow or Deny decides, Log logs and goes on, Pass
//! ends the tier, after which Calico's per-namespace profile allows the packet. An endpoint
//! that at least one policy selects for a direction, and whose rules decided nothing, is
//! denied: the renderer appends that drop (`Rule`s do not contain it). `None` for a
//! direction means no policy selects the endpoint that way: everything is allowed.
//!
//! For ingress the local endpoint is the destination, for egress the source. The local
//! side's selectors are decided here (a rule whose `destination.selector` does not match
//! the local endpoint is left out); its named ports resolve against the local endpoint. The
//! remote side becomes address sets; a named port there splits the rule into one rule per
//! (protocol, number), each narrowed to the endpoints that give the name that number.
//!
//! Set names derive from the canonical text of what the set selects (a hash of it), not
//! from its members, so they stay stable while membership changes; equal selections share
//! one set.

use std::collections::BTreeMap;
use std::fmt;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::addrset::AddrSet;
use crate::resource::{
    Action, Direction, EndpointSelection, EntityRule, Icmp, IpVersion, Namespace, Peer, Policy,
    PolicyId, PolicyRule, PortSpec, Protocol, WorkloadEndpoint, namespace_labels,
};

/// The cluster's resources, as bgpd's cache holds them.
#[derive(Debug, Clone, Copy)]
pub struct Cluster<'a> {
    pub policies: &'a [Policy],
    pub endpoints: &'a [WorkloadEndpoint],
    pub namespaces: &'a [Namespace],
}

/// What one node enforces.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePolicy {
    /// By the endpoint's interface; every endpoint of the node is here.
    pub endpoints: BTreeMap<String, EndpointPolicy>,
    /// Every set the rules name, and only those.
    pub sets: BTreeMap<SetName, AddrSet>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointPolicy {
    /// `None`: no policy selects the endpoint for ingress, all is allowed. `Some`: these
    /// rules, then deny.
    pub ingress: Option<Vec<Rule>>,
    pub egress: Option<Vec<Rule>>,
}

impl EndpointPolicy {
    pub fn rules(&self, dir: Direction) -> Option<&[Rule]> {
        match dir {
            Direction::Ingress => self.ingress.as_deref(),
            Direction::Egress => self.egress.as_deref(),
        }
    }
}

/// One rule: every condition given must hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    pub action: Action,
    pub ip_version: Option<IpVersion>,
    pub protocol: Option<Protocol>,
    pub not_protocol: Option<Protocol>,
    pub src: AddrMatch,
    pub dst: AddrMatch,
    pub src_ports: PortMatch,
    pub dst_ports: PortMatch,
    pub icmp: Option<Icmp>,
    pub not_icmp: Option<Icmp>,
    pub origin: RuleOrigin,
}

/// The address is in `set` (if given) and not in `not_set` (if given).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddrMatch {
    pub set: Option<SetName>,
    pub not_set: Option<SetName>,
}

/// The port is in one of `ports` (any when empty) and in none of `not_ports`. Both sorted
/// and merged.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortMatch {
    pub ports: Vec<PortRange>,
    pub not_ports: Vec<PortRange>,
}

/// Ports `first..=last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    pub fn contains(&self, port: u16) -> bool {
        (self.first..=self.last).contains(&port)
    }
}

/// Which user rule a compiled rule comes from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RuleOrigin {
    pub policy: PolicyId,
    /// The rule's index in the policy's `ingress` or `egress` list.
    pub rule: usize,
}

/// A set's name: `p-` and 16 hex digits, a valid nftables identifier (<= 31 characters of
/// `[a-zA-Z0-9_-]`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SetName(pub String);

impl fmt::Display for SetName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a set holds, canonically: the union of `peers`, narrowed to the endpoints whose
/// named port (name, protocol) has the given number.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct SetSpec {
    peers: Vec<Peer>,
    named_port: Option<(String, Protocol, u16)>,
}

impl SetSpec {
    fn new(mut peers: Vec<Peer>, named_port: Option<(String, Protocol, u16)>) -> SetSpec {
        peers.sort();
        peers.dedup();
        SetSpec { peers, named_port }
    }

    /// The canonical text the name is derived from.
    fn key(&self) -> String {
        let mut key = self
            .peers
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" | ");
        if self.peers.is_empty() {
            key.push_str("anywhere");
        }
        if let Some((name, proto, port)) = &self.named_port {
            key.push_str(&format!(" ; named port {proto}/{name} = {port}"));
        }
        key
    }
}

/// FNV-1a, 64 bits: fixed by definition, so names are the same on every node and version.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Computes what node `node` enforces.
pub fn compile(cluster: &Cluster, node: &str) -> NodePolicy {
    let mut c = Compiler::new(cluster);
    let mut policies: Vec<&Policy> = cluster.policies.iter().collect();
    policies.sort_by(|a, b| Policy::evaluation_order(a, b));
    let mut out = NodePolicy::default();
    for (i, ep) in cluster.endpoints.iter().enumerate() {
        if ep.node != node || out.endpoints.contains_key(&ep.interface) {
            continue;
        }
        let selecting: Vec<&Policy> = policies
            .iter()
            .copied()
            .filter(|p| c.selected(&p.subject, i))
            .collect();
        let mut compiled = EndpointPolicy::default();
        for dir in [Direction::Ingress, Direction::Egress] {
            let mut rules = None;
            for p in &selecting {
                let Some(policy_rules) = p.rules(dir) else {
                    continue;
                };
                let list = rules.get_or_insert_with(Vec::new);
                for r in policy_rules {
                    c.rule(p, r, dir, i, list);
                }
            }
            match dir {
                Direction::Ingress => compiled.ingress = rules,
                Direction::Egress => compiled.egress = rules,
            }
        }
        out.endpoints.insert(ep.interface.clone(), compiled);
    }
    out.sets = c.sets.into_values().collect();
    out
}

struct Compiler<'a> {
    cluster: &'a Cluster<'a>,
    /// Per endpoint (same index): its effective labels and its namespace's.
    ep_labels: Vec<BTreeMap<String, String>>,
    ns_labels: BTreeMap<&'a str, BTreeMap<String, String>>,
    /// By the set's key: its name and members.
    sets: BTreeMap<String, (SetName, AddrSet)>,
    taken: BTreeMap<SetName, String>,
}

impl<'a> Compiler<'a> {
    fn new(cluster: &'a Cluster<'a>) -> Self {
        let ep_labels = cluster
            .endpoints
            .iter()
            .map(WorkloadEndpoint::effective_labels)
            .collect();
        let ns_labels = cluster
            .endpoints
            .iter()
            .map(|ep| {
                let name = ep.namespace.as_str();
                (name, namespace_labels(cluster.namespaces, name))
            })
            .collect();
        Compiler {
            cluster,
            ep_labels,
            ns_labels,
            sets: BTreeMap::new(),
            taken: BTreeMap::new(),
        }
    }

    fn selected(&self, selection: &EndpointSelection, i: usize) -> bool {
        let ep = &self.cluster.endpoints[i];
        selection.matches(
            ep,
            &self.ep_labels[i],
            &self.ns_labels[ep.namespace.as_str()],
        )
    }

    /// Compiles one user rule for endpoint `i` in direction `dir`, appending to `out`.
    fn rule(
        &mut self,
        policy: &Policy,
        r: &PolicyRule,
        dir: Direction,
        i: usize,
        out: &mut Vec<Rule>,
    ) {
        let (local, remote) = match dir {
            Direction::Ingress => (&r.destination, &r.source),
            Direction::Egress => (&r.source, &r.destination),
        };
        let Some(local_match) = self.local_side(local, i) else {
            return;
        };
        let Some(local_ports) = self.local_ports(local, r.protocol, i) else {
            return;
        };
        let remote_not = self.not_set(remote);
        let numbers: Vec<PortRange> = remote
            .ports
            .iter()
            .filter_map(|p| match p {
                PortSpec::Range(a, b) => Some(PortRange {
                    first: *a,
                    last: *b,
                }),
                PortSpec::Named(_) => None,
            })
            .collect();
        let names: Vec<&str> = remote
            .ports
            .iter()
            .filter_map(|p| match p {
                PortSpec::Named(n) => Some(n.as_str()),
                PortSpec::Range(..) => None,
            })
            .collect();
        let not_ports = ranges(&remote.not_ports);
        let mut emit = |remote_set: Option<SetName>, ports: Vec<PortRange>| {
            let remote_match = AddrMatch {
                set: remote_set,
                not_set: remote_not.clone(),
            };
            let remote_ports = PortMatch {
                ports: merge(ports),
                not_ports: not_ports.clone(),
            };
            let (src, dst, src_ports, dst_ports) = match dir {
                Direction::Ingress => (
                    remote_match,
                    local_match.clone(),
                    remote_ports,
                    local_ports.clone(),
                ),
                Direction::Egress => (
                    local_match.clone(),
                    remote_match,
                    local_ports.clone(),
                    remote_ports,
                ),
            };
            out.push(Rule {
                action: r.action,
                ip_version: r.ip_version,
                protocol: r.protocol,
                not_protocol: r.not_protocol,
                src,
                dst,
                src_ports,
                dst_ports,
                icmp: r.icmp,
                not_icmp: r.not_icmp,
                origin: RuleOrigin {
                    policy: policy.id.clone(),
                    rule: r.index,
                },
            });
        };
        let remote_peers = (!remote.peers.is_empty()).then(|| remote.peers.clone());
        if names.is_empty() || !numbers.is_empty() {
            let set = remote_peers
                .as_ref()
                .map(|peers| self.set(SetSpec::new(peers.clone(), None)));
            emit(set, numbers);
        }
        // A named port on the remote side: one rule per number it has on some endpoint,
        // narrowed to those endpoints.
        let Some(protocol) = r.protocol else {
            return;
        };
        for name in names {
            let mut numbers: Vec<u16> = self
                .cluster
                .endpoints
                .iter()
                .filter_map(|ep| ep.named_port(name, protocol))
                .collect();
            numbers.sort_unstable();
            numbers.dedup();
            for n in numbers {
                let spec = SetSpec::new(remote.peers.clone(), Some((name.to_owned(), protocol, n)));
                let set = self.set(spec);
                emit(Some(set), vec![PortRange { first: n, last: n }]);
            }
        }
    }

    /// The local side's address match, or `None` if the rule can never match endpoint `i`
    /// (its selectors leave the endpoint out).
    fn local_side(&mut self, local: &EntityRule, i: usize) -> Option<AddrMatch> {
        if let Some(not) = &local.not_endpoints
            && self.selected(not, i)
        {
            return None;
        }
        let mut set = None;
        if !local.peers.is_empty() {
            let mut nets = Vec::new();
            let mut any = false;
            for peer in &local.peers {
                match peer {
                    Peer::Endpoints {
                        selection,
                        nets: within,
                    } if self.selected(selection, i) => {
                        if within.is_empty() {
                            any = true;
                        } else {
                            nets.push(Peer::Nets {
                                nets: within.clone(),
                                except: Vec::new(),
                            });
                        }
                    }
                    Peer::Endpoints { .. } => {}
                    Peer::Nets { .. } => nets.push(peer.clone()),
                }
            }
            if !any && nets.is_empty() {
                return None;
            }
            if !any {
                set = Some(self.set(SetSpec::new(nets, None)));
            }
        }
        let not_set = (!local.not_nets.is_empty()).then(|| {
            self.set(SetSpec::new(
                vec![Peer::Nets {
                    nets: local.not_nets.clone(),
                    except: Vec::new(),
                }],
                None,
            ))
        });
        Some(AddrMatch { set, not_set })
    }

    /// The local side's ports with named ports resolved on endpoint `i`; `None` if it named
    /// only ports the endpoint does not have.
    fn local_ports(
        &self,
        local: &EntityRule,
        protocol: Option<Protocol>,
        i: usize,
    ) -> Option<PortMatch> {
        let ep = &self.cluster.endpoints[i];
        let ports: Vec<PortRange> = local
            .ports
            .iter()
            .filter_map(|p| match p {
                PortSpec::Range(a, b) => Some(PortRange {
                    first: *a,
                    last: *b,
                }),
                PortSpec::Named(name) => protocol
                    .and_then(|proto| ep.named_port(name, proto))
                    .map(|n| PortRange { first: n, last: n }),
            })
            .collect();
        if !local.ports.is_empty() && ports.is_empty() {
            return None;
        }
        Some(PortMatch {
            ports: merge(ports),
            not_ports: ranges(&local.not_ports),
        })
    }

    /// The set of the remote side's exclusions (`notSelector`, `notNets`), if any.
    fn not_set(&mut self, side: &EntityRule) -> Option<SetName> {
        let mut peers = Vec::new();
        if let Some(sel) = &side.not_endpoints {
            peers.push(Peer::Endpoints {
                selection: sel.clone(),
                nets: Vec::new(),
            });
        }
        if !side.not_nets.is_empty() {
            peers.push(Peer::Nets {
                nets: side.not_nets.clone(),
                except: Vec::new(),
            });
        }
        (!peers.is_empty()).then(|| self.set(SetSpec::new(peers, None)))
    }

    /// The set for `spec`: computed once, named from its key.
    fn set(&mut self, spec: SetSpec) -> SetName {
        let key = spec.key();
        if let Some((name, _)) = self.sets.get(&key) {
            return name.clone();
        }
        let members = self.members(&spec);
        // A 64-bit hash collides about never; if it does, the later key takes a salted one.
        let mut salt = 0u32;
        let name = loop {
            let text = if salt == 0 {
                key.clone()
            } else {
                format!("{key}#{salt}")
            };
            let name = SetName(format!("p-{:016x}", fnv1a(&text)));
            match self.taken.get(&name) {
                Some(owner) if *owner != key => salt += 1,
                _ => break name,
            }
        };
        self.taken.insert(name.clone(), key.clone());
        self.sets.insert(key, (name.clone(), members));
        name
    }

    fn members(&self, spec: &SetSpec) -> AddrSet {
        let endpoint_addrs = |keep: &dyn Fn(usize) -> bool| {
            let nets: Vec<IpNet> = (0..self.cluster.endpoints.len())
                .filter(|&i| keep(i))
                .flat_map(|i| self.cluster.endpoints[i].addresses.iter().copied())
                .collect();
            AddrSet::from_nets(&nets)
        };
        let mut members = if spec.peers.is_empty() {
            AddrSet::from_nets(&[
                "0.0.0.0/0".parse().expect("valid"),
                "::/0".parse().expect("valid"),
            ])
        } else {
            AddrSet::default()
        };
        for peer in &spec.peers {
            let addrs = match peer {
                Peer::Endpoints { selection, nets } => {
                    let eps = endpoint_addrs(&|i| self.selected(selection, i));
                    if nets.is_empty() {
                        eps
                    } else {
                        eps.intersection(&AddrSet::from_nets(nets))
                    }
                }
                Peer::Nets { nets, except } => {
                    AddrSet::from_nets(nets).difference(&AddrSet::from_nets(except))
                }
            };
            members = members.union(&addrs);
        }
        if let Some((name, proto, n)) = &spec.named_port {
            let having =
                endpoint_addrs(&|i| self.cluster.endpoints[i].named_port(name, *proto) == Some(*n));
            members = members.intersection(&having);
        }
        members
    }
}

/// Port specs that are numbers, as ranges (named ones are resolved elsewhere).
fn ranges(specs: &[PortSpec]) -> Vec<PortRange> {
    merge(
        specs
            .iter()
            .filter_map(|p| match p {
                PortSpec::Range(a, b) => Some(PortRange {
                    first: *a,
                    last: *b,
                }),
                PortSpec::Named(_) => None,
            })
            .collect(),
    )
}

/// Sorted, overlapping and touching ranges joined.
fn merge(mut ports: Vec<PortRange>) -> Vec<PortRange> {
    ports.sort_unstable();
    let mut out: Vec<PortRange> = Vec::with_capacity(ports.len());
    for p in ports {
        match out.last_mut() {
            Some(last) if u32::from(p.first) <= u32::from(last.last) + 1 => {
                last.last = last.last.max(p.last);
            }
            _ => out.push(p),
        }
    }
    out
}
