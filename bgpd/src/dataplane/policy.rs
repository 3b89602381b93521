//! The policy part of the desired state: what `policy::compile` says this node enforces, as
//! Dataplane items (`EndpointPolicy` per selected pod interface, `PolicySet` per address set
//! its rules name). Pure; the brain merges these into the IPAM part it publishes.

use policy::compile::{AddrMatch, EndpointPolicy, NodePolicy, PortRange, Rule};
use policy::resource::{Action, Direction, IpVersion};
use proto::v1 as pb;

use super::desired::{Desired, ItemKey};

fn ranges(p: &[PortRange]) -> Vec<pb::PortRange> {
    p.iter()
        .map(|r| pb::PortRange {
            first: r.first.into(),
            last: r.last.into(),
        })
        .collect()
}

fn set(m: &Option<policy::compile::SetName>) -> String {
    m.as_ref().map(|s| s.0.clone()).unwrap_or_default()
}

fn rule(r: &Rule, dir: Direction) -> pb::PolicyRule {
    let AddrMatch {
        set: src_set,
        not_set: not_src_set,
    } = &r.src;
    let AddrMatch {
        set: dst_set,
        not_set: not_dst_set,
    } = &r.dst;
    pb::PolicyRule {
        action: match r.action {
            Action::Allow => pb::PolicyAction::Allow,
            Action::Deny => pb::PolicyAction::Deny,
            Action::Log => pb::PolicyAction::Log,
            Action::Pass => pb::PolicyAction::Pass,
        } as i32,
        protocol: r.protocol.map(|p| p.number().into()),
        not_protocol: r.not_protocol.map(|p| p.number().into()),
        src_set: set(src_set),
        not_src_set: set(not_src_set),
        dst_set: set(dst_set),
        not_dst_set: set(not_dst_set),
        src_ports: ranges(&r.src_ports.ports),
        not_src_ports: ranges(&r.src_ports.not_ports),
        dst_ports: ranges(&r.dst_ports.ports),
        not_dst_ports: ranges(&r.dst_ports.not_ports),
        icmp_type: r.icmp.map(|i| i.icmp_type.into()),
        icmp_code: r.icmp.and_then(|i| i.code).map(Into::into),
        not_icmp_type: r.not_icmp.map(|i| i.icmp_type.into()),
        not_icmp_code: r.not_icmp.and_then(|i| i.code).map(Into::into),
        ip_version: r.ip_version.map(|v| match v {
            IpVersion::V4 => 4,
            IpVersion::V6 => 6,
        }),
        origin: format!("{} {dir}[{}]", r.origin.policy, r.origin.rule),
    }
}

fn endpoint(interface: &str, e: &EndpointPolicy) -> pb::EndpointPolicy {
    let rules = |dir: Direction| -> Vec<pb::PolicyRule> {
        e.rules(dir)
            .unwrap_or_default()
            .iter()
            .map(|r| rule(r, dir))
            .collect()
    };
    pb::EndpointPolicy {
        interface: interface.to_owned(),
        ingress_selected: e.ingress.is_some(),
        ingress: rules(Direction::Ingress),
        egress_selected: e.egress.is_some(),
        egress: rules(Direction::Egress),
    }
}

/// Adds the node's policy to `desired`: only interfaces some policy selects (the others need
/// nothing written), and every set their rules name.
pub fn extend(desired: &mut Desired, np: &NodePolicy) {
    use pb::desired_item::Item;
    for (interface, e) in &np.endpoints {
        if e.ingress.is_none() && e.egress.is_none() {
            continue;
        }
        desired.insert(
            ItemKey::EndpointPolicy(interface.clone()),
            pb::DesiredItem {
                item: Some(Item::EndpointPolicy(endpoint(interface, e))),
            },
        );
    }
    for (name, members) in &np.sets {
        desired.insert(
            ItemKey::PolicySet(name.0.clone()),
            pb::DesiredItem {
                item: Some(Item::PolicySet(pb::PolicySet {
                    name: name.0.clone(),
                    members: members.nets().map(|n| n.to_string()).collect(),
                })),
            },
        );
    }
}
