//! The BGP part of the desired kernel state: after each RIB operation, the routes the kernel
//! policy (`bgp::policy::Policy::kernel`) derives from the changed best routes, handed to the
//! [`KernelSink`](super::KernelSink) as typed [`KernelRoute`]s (the `Hub` turns them into the
//! contract's messages). `in_kernel` remembers what the sink holds, so that a best route
//! that changed but was never programmed costs the sink nothing.

use bgp::policy::KernelVia;
use bgp::rib::{RibPrefix, Source, next_hop_addr};
use bgp_wire::Prefix;
use ipnet::IpNet;

use super::Speaker;
use crate::dataplane::item::{KernelRoute, Via};

impl Speaker {
    /// Tell the kernel sink what changed in the Loc-RIBs (everything, with `replace`).
    pub(super) fn publish_kernel(&mut self, replace: bool) {
        let Some(sink) = self.config.kernel.clone() else {
            return;
        };
        let changed: Vec<Prefix> = (self.rib.take_loc_changes().into_iter().map(Prefix::V4))
            .chain(self.rib6.take_loc_changes().into_iter().map(Prefix::V6))
            .collect();
        if !replace && self.in_kernel.is_empty() && !self.rib.policy().programs_any() {
            // Nothing is programmed and nothing can be: no route to look at (a full table
            // from a peer whose routes policy keeps out of the kernel costs nothing here).
            return;
        }
        let prefixes: Vec<Prefix> = if replace {
            (self.rib.loc_rib().map(|r| r.prefix.any()))
                .chain(self.rib6.loc_rib().map(|r| r.prefix.any()))
                .collect()
        } else {
            changed
        };
        if prefixes.is_empty() && !replace {
            return;
        }
        let changes = self.kernel_changes(prefixes, replace);
        if changes.is_empty() && !replace {
            return;
        }
        sink.bgp_routes(changes, replace);
    }

    /// The sink's changes for `prefixes`: the route of each that has one, the removal of
    /// each that had one and has none now (with `replace`, the routes alone).
    fn kernel_changes(
        &mut self,
        prefixes: Vec<Prefix>,
        replace: bool,
    ) -> Vec<(IpNet, Option<KernelRoute>)> {
        let routes: Vec<(Prefix, Option<KernelRoute>)> = prefixes
            .into_iter()
            .map(|p| (p, self.kernel_route(p)))
            .collect();
        if replace {
            self.in_kernel.clear();
        }
        let mut changes = Vec::with_capacity(routes.len());
        for (p, route) in routes {
            let was = if route.is_some() {
                !self.in_kernel.insert(p)
            } else {
                self.in_kernel.remove(&p)
            };
            if route.is_none() && (replace || !was) {
                continue;
            }
            let Ok(net) = IpNet::new(p.addr(), p.prefix_len()) else {
                continue;
            };
            changes.push((net, route));
        }
        changes
    }

    /// The kernel route the policy derives from the best route for `p`, if any.
    fn kernel_route(&self, p: Prefix) -> Option<KernelRoute> {
        let (src, attrs) = match p {
            Prefix::V4(q) => self.rib.best(&q)?,
            Prefix::V6(q) => self.rib6.best(&q)?,
        };
        let Source::Peer(q) = src else { return None };
        let next_hop = next_hop_addr(attrs)?;
        // routewriter programs each family via a gateway of its own family: an IPv4 route
        // via an IPv6 next hop (RFC 8950) stays out of the kernel table rather than be
        // refused there.
        if p.addr().is_ipv4() != next_hop.is_ipv4() {
            return None;
        }
        let (via, reason) =
            self.rib
                .policy()
                .kernel(p, self.rib.route_source(src), Some(next_hop))?;
        let from = self
            .by_id
            .get(&q)
            .and_then(|a| self.peers.get(a))
            .map(|e| e.spec.name())
            .unwrap_or_default();
        Some(KernelRoute {
            destination: IpNet::new(p.addr(), p.prefix_len()).ok()?,
            via: match via {
                KernelVia::NextHop => Via::Gateway(next_hop),
                KernelVia::Ipip => Via::Ipip(next_hop),
            },
            source: format!("bgp from {from} ({reason})"),
        })
    }
}
