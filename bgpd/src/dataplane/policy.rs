//! The policy part of the desired state: what `policy::compile` says this node enforces, as
//! Dataplane items (`EndpointPolicy` per selected pod interface, `PolicySet` per address set
//! its rules name). Pure; the brain merges these into the IPAM part it publishes.

use policy::compile::{AddrMatch, EndpointPolicy, NodePolicy, PortRange, Rule};
use policy::resource::{Action, Direction, IpVersion};
use proto::v1 as pb;

use super::item::{Desired, DesiredItem, ItemKey};

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
    for (interface, e) in &np.endpoints {
        if e.ingress.is_none() && e.egress.is_none() {
            continue;
        }
        desired.insert(
            ItemKey::EndpointPolicy(interface.clone()),
            DesiredItem::EndpointPolicy(endpoint(interface, e)),
        );
    }
    for (name, members) in &np.sets {
        desired.insert(
            ItemKey::PolicySet(name.0.clone()),
            DesiredItem::PolicySet(pb::PolicySet {
                name: name.0.clone(),
                members: members.nets().map(|n| n.to_string()).collect(),
            }),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use policy::compile::{Cluster, compile};
    use policy::resource::{Resource, parse_resource};
    use serde_json::json;

    fn endpoint(name: &str, node: &str, iface: &str, addr: &str, app: &str) -> Resource {
        parse_resource(&json!({
            "apiVersion": "projectcalico.org/v3", "kind": "WorkloadEndpoint",
            "metadata": {"name": name, "namespace": "prod", "labels": {"app": app}},
            "spec": {"node": node, "pod": name, "interfaceName": iface, "ipNetworks": [addr]}
        }))
        .unwrap()
    }

    #[test]
    fn the_compiled_policy_becomes_items_of_selected_interfaces_and_their_sets() {
        let mut docs = crate::cluster::policy::PolicyDocs::default();
        docs.push(endpoint("web", "n1", "caliweb", "10.0.0.1/32", "web"));
        docs.push(endpoint("idle", "n1", "caliidle", "10.0.0.3/32", "idle"));
        docs.push(endpoint("cli", "n2", "calicli", "10.0.1.2/32", "client"));
        docs.push(
            parse_resource(&json!({
                "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": "web", "namespace": "prod"},
                "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                  "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                               "ports": [{"protocol": "TCP", "port": 80, "endPort": 90}]}]}
            }))
            .unwrap(),
        );
        let cluster: Cluster = docs.cluster();
        let mut d = Desired::new();
        extend(&mut d, &compile(&cluster, "n1"));
        let keys: Vec<&ItemKey> = d.keys().collect();
        assert_eq!(keys.len(), 2, "{keys:?}");
        let Some(DesiredItem::EndpointPolicy(e)) =
            d.get(&ItemKey::EndpointPolicy("caliweb".into()))
        else {
            panic!("no policy for caliweb: {keys:?}");
        };
        assert!(e.ingress_selected && !e.egress_selected);
        let r = &e.ingress[0];
        assert_eq!(r.action, pb::PolicyAction::Allow as i32);
        assert_eq!(r.protocol, Some(6));
        assert_eq!(
            r.dst_ports,
            vec![pb::PortRange {
                first: 80,
                last: 90
            }]
        );
        assert!(r.origin.ends_with("prod/web ingress[0]"), "{}", r.origin);
        let set = ItemKey::PolicySet(r.src_set.clone());
        let Some(DesiredItem::PolicySet(s)) = d.get(&set) else {
            panic!("the rule's set {} is not desired", r.src_set);
        };
        assert_eq!(s.members, vec!["10.0.1.2/32"]);
        // The node of the client has nothing selected: nothing to write.
        let mut d2 = Desired::new();
        extend(&mut d2, &compile(&cluster, "n2"));
        assert!(d2.is_empty());
    }
}
