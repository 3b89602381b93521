//! The documents users write, checked field by field and normalized into one model:
//! Kubernetes `NetworkPolicy` (`k8s`), Calico `NetworkPolicy` / `GlobalNetworkPolicy`
//! (`calico`), and the endpoints and namespaces policies select (`endpoint`). A document is
//! refused with the path of the first field that is wrong (unknown fields too), so nothing
//! half-understood is ever enforced.
//!
//! Policies are stored as the user's document and parsed again on every load: parsing is
//! deterministic and allocates only what the model keeps. Kubernetes' rules become the same
//! rules Calico writes (Allow, order 1000), so compile, evaluate and explain know one model.

mod calico;
mod endpoint;
mod fields;
mod k8s;
mod values;

use std::fmt;
use std::str::FromStr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::selector::Selector;
pub use endpoint::{
    NamedPort, Namespace, WorkloadEndpoint, namespace_labels, parse_namespace,
    parse_workload_endpoint,
};
use fields::Field;

/// A document refused: where, and why. Displays as `PATH: REASON`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct FieldError {
    pub path: String,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PolicyKind {
    K8sNetworkPolicy,
    NetworkPolicy,
    GlobalNetworkPolicy,
}

impl PolicyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::K8sNetworkPolicy => "k8s-networkpolicy",
            PolicyKind::NetworkPolicy => "networkpolicy",
            PolicyKind::GlobalNetworkPolicy => "globalnetworkpolicy",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PolicyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [
            PolicyKind::K8sNetworkPolicy,
            PolicyKind::NetworkPolicy,
            PolicyKind::GlobalNetworkPolicy,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
        .ok_or_else(|| {
            format!("unknown policy kind {s:?}: use k8s-networkpolicy, networkpolicy or globalnetworkpolicy")
        })
    }
}

/// A policy's identity. Orders by kind, namespace, name: the tie-break between equal orders.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PolicyId {
    pub kind: PolicyKind,
    pub namespace: Option<String>,
    pub name: String,
}

impl fmt::Display for PolicyId {
    /// `kind/namespace/name`, or `kind/name` for a global policy.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{}/{ns}/{}", self.kind, self.name),
            None => write!(f, "{}/{}", self.kind, self.name),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Direction {
    Ingress,
    Egress,
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        })
    }
}

/// One policy, normalized.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub id: PolicyId,
    /// Lower first. Kubernetes policies have 1000, as Calico gives them; a Calico policy
    /// without an order comes last (infinity).
    pub order: f64,
    /// The endpoints the policy applies to.
    pub subject: EndpointSelection,
    /// The rules per direction, in the user's order; `None`: the policy is not of that type
    /// (it does not select endpoints for that direction at all).
    pub ingress: Option<Vec<PolicyRule>>,
    pub egress: Option<Vec<PolicyRule>>,
}

impl Policy {
    pub fn rules(&self, dir: Direction) -> Option<&[PolicyRule]> {
        match dir {
            Direction::Ingress => self.ingress.as_deref(),
            Direction::Egress => self.egress.as_deref(),
        }
    }

    /// Evaluation order: by order, then by id.
    pub fn evaluation_order(a: &Policy, b: &Policy) -> std::cmp::Ordering {
        a.order.total_cmp(&b.order).then_with(|| a.id.cmp(&b.id))
    }
}

/// Which endpoints: those in the namespaces, whose labels match, with the service account.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EndpointSelection {
    pub namespaces: NamespaceMatch,
    pub selector: Selector,
    pub service_accounts: Option<ServiceAccountMatch>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NamespaceMatch {
    Any,
    Named(String),
    /// Namespaces whose labels (with the implicit name labels) match.
    Selector(Selector),
}

/// An endpoint's service account: named one of `names` (if any) and, as Calico's
/// `serviceAccounts.selector`, matching `selector`. margay knows service accounts by name
/// only, so the selector sees the implicit label `projectcalico.org/name: <name>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceAccountMatch {
    pub names: Vec<String>,
    pub selector: Selector,
}

impl fmt::Display for EndpointSelection {
    /// Canonical and readable: `pods app == 'x' in namespace default`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pods {}", self.selector)?;
        match &self.namespaces {
            NamespaceMatch::Any => write!(f, " in any namespace")?,
            NamespaceMatch::Named(ns) => write!(f, " in namespace {ns}")?,
            NamespaceMatch::Selector(s) => write!(f, " in namespaces {s}")?,
        }
        if let Some(sa) = &self.service_accounts {
            write!(f, " with service account")?;
            if !sa.names.is_empty() {
                write!(f, " in {{{}}}", sa.names.join(", "))?;
            }
            if sa.selector != Selector::All || sa.names.is_empty() {
                write!(f, " matching {}", sa.selector)?;
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Action {
    Allow,
    Deny,
    Log,
    Pass,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Allow => "allow",
            Action::Deny => "deny",
            Action::Log => "log",
            Action::Pass => "pass",
        })
    }
}

/// An IP protocol. Always canonical: `Number` never holds one of the named protocols.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "values::ProtocolRepr", into = "values::ProtocolRepr")]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
    Icmp,
    IcmpV6,
    Number(u8),
}

impl Protocol {
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
            Protocol::Icmp => 1,
            Protocol::IcmpV6 => 58,
            Protocol::Number(n) => n,
        }
    }

    pub fn from_number(n: u8) -> Protocol {
        match n {
            6 => Protocol::Tcp,
            17 => Protocol::Udp,
            132 => Protocol::Sctp,
            1 => Protocol::Icmp,
            58 => Protocol::IcmpV6,
            n => Protocol::Number(n),
        }
    }

    /// Whether packets of this protocol carry ports (TCP, UDP, SCTP, UDP-Lite).
    pub fn has_ports(self) -> bool {
        matches!(self.number(), 6 | 17 | 132 | 136)
    }
}

impl fmt::Display for Protocol {
    /// nftables' and Calico's lower-case names; other protocols by number.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Protocol::Tcp => f.write_str("tcp"),
            Protocol::Udp => f.write_str("udp"),
            Protocol::Sctp => f.write_str("sctp"),
            Protocol::Icmp => f.write_str("icmp"),
            Protocol::IcmpV6 => f.write_str("icmpv6"),
            Protocol::Number(136) => f.write_str("udplite"),
            Protocol::Number(n) => write!(f, "{n}"),
        }
    }
}

/// An ICMP type, and code if given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Icmp {
    pub icmp_type: u8,
    pub code: Option<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum IpVersion {
    V4,
    V6,
}

/// One rule, normalized from either dialect.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyRule {
    /// The rule's position in the user's list (a Kubernetes rule with ports of several
    /// protocols becomes one rule per protocol, all with its index).
    pub index: usize,
    pub action: Action,
    pub ip_version: Option<IpVersion>,
    pub protocol: Option<Protocol>,
    pub not_protocol: Option<Protocol>,
    pub icmp: Option<Icmp>,
    pub not_icmp: Option<Icmp>,
    pub source: EntityRule,
    pub destination: EntityRule,
}

/// One side of a rule: the address is in one of `peers` (any address when empty), is not
/// an address of `not_endpoints` nor in `not_nets`, and the port is one of `ports` (any when
/// empty) and none of `not_ports`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EntityRule {
    pub peers: Vec<Peer>,
    pub not_endpoints: Option<EndpointSelection>,
    pub not_nets: Vec<IpNet>,
    pub ports: Vec<PortSpec>,
    /// Numbers only: a named port is refused here (see `calico`).
    pub not_ports: Vec<PortSpec>,
}

impl EntityRule {
    /// Whether this side says nothing about addresses.
    pub fn any_address(&self) -> bool {
        self.peers.is_empty() && self.not_endpoints.is_none() && self.not_nets.is_empty()
    }
}

/// Addresses a rule side accepts.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Peer {
    /// The addresses of the selected endpoints, those within `nets` if it is not empty
    /// (Calico's `selector` with `nets`).
    Endpoints {
        selection: EndpointSelection,
        nets: Vec<IpNet>,
    },
    /// Addresses in `nets` but in none of `except` (Calico's `nets`, Kubernetes' `ipBlock`).
    Nets {
        nets: Vec<IpNet>,
        except: Vec<IpNet>,
    },
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |nets: &[IpNet]| {
            nets.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Peer::Endpoints { selection, nets } if nets.is_empty() => write!(f, "{selection}"),
            Peer::Endpoints { selection, nets } => {
                write!(f, "{selection} within {{{}}}", list(nets))
            }
            Peer::Nets { nets, except } if except.is_empty() => write!(f, "{{{}}}", list(nets)),
            Peer::Nets { nets, except } => {
                write!(f, "{{{}}} except {{{}}}", list(nets), list(except))
            }
        }
    }
}

/// A port, a range of ports (inclusive), or a port's name on the endpoint it reaches.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PortSpec {
    Range(u16, u16),
    Named(String),
}

impl fmt::Display for PortSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortSpec::Range(a, b) if a == b => write!(f, "{a}"),
            PortSpec::Range(a, b) => write!(f, "{a}-{b}"),
            PortSpec::Named(n) => write!(f, "'{n}'"),
        }
    }
}

/// Any document this crate reads.
#[derive(Debug, Clone, PartialEq)]
pub enum Resource {
    Policy(Policy),
    WorkloadEndpoint(WorkloadEndpoint),
    Namespace(Namespace),
}

/// Parses a policy document of any of the three kinds.
pub fn parse_policy(doc: &serde_json::Value) -> Result<Policy, FieldError> {
    match parse_resource(doc)? {
        Resource::Policy(p) => Ok(p),
        _ => Err(FieldError {
            path: "kind".into(),
            reason: "is not a policy: use NetworkPolicy or GlobalNetworkPolicy".into(),
        }),
    }
}

/// Parses any document this crate knows, by `apiVersion` and `kind`.
pub fn parse_resource(doc: &serde_json::Value) -> Result<Resource, FieldError> {
    let root = Field::root(doc);
    let top = root.object()?;
    let api = top.required("apiVersion")?;
    let api_version = api.str()?;
    let kind = top.required("kind")?.str()?;
    match (api_version, kind) {
        ("networking.k8s.io/v1", "NetworkPolicy") => k8s::parse(&top).map(Resource::Policy),
        ("projectcalico.org/v3", "NetworkPolicy") => {
            calico::parse(&top, PolicyKind::NetworkPolicy).map(Resource::Policy)
        }
        ("projectcalico.org/v3", "GlobalNetworkPolicy") => {
            calico::parse(&top, PolicyKind::GlobalNetworkPolicy).map(Resource::Policy)
        }
        ("projectcalico.org/v3", "WorkloadEndpoint") => {
            endpoint::parse_endpoint_object(&top).map(Resource::WorkloadEndpoint)
        }
        ("v1", "Namespace") => endpoint::parse_namespace_object(&top).map(Resource::Namespace),
        ("networking.k8s.io/v1" | "projectcalico.org/v3" | "v1", _) => Err(FieldError {
            path: "kind".into(),
            reason: format!(
                "{kind:?} of {api_version} is not a kind margay's policy reads: use NetworkPolicy \
                 (networking.k8s.io/v1 or projectcalico.org/v3), GlobalNetworkPolicy or \
                 WorkloadEndpoint (projectcalico.org/v3), Namespace (v1)"
            ),
        }),
        _ => Err(api.error(format!(
            "{api_version:?} is not an API margay's policy reads: use networking.k8s.io/v1, \
             projectcalico.org/v3 or v1"
        ))),
    }
}
