//! The verdict of a compiled `NodePolicy` for one packet on one interface: what the
//! nftables rules the renderer writes must decide. Used by tests (against `reference`) and
//! by `bgpctl`-side checks; it follows `compile`'s semantics to the letter.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::compile::{AddrMatch, NodePolicy, PortMatch, Rule, RuleOrigin};
use crate::resource::{Action, Direction, IpVersion, Protocol};

/// The parts of a packet policy looks at. Ports count only for protocols that have them,
/// the ICMP type and code only for ICMP and ICMPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub protocol: Protocol,
    pub src_port: u16,
    pub dst_port: u16,
    pub icmp_type: u8,
    pub icmp_code: u8,
}

impl Packet {
    pub fn tcp(src: IpAddr, dst: IpAddr, dst_port: u16) -> Packet {
        Packet::ports(Protocol::Tcp, src, dst, 40000, dst_port)
    }

    pub fn udp(src: IpAddr, dst: IpAddr, dst_port: u16) -> Packet {
        Packet::ports(Protocol::Udp, src, dst, 40000, dst_port)
    }

    pub fn ports(protocol: Protocol, src: IpAddr, dst: IpAddr, sport: u16, dport: u16) -> Packet {
        Packet {
            src,
            dst,
            protocol,
            src_port: sport,
            dst_port: dport,
            icmp_type: 0,
            icmp_code: 0,
        }
    }

    /// An echo request (ICMP type 8, or ICMPv6 type 128 for IPv6 addresses).
    pub fn ping(src: IpAddr, dst: IpAddr) -> Packet {
        let (protocol, icmp_type) = if src.is_ipv4() {
            (Protocol::Icmp, 8)
        } else {
            (Protocol::IcmpV6, 128)
        };
        Packet {
            src,
            dst,
            protocol,
            src_port: 0,
            dst_port: 0,
            icmp_type,
            icmp_code: 0,
        }
    }

    pub fn version(&self) -> IpVersion {
        if self.src.is_ipv4() {
            IpVersion::V4
        } else {
            IpVersion::V6
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Verdict {
    Allow,
    Deny,
}

/// A verdict and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    pub reason: Reason,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// No policy selects the endpoint in this direction (or the interface is not one of
    /// the node's endpoints).
    NotSelected,
    /// This rule's Allow, Deny or Pass decided.
    Rule(RuleOrigin, Action),
    /// Policies select the endpoint and none of their rules decided.
    DefaultDeny,
}

/// The verdict for `pkt` crossing `interface` in `dir` (ingress: to the endpoint).
pub fn verdict(np: &NodePolicy, interface: &str, dir: Direction, pkt: &Packet) -> Verdict {
    decide(np, interface, dir, pkt).verdict
}

pub fn decide(np: &NodePolicy, interface: &str, dir: Direction, pkt: &Packet) -> Decision {
    let rules = np.endpoints.get(interface).and_then(|ep| ep.rules(dir));
    let Some(rules) = rules else {
        return Decision {
            verdict: Verdict::Allow,
            reason: Reason::NotSelected,
        };
    };
    for rule in rules {
        if !matches(np, rule, pkt) {
            continue;
        }
        let verdict = match rule.action {
            Action::Log => continue,
            Action::Allow => Verdict::Allow,
            Action::Deny => Verdict::Deny,
            // The end of the only tier: the namespace's profile allows.
            Action::Pass => Verdict::Allow,
        };
        return Decision {
            verdict,
            reason: Reason::Rule(rule.origin.clone(), rule.action),
        };
    }
    Decision {
        verdict: Verdict::Deny,
        reason: Reason::DefaultDeny,
    }
}

fn matches(np: &NodePolicy, rule: &Rule, pkt: &Packet) -> bool {
    let proto = pkt.protocol.number();
    let is_icmp = matches!(pkt.protocol, Protocol::Icmp | Protocol::IcmpV6);
    let icmp_hit = |icmp: &crate::resource::Icmp| {
        is_icmp && icmp.icmp_type == pkt.icmp_type && icmp.code.is_none_or(|c| c == pkt.icmp_code)
    };
    rule.ip_version.is_none_or(|v| v == pkt.version())
        && rule.protocol.is_none_or(|p| p.number() == proto)
        && rule.not_protocol.is_none_or(|p| p.number() != proto)
        && rule.icmp.as_ref().is_none_or(icmp_hit)
        && !rule.not_icmp.as_ref().is_some_and(icmp_hit)
        && addr_matches(np, &rule.src, pkt.src)
        && addr_matches(np, &rule.dst, pkt.dst)
        && ports_match(&rule.src_ports, pkt.protocol, pkt.src_port)
        && ports_match(&rule.dst_ports, pkt.protocol, pkt.dst_port)
}

fn addr_matches(np: &NodePolicy, m: &AddrMatch, addr: IpAddr) -> bool {
    // A set the policy does not carry is empty.
    let in_set = |name| np.sets.get(name).is_some_and(|s| s.contains(addr));
    m.set.as_ref().is_none_or(in_set) && !m.not_set.as_ref().is_some_and(in_set)
}

fn ports_match(m: &PortMatch, protocol: Protocol, port: u16) -> bool {
    if m.ports.is_empty() && m.not_ports.is_empty() {
        return true;
    }
    protocol.has_ports()
        && (m.ports.is_empty() || m.ports.iter().any(|r| r.contains(port)))
        && !m.not_ports.iter().any(|r| r.contains(port))
}
