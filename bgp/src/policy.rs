//! Route policy: which received routes the Loc-RIB may use (import), which routes go to
//! which peer (export), and which Loc-RIB routes enter the desired kernel state (kernel).
//!
//! **Job.** Hold ordered rule lists, one per scope, and evaluate them: the first rule that
//! matches decides. The same lists are what `bgpctl show filters` prints, so what an operator
//! reads is exactly what runs (Calico's generated `bird_ipam.cfg`, as data).
//!
//! **Boundaries.** Pure data and pure functions. The cluster brain (bgpd) generates a
//! [`Policy`] from the pools, given as [`PolicyPool`]s ([`Policy::generate`]); the RIB calls [`Policy::import`] and
//! [`Policy::export`]; the speaker calls [`Policy::kernel`] for the dataplane. A speaker
//! without a cluster (tests, a bare route server) runs [`Policy::accept_all`].
//!
//! Why this file is long: the generated rule lists and their evaluation are one table of
//! decisions, read by generation, evaluation and `bgpctl show filters` alike.
//!
//! **A peer's own filters** (`BGPFilter`s named by a `BGPPeer`, module `filter`) are held by
//! the peer's address and evaluated first, as Calico calls them before its generated logic;
//! a route none of them matches is decided by the generated rules. **Service addresses**
//! (the `BGPConfiguration`'s service CIDRs) go to external peers only. **Communities** of
//! `prefixAdvertisements` are added on export to routes inside their CIDR, on every session,
//! unless a peer's filter accepted the route (Calico's filter `Accept` skips its own logic).

mod filter;

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use bgp_wire::{Community, LargeCommunity, Prefix};
use ipnet::IpNet;

pub use filter::{Direction, FilterRule, IfName, MatchOperator, PeerFilters};

/// A pool's encapsulation mode (`vxlanMode`, `ipipMode`), as the datastore's `IPPool` says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Encap {
    #[default]
    Never,
    Always,
    CrossSubnet,
}

impl Encap {
    pub fn is_on(self) -> bool {
        self != Encap::Never
    }
}

/// What the rules are generated from: an IP pool, as far as routing is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyPool {
    pub name: String,
    pub cidr: IpNet,
    pub vxlan_mode: Encap,
    pub ipip_mode: Encap,
    pub disable_bgp_export: bool,
}

impl PolicyPool {
    /// A pool without encapsulation, exported.
    pub fn new(name: &str, cidr: IpNet) -> Self {
        PolicyPool {
            name: name.to_owned(),
            cidr,
            vxlan_mode: Encap::Never,
            ipip_mode: Encap::Never,
            disable_bgp_export: false,
        }
    }
}

/// What kind of neighbour a peer is, for policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PeerClass {
    /// Another node of the cluster (mesh, route reflector).
    Cluster,
    /// Anything else: a ToR router, a configured or API peer.
    External,
}

/// Where a route in the Loc-RIB came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteSource {
    /// Originated on this node.
    Local,
    Peer(PeerClass),
}

/// The rule lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    Import,
    ExportCluster,
    ExportExternal,
    Kernel,
}

/// How a kernel route is programmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelVia {
    /// Via the BGP next hop, plain IP.
    NextHop,
    /// Via the IPIP device to the BGP next hop, onlink.
    Ipip,
}

/// A rule's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Accept,
    Reject,
    /// Kernel scope only.
    Program(KernelVia),
}

/// How a rule matches a prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetMatch {
    /// Any prefix.
    Any,
    /// A default route of either family (0.0.0.0/0, ::/0).
    Default,
    /// Exactly this prefix.
    Exactly(IpNet),
    /// This prefix or one inside it, with a length from `min` to the family's longest
    /// (BIRD's `net ~ p{min,32}`, `{min,128}`). A prefix of the other family never matches.
    Within(IpNet, u8),
}

impl NetMatch {
    fn matches(&self, p: Prefix) -> bool {
        let addr = p.addr();
        match *self {
            NetMatch::Any => true,
            NetMatch::Default => p.prefix_len() == 0,
            NetMatch::Exactly(n) => n.network() == addr && n.prefix_len() == p.prefix_len(),
            NetMatch::Within(n, min) => {
                p.prefix_len() >= n.prefix_len().max(min) && n.contains(&addr)
            }
        }
    }
}

/// A rule: all its conditions must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub net: NetMatch,
    /// `None`: any source.
    pub source: Option<RouteSource>,
    /// Kernel scope: the BGP next hop lies in this subnet.
    pub next_hop_in: Option<IpNet>,
    pub action: Action,
    pub reason: String,
}

impl Rule {
    fn new(net: NetMatch, action: Action, reason: impl Into<String>) -> Self {
        Rule {
            net,
            source: None,
            next_hop_in: None,
            action,
            reason: reason.into(),
        }
    }

    fn from(mut self, source: RouteSource) -> Self {
        self.source = Some(source);
        self
    }

    fn matches(&self, p: Prefix, src: RouteSource, next_hop: Option<IpAddr>) -> bool {
        self.net.matches(p)
            && self.source.is_none_or(|s| s == src)
            && self
                .next_hop_in
                .is_none_or(|n| next_hop.is_some_and(|h| n.contains(&h)))
    }

    /// The match, BIRD-like: `net ~ 172.20.0.0/16{16,32} && from cluster peers`.
    pub fn describe_match(&self) -> String {
        let mut parts = Vec::new();
        match self.net {
            NetMatch::Any => {}
            NetMatch::Default => parts.push("net = 0.0.0.0/0 || net = ::/0".into()),
            NetMatch::Exactly(n) => parts.push(format!("net = {n}")),
            NetMatch::Within(n, min) => parts.push(format!(
                "net ~ {n}{{{},{}}}",
                n.prefix_len().max(min),
                n.max_prefix_len()
            )),
        }
        match self.source {
            None => {}
            Some(RouteSource::Local) => parts.push("originated here".into()),
            Some(RouteSource::Peer(PeerClass::Cluster)) => parts.push("from cluster peers".into()),
            Some(RouteSource::Peer(PeerClass::External)) => {
                parts.push("from external peers".into())
            }
        }
        if let Some(n) = self.next_hop_in {
            parts.push(format!("bgp_next_hop ~ {n}"));
        }
        if parts.is_empty() {
            "all".into()
        } else {
            parts.join(" && ")
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Accept => "accept",
            Action::Reject => "reject",
            Action::Program(KernelVia::NextHop) => "accept via bgp next hop",
            Action::Program(KernelVia::Ipip) => "accept via tunl0 onlink",
        })
    }
}

/// Communities added to the routes inside `cidr` when they are exported (Calico's
/// `prefixAdvertisements`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advertisement {
    pub cidr: IpNet,
    pub communities: Vec<Community>,
    pub large_communities: Vec<LargeCommunity>,
}

/// The peer an import or export decision is for: its class (the generated rules) and its
/// address (its own filters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerRef {
    pub class: PeerClass,
    pub address: IpAddr,
    /// The interface the session runs on: the interface of the routes it sends us.
    pub interface: Option<IfName>,
}

/// What decided a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decider<'a> {
    /// One of the peer's `BGPFilter` rules.
    Filter(&'a FilterRule),
    /// A generated rule.
    Generated(&'a Rule),
    /// No cluster policy ([`Policy::accept_all`]), or no rule matched (rejected).
    None,
}

/// A decision and the rule that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict<'a> {
    pub accept: bool,
    pub by: Decider<'a>,
}

impl Verdict<'_> {
    /// The deciding rule's match and reason, for `bgpctl show filters`.
    pub fn describe(&self) -> (String, String) {
        match self.by {
            Decider::Filter(r) => (r.describe_match(), r.reason()),
            Decider::Generated(r) => (r.describe_match(), r.reason.clone()),
            Decider::None if self.accept => ("all".into(), "no cluster policy".into()),
            Decider::None => ("all".into(), "no rule matched".into()),
        }
    }
}

/// The settings generation needs besides the pools.
#[derive(Debug, Clone, Default)]
pub struct PolicyInputs<'a> {
    pub pools: &'a [PolicyPool],
    /// This node's confirmed blocks, of both families.
    pub own_blocks: &'a [IpNet],
    /// This node's subnets (for CrossSubnet and direct routes), one per family it has an
    /// address in.
    pub subnets: &'a [IpNet],
    pub aggregate_to_external: bool,
    pub external_transit: bool,
    pub program_external_routes: bool,
    /// Service CIDRs (cluster, external, load-balancer): exported to external peers only.
    pub services: &'a [IpNet],
    /// Communities per CIDR, added on export.
    pub advertisements: &'a [Advertisement],
    /// Each filtered peer's own rules, by its address.
    pub peer_filters: &'a [(IpAddr, PeerFilters)],
}

/// The four rule lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// `false`: [`Policy::accept_all`], evaluation short-cuts.
    generated: bool,
    import: Vec<Rule>,
    export_cluster: Vec<Rule>,
    export_external: Vec<Rule>,
    kernel: Vec<Rule>,
    advertisements: Vec<Advertisement>,
    peers: BTreeMap<IpAddr, PeerFilters>,
}

impl Default for Policy {
    fn default() -> Self {
        Self::accept_all()
    }
}

const CLUSTER: RouteSource = RouteSource::Peer(PeerClass::Cluster);
const EXTERNAL: RouteSource = RouteSource::Peer(PeerClass::External);

impl Policy {
    /// No filtering: everything imported and exported (the RIB's iBGP rules still apply),
    /// every learned route programmed via its next hop.
    pub fn accept_all() -> Self {
        let all = |reason: &str| vec![Rule::new(NetMatch::Any, Action::Accept, reason)];
        Policy {
            generated: false,
            import: all("no cluster policy"),
            export_cluster: all("no cluster policy"),
            export_external: all("no cluster policy"),
            kernel: vec![
                Rule::new(NetMatch::Any, Action::Reject, "originated here")
                    .from(RouteSource::Local),
                Rule::new(
                    NetMatch::Any,
                    Action::Program(KernelVia::NextHop),
                    "no cluster policy",
                ),
            ],
            advertisements: Vec::new(),
            peers: BTreeMap::new(),
        }
    }

    /// The policy of a node from the pools of both families: one list per scope, each pool's
    /// rules matching only its own family's prefixes (the rules are sorted, so the same
    /// inputs give the same output).
    #[expect(
        clippy::too_many_lines,
        reason = "builds the import, cluster export, external export and kernel lists from the same sorted pools, own blocks and subnet lookup, in the order Calico's BIRD filters read; the steps share those locals"
    )]
    pub fn generate(inp: &PolicyInputs<'_>) -> Self {
        let mut pools: Vec<(&PolicyPool, IpNet)> = inp.pools.iter().map(|p| (p, p.cidr)).collect();
        // Most specific first, then by address, so nested pools decide correctly.
        pools.sort_by_key(|(_, n)| {
            (
                n.addr().is_ipv6(),
                std::cmp::Reverse(n.prefix_len()),
                n.network(),
            )
        });
        let mut own: Vec<IpNet> = inp.own_blocks.to_vec();
        own.sort();
        own.dedup();
        let within = |n: IpNet| NetMatch::Within(n, n.prefix_len());
        // The node's subnet of a pool's family.
        let subnet_for = |n: &IpNet| {
            inp.subnets
                .iter()
                .find(|s| s.addr().is_ipv6() == n.addr().is_ipv6())
                .copied()
        };

        let mut import = Vec::new();
        for b in &own {
            import.push(Rule::new(
                NetMatch::Exactly(*b),
                Action::Reject,
                "own block of this node coming back",
            ));
        }
        for (p, n) in &pools {
            import.push(
                Rule::new(
                    within(*n),
                    Action::Accept,
                    format!("inside pool {}", p.name),
                )
                .from(CLUSTER),
            );
        }
        import.push(
            Rule::new(
                NetMatch::Any,
                Action::Reject,
                "cluster peers announce only pool addresses",
            )
            .from(CLUSTER),
        );
        import.push(
            Rule::new(
                NetMatch::Any,
                Action::Accept,
                "routes from configured external peers are accepted",
            )
            .from(EXTERNAL),
        );

        let mut services: Vec<IpNet> = inp.services.to_vec();
        services.sort();
        services.dedup();
        let mut export_cluster = Vec::new();
        for n in &services {
            export_cluster.push(Rule::new(
                within(*n),
                Action::Reject,
                format!("service addresses {n} go to external peers only"),
            ));
        }
        if inp.aggregate_to_external {
            for (p, n) in &pools {
                export_cluster.push(Rule::new(
                    NetMatch::Exactly(*n),
                    Action::Reject,
                    format!("aggregate of pool {} goes to external peers only", p.name),
                ));
            }
        }
        export_cluster.push(
            Rule::new(
                NetMatch::Any,
                Action::Accept,
                "originated here: own confirmed blocks, borrowed addresses, configured routes",
            )
            .from(RouteSource::Local),
        );
        for (p, n) in &pools {
            export_cluster.push(Rule::new(
                within(*n),
                Action::Accept,
                format!("inside pool {} (reflected to cluster peers)", p.name),
            ));
        }
        export_cluster.push(Rule::new(
            NetMatch::Any,
            Action::Reject,
            "only pool routes go to cluster peers",
        ));

        let mut export_external = vec![
            Rule::new(NetMatch::Default, Action::Reject, "never a default route"),
            Rule::new(
                NetMatch::Any,
                Action::Reject,
                "cluster routes are announced by the node that owns them",
            )
            .from(CLUSTER),
        ];
        if !inp.external_transit {
            export_external.push(
                Rule::new(
                    NetMatch::Any,
                    Action::Reject,
                    "learned from another external peer (external_transit off)",
                )
                .from(EXTERNAL),
            );
        }
        for (p, n) in &pools {
            if p.disable_bgp_export {
                export_external.push(Rule::new(
                    within(*n),
                    Action::Reject,
                    format!("pool {} has disableBGPExport", p.name),
                ));
            } else if inp.aggregate_to_external {
                export_external.push(
                    Rule::new(
                        NetMatch::Exactly(*n),
                        Action::Accept,
                        format!("aggregate of pool {}", p.name),
                    )
                    .from(RouteSource::Local),
                );
                export_external.push(Rule::new(
                    within(*n),
                    Action::Reject,
                    format!("pool {} is exported as one aggregate", p.name),
                ));
            }
        }
        export_external.push(
            Rule::new(
                NetMatch::Any,
                Action::Accept,
                "originated here: own confirmed blocks, borrowed addresses, configured routes",
            )
            .from(RouteSource::Local),
        );
        if inp.external_transit {
            export_external.push(
                Rule::new(
                    NetMatch::Any,
                    Action::Accept,
                    "external transit is on (external_transit)",
                )
                .from(EXTERNAL),
            );
        }
        export_external.push(Rule::new(NetMatch::Any, Action::Reject, "nothing else"));

        let mut kernel = vec![
            Rule::new(
                NetMatch::Any,
                Action::Reject,
                "originated here (own blocks are blackholed from IPAM)",
            )
            .from(RouteSource::Local),
        ];
        for (p, n) in &pools {
            if p.vxlan_mode.is_on() {
                kernel.push(Rule::new(
                    within(*n),
                    Action::Reject,
                    format!(
                        "pool {} is vxlanMode {:?}: VXLAN routes come from IPAM",
                        p.name, p.vxlan_mode
                    ),
                ));
            } else if p.ipip_mode == Encap::CrossSubnet {
                if let Some(subnet) = subnet_for(n) {
                    let mut direct = Rule::new(
                        within(*n),
                        Action::Program(KernelVia::NextHop),
                        format!(
                            "pool {} is ipipMode CrossSubnet, next hop in our subnet",
                            p.name
                        ),
                    );
                    direct.next_hop_in = Some(subnet);
                    kernel.push(direct);
                }
                kernel.push(Rule::new(
                    within(*n),
                    Action::Program(KernelVia::Ipip),
                    format!("pool {} is ipipMode CrossSubnet", p.name),
                ));
            } else if p.ipip_mode == Encap::Always {
                kernel.push(Rule::new(
                    within(*n),
                    Action::Program(KernelVia::Ipip),
                    format!("pool {} is ipipMode Always", p.name),
                ));
            } else if let Some(subnet) = subnet_for(n) {
                let mut direct = Rule::new(
                    within(*n),
                    Action::Program(KernelVia::NextHop),
                    format!("pool {} has no encapsulation", p.name),
                );
                direct.next_hop_in = Some(subnet);
                kernel.push(direct);
                // A next hop beyond our subnet is not on a link of ours: the node's own
                // routes (its default route to the router that learned the block) reach it,
                // as BIRD's `gateway recursive` would.
                kernel.push(Rule::new(
                    within(*n),
                    Action::Reject,
                    format!(
                        "pool {} has no encapsulation, next hop beyond our subnet: reached through the node's own routes",
                        p.name
                    ),
                ));
            } else {
                kernel.push(Rule::new(
                    within(*n),
                    Action::Program(KernelVia::NextHop),
                    format!("pool {} has no encapsulation", p.name),
                ));
            }
        }
        kernel.push(if inp.program_external_routes {
            Rule::new(
                NetMatch::Any,
                Action::Program(KernelVia::NextHop),
                "outside every pool (program_external_routes on)",
            )
        } else {
            Rule::new(
                NetMatch::Any,
                Action::Reject,
                "outside every pool (program_external_routes off)",
            )
        });

        Policy {
            generated: true,
            import,
            export_cluster,
            export_external,
            kernel,
            advertisements: inp.advertisements.to_vec(),
            peers: inp
                .peer_filters
                .iter()
                .filter(|(_, f)| !f.is_empty())
                .cloned()
                .collect(),
        }
    }

    pub fn rules(&self, scope: Scope) -> &[Rule] {
        match scope {
            Scope::Import => &self.import,
            Scope::ExportCluster => &self.export_cluster,
            Scope::ExportExternal => &self.export_external,
            Scope::Kernel => &self.kernel,
        }
    }

    /// The peer's own filters, if it has any.
    pub fn peer_filters(&self, address: IpAddr) -> Option<&PeerFilters> {
        self.peers.get(&address)
    }

    /// The peers whose own filters differ in `other`.
    pub fn filters_changed(&self, other: &Policy) -> Vec<IpAddr> {
        let mut out: Vec<IpAddr> = self
            .peers
            .keys()
            .chain(other.peers.keys())
            .filter(|a| self.peers.get(a) != other.peers.get(a))
            .copied()
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Whether the communities added on export differ in `other`.
    pub fn advertisements_differ(&self, other: &Policy) -> bool {
        self.advertisements != other.advertisements
    }

    /// Whether export looks at more than the prefix's verdict: communities to add.
    pub fn has_advertisements(&self) -> bool {
        !self.advertisements.is_empty()
    }

    /// The advertisements whose CIDR holds `prefix`, in order.
    pub fn advertisements_for(&self, prefix: Prefix) -> impl Iterator<Item = &Advertisement> {
        self.advertisements
            .iter()
            .filter(move |a| NetMatch::Within(a.cidr, a.cidr.prefix_len()).matches(prefix))
    }

    /// Import of `prefix` from `from`: its filters first, then the generated rules.
    pub fn import_verdict(&self, from: &PeerRef, prefix: Prefix) -> Verdict<'_> {
        if !self.generated {
            return Verdict {
                accept: true,
                by: Decider::None,
            };
        }
        let src = RouteSource::Peer(from.class);
        if let Some(r) = self
            .peers
            .get(&from.address)
            .and_then(|f| f.decide(Direction::Import, prefix, src, from.interface))
        {
            return Verdict {
                accept: r.accept,
                by: Decider::Filter(r),
            };
        }
        Self::generated_verdict(&self.import, prefix, src)
    }

    /// Export of the best route for `prefix`, from `src` (whose routes come through
    /// `interface`, for a peer's routes), to `to`.
    pub fn export_verdict(
        &self,
        to: &PeerRef,
        prefix: Prefix,
        src: RouteSource,
        interface: Option<IfName>,
    ) -> Verdict<'_> {
        if !self.generated {
            return Verdict {
                accept: true,
                by: Decider::None,
            };
        }
        if let Some(r) = self
            .peers
            .get(&to.address)
            .and_then(|f| f.decide(Direction::Export, prefix, src, interface))
        {
            return Verdict {
                accept: r.accept,
                by: Decider::Filter(r),
            };
        }
        let rules = match to.class {
            PeerClass::Cluster => &self.export_cluster,
            PeerClass::External => &self.export_external,
        };
        Self::generated_verdict(rules, prefix, src)
    }

    fn generated_verdict(rules: &[Rule], prefix: Prefix, src: RouteSource) -> Verdict<'_> {
        match Self::decide(rules, prefix, src, None) {
            Some(r) => Verdict {
                accept: r.action == Action::Accept,
                by: Decider::Generated(r),
            },
            None => Verdict {
                accept: false,
                by: Decider::None,
            },
        }
    }

    fn decide(rules: &[Rule], p: Prefix, src: RouteSource, nh: Option<IpAddr>) -> Option<&Rule> {
        rules.iter().find(|r| r.matches(p, src, nh))
    }

    /// Generated from pools (rules look at prefixes), rather than [`Policy::accept_all`].
    pub fn is_generated(&self) -> bool {
        self.generated
    }

    /// May the Loc-RIB use `prefix` received from a peer of `class`?
    pub fn import(&self, class: PeerClass, prefix: Prefix) -> bool {
        !self.generated
            || Self::decide(&self.import, prefix, RouteSource::Peer(class), None)
                .is_some_and(|r| r.action == Action::Accept)
    }

    /// May a peer of class `to` be sent the best route for `prefix` from `src`?
    pub fn export(&self, to: PeerClass, prefix: Prefix, src: RouteSource) -> bool {
        if !self.generated {
            return true;
        }
        let rules = match to {
            PeerClass::Cluster => &self.export_cluster,
            PeerClass::External => &self.export_external,
        };
        Self::decide(rules, prefix, src, None).is_some_and(|r| r.action == Action::Accept)
    }

    /// Whether any route at all can enter the kernel table (some kernel rule programs).
    pub fn programs_any(&self) -> bool {
        self.kernel
            .iter()
            .any(|r| matches!(r.action, Action::Program(_)))
    }

    /// How the best route for `prefix` enters the kernel table, with the rule's reason;
    /// `None`: it does not.
    pub fn kernel(
        &self,
        prefix: Prefix,
        src: RouteSource,
        next_hop: Option<IpAddr>,
    ) -> Option<(KernelVia, &str)> {
        match *Self::decide(&self.kernel, prefix, src, next_hop)? {
            Rule {
                action: Action::Program(via),
                ref reason,
                ..
            } => Some((via, reason.as_str())),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
