//! Network policy, sans-IO: the policy resources users write (Kubernetes and Calico), label
//! selectors, and what each workload endpoint must enforce. No I/O, no runtime, no kernel:
//! bgpd feeds it the cluster's resources, routewriter enforces what it computes.
//!
//! - `selector`: Calico's selector language and Kubernetes' label selectors.
//! - `resource`: the documents users write, checked field by field and normalized.
//! - `addrset`: sets of addresses as disjoint intervals (cidr minus except, unions).
//! - `compile`: what one node enforces, per interface, with the address sets it needs.
//! - `evaluate`: the verdict of the compiled form for one packet.
//! - `reference`: the verdict straight from the resources' definitions (tests compare them).
//! - `explain`: which policies select an endpoint and what they allow, for operators.

pub mod addrset;
pub mod compile;
pub mod evaluate;
pub mod explain;
pub mod reference;
pub mod resource;
pub mod selector;

pub use compile::{Cluster, NodePolicy, compile};
pub use evaluate::{Packet, Verdict, verdict};
pub use explain::{Explanation, explain};
pub use resource::{
    Action, Direction, FieldError, Icmp, IpVersion, NamedPort, Namespace, Policy, PolicyId,
    PolicyKind, Protocol, WorkloadEndpoint, parse_namespace, parse_policy, parse_resource,
    parse_workload_endpoint,
};
