//! The `Pools`, `Nodes` and `Ipam` services: thin translations onto `ipam::allocator`, over
//! the datastore bgpd is connected to (UNAVAILABLE while it is not). Addresses are handed out
//! once this node and its default pools are registered (a request waits for that a moment).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use ::datastore::{Resources, Store, Version};
use ipam::allocator::{AssignRequest, Ipam, ReleaseRequest};
use ipam::pod_annotations;
use proto::v1 as pb;
use proto::v1::ipam_server::Ipam as IpamApi;
use proto::v1::nodes_server::Nodes as NodesApi;
use proto::v1::pools_server::Pools as PoolsApi;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::convert::{self, invalid, parse_addr, required, status};
use crate::datastore::DatastoreHandle;

/// Serves the three IPAM-side services; cheap to clone.
#[derive(Clone)]
pub struct IpamService {
    datastore: DatastoreHandle,
    /// True once the node and the default pools are in the datastore.
    registered: watch::Receiver<bool>,
    /// This daemon's node: the default for requests that name none.
    node: String,
}

type Reply<T> = Result<Response<T>, Status>;

/// How long an address request at start-up waits for the node's registration.
const REGISTRATION_WAIT: Duration = Duration::from_secs(5);

/// Whether `registered` is (or within `wait` becomes) true.
async fn registration_done(registered: &watch::Receiver<bool>, wait: Duration) -> bool {
    let mut rx = registered.clone();
    matches!(
        tokio::time::timeout(wait, rx.wait_for(|done| *done)).await,
        Ok(Ok(_))
    )
}

impl IpamService {
    pub fn new(
        datastore: DatastoreHandle,
        registered: watch::Receiver<bool>,
        node: String,
    ) -> Self {
        Self {
            datastore,
            registered,
            node,
        }
    }

    /// Before the first registration the default pools may not exist yet: an address asked
    /// for then would be "none available" (a CNI ADD right after the node started). It waits
    /// a moment, then is told to try again (CNI code 11), which a runtime does.
    async fn registered(&self) -> Result<(), Status> {
        if registration_done(&self.registered, REGISTRATION_WAIT).await {
            return Ok(());
        }
        Err(Status::unavailable(format!(
            "node {} and its default pools are not registered in datastore {} yet (bgpd is starting, or cannot write there: see its log); try again",
            self.node,
            self.datastore.describe()
        )))
    }

    /// The allocator of the current store (one per store, shared by every request), or
    /// `unavailable` naming the datastore.
    fn ipam(&self) -> Result<Arc<Ipam<Store>>, Status> {
        self.datastore
            .ipam()
            .ok_or_else(|| convert::unavailable(&self.datastore))
    }

    /// The current store, or `unavailable` naming the datastore.
    fn store(&self) -> Result<Store, Status> {
        self.datastore
            .store()
            .ok_or_else(|| convert::unavailable(&self.datastore))
    }

    fn node_or_default<'a>(&'a self, node: &'a str) -> &'a str {
        if node.is_empty() { &self.node } else { node }
    }
}

#[tonic::async_trait]
impl PoolsApi for IpamService {
    async fn create_pool(&self, r: Request<pb::CreatePoolRequest>) -> Reply<pb::IpPool> {
        let p = r
            .into_inner()
            .pool
            .ok_or_else(|| invalid("pool", "missing"))?;
        let pool = convert::pool_from(&p)?;
        let ipam = self.ipam()?;
        let rev = ipam.create_pool(&pool).await.map_err(status)?;
        Ok(Response::new(convert::pool_to(&pool, rev)))
    }

    async fn update_pool(&self, r: Request<pb::UpdatePoolRequest>) -> Reply<pb::IpPool> {
        let p = r
            .into_inner()
            .pool
            .ok_or_else(|| invalid("pool", "missing"))?;
        let pool = convert::pool_from(&p)?;
        let expected = (p.revision != 0).then_some(Version::from_wire(p.revision));
        let rev = self
            .ipam()?
            .update_pool(&pool, expected)
            .await
            .map_err(status)?;
        Ok(Response::new(convert::pool_to(&pool, rev)))
    }

    async fn delete_pool(
        &self,
        r: Request<pb::DeletePoolRequest>,
    ) -> Reply<pb::DeletePoolResponse> {
        self.ipam()?
            .delete_pool(required("name", &r.into_inner().name)?)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::DeletePoolResponse {}))
    }

    async fn get_pool(&self, r: Request<pb::GetPoolRequest>) -> Reply<pb::IpPool> {
        let (pool, rev) = self
            .ipam()?
            .get_pool(required("name", &r.into_inner().name)?)
            .await
            .map_err(status)?;
        Ok(Response::new(convert::pool_to(&pool, rev)))
    }

    async fn list_pools(&self, _r: Request<pb::ListPoolsRequest>) -> Reply<pb::ListPoolsResponse> {
        let pools = self.ipam()?.list_pools().await.map_err(status)?;
        Ok(Response::new(pb::ListPoolsResponse {
            pools: pools.iter().map(|(p, r)| convert::pool_to(p, *r)).collect(),
        }))
    }
}

#[tonic::async_trait]
impl NodesApi for IpamService {
    async fn register_node(&self, r: Request<pb::RegisterNodeRequest>) -> Reply<pb::Node> {
        let n = r
            .into_inner()
            .node
            .ok_or_else(|| invalid("node", "missing"))?;
        let node = convert::node_from(&n)?;
        let expected = (n.revision != 0).then_some(Version::from_wire(n.revision));
        let rev = Resources::new(&self.store()?)
            .register_node(&node, expected)
            .await
            .map_err(status)?;
        Ok(Response::new(convert::node_to(&node, rev)))
    }

    async fn get_node(&self, r: Request<pb::GetNodeRequest>) -> Reply<pb::Node> {
        let (node, rev) = Resources::new(&self.store()?)
            .get_node(required("name", &r.into_inner().name)?)
            .await
            .map_err(status)?;
        Ok(Response::new(convert::node_to(&node, rev)))
    }

    async fn list_nodes(&self, _r: Request<pb::ListNodesRequest>) -> Reply<pb::ListNodesResponse> {
        let nodes = Resources::new(&self.store()?)
            .list_nodes()
            .await
            .map_err(status)?;
        Ok(Response::new(pb::ListNodesResponse {
            nodes: nodes.iter().map(|(n, r)| convert::node_to(n, *r)).collect(),
        }))
    }

    async fn delete_node(
        &self,
        r: Request<pb::DeleteNodeRequest>,
    ) -> Reply<pb::DeleteNodeResponse> {
        let name = r.into_inner().name;
        required("name", &name)?;
        let ipam = self.ipam()?;
        Resources::new(ipam.store())
            .get_node(&name)
            .await
            .map_err(status)?;
        let (blocks, addresses) = ipam.delete_node(&name).await.map_err(status)?;
        Ok(Response::new(pb::DeleteNodeResponse {
            released_blocks: blocks.iter().map(ToString::to_string).collect(),
            released_addresses: addresses.iter().map(ToString::to_string).collect(),
        }))
    }
}

#[tonic::async_trait]
impl IpamApi for IpamService {
    async fn auto_assign(
        &self,
        r: Request<pb::AutoAssignRequest>,
    ) -> Reply<pb::AutoAssignResponse> {
        let r = r.into_inner();
        let use_tunnel = match pb::AllowedUse::try_from(r.r#use) {
            Ok(pb::AllowedUse::Tunnel) => true,
            Ok(_) => false,
            Err(_) => return Err(invalid("use", format!("unknown use {}", r.r#use))),
        };
        let req = AssignRequest {
            handle: r.handle,
            attrs: r.attributes.into_iter().collect(),
            num_v4: r.num_ipv4,
            num_v6: r.num_ipv6,
            node: self.node_or_default(&r.node).to_owned(),
            v4_pools: r.ipv4_pools,
            v6_pools: r.ipv6_pools,
            use_tunnel,
            strict_affinity: r.strict_affinity,
        };
        let ipam = self.ipam()?;
        self.registered().await?;
        let (v4, v6) = ipam.auto_assign(&req).await.map_err(status)?;
        Ok(Response::new(pb::AutoAssignResponse {
            ipv4: v4.iter().map(convert::allocation_to).collect(),
            ipv6: v6.iter().map(convert::allocation_to).collect(),
        }))
    }

    async fn assign_ip(&self, r: Request<pb::AssignIpRequest>) -> Reply<pb::Allocation> {
        let r = r.into_inner();
        let address = parse_addr("address", &r.address)?;
        let attrs = r.attributes.into_iter().collect();
        let node = self.node_or_default(&r.node).to_owned();
        let ipam = self.ipam()?;
        self.registered().await?;
        let a = ipam
            .assign_ip(address, &r.handle, &attrs, &node)
            .await
            .map_err(status)?;
        Ok(Response::new(convert::allocation_to(&a)))
    }

    async fn release_by_handle(
        &self,
        r: Request<pb::ReleaseByHandleRequest>,
    ) -> Reply<pb::ReleaseResponse> {
        let handle = r.into_inner().handle;
        if handle.is_empty() {
            return Err(invalid("handle", "must not be empty"));
        }
        let freed = self
            .ipam()?
            .release_by_handle(&handle)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::ReleaseResponse {
            released: freed.iter().map(ToString::to_string).collect(),
        }))
    }

    async fn release_ips(&self, r: Request<pb::ReleaseIpsRequest>) -> Reply<pb::ReleaseResponse> {
        let releases = r
            .into_inner()
            .ips
            .into_iter()
            .enumerate()
            .map(|(i, ip)| {
                Ok(ReleaseRequest {
                    address: parse_addr(&format!("ips[{i}].address"), &ip.address)?,
                    handle: (!ip.handle.is_empty()).then_some(ip.handle),
                    seq: (ip.sequence != 0).then_some(ip.sequence),
                })
            })
            .collect::<Result<Vec<_>, Status>>()?;
        let freed = self.ipam()?.release_ips(&releases).await.map_err(status)?;
        Ok(Response::new(pb::ReleaseResponse {
            released: freed.iter().map(ToString::to_string).collect(),
        }))
    }

    async fn get_handle(&self, r: Request<pb::GetHandleRequest>) -> Reply<pb::HandleAllocations> {
        let handle = r.into_inner().handle;
        required("handle", &handle)?;
        let allocations = self
            .ipam()?
            .handle_allocations(&handle)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::HandleAllocations {
            handle,
            allocations: allocations.iter().map(convert::allocation_to).collect(),
        }))
    }

    async fn get_address(&self, r: Request<pb::GetAddressRequest>) -> Reply<pb::Allocation> {
        let text = r.into_inner().address;
        required("address", &text)?;
        let address: std::net::IpAddr = text.trim().parse().map_err(|_| {
            Status::invalid_argument(format!("address: {text:?} is not an IP address"))
        })?;
        match self
            .ipam()?
            .address_allocation(address)
            .await
            .map_err(status)?
        {
            Some(a) => Ok(Response::new(convert::allocation_to(&a))),
            None => Err(Status::not_found(format!(
                "address: {address} is not allocated"
            ))),
        }
    }

    async fn show_blocks(
        &self,
        r: Request<pb::ShowBlocksRequest>,
    ) -> Reply<pb::ShowBlocksResponse> {
        let r = r.into_inner();
        let (pools, blocks) = self.ipam()?.usage(&r.pool).await.map_err(status)?;
        if !r.pool.trim().is_empty() && pools.is_empty() {
            return Err(Status::not_found(format!(
                "pool: no pool named or with CIDR {:?}",
                r.pool
            )));
        }
        Ok(Response::new(pb::ShowBlocksResponse {
            pools: pools.iter().map(convert::pool_usage_to).collect(),
            blocks: if r.show_blocks {
                blocks.iter().map(convert::block_usage_to).collect()
            } else {
                vec![]
            },
        }))
    }

    async fn garbage_collect(
        &self,
        r: Request<pb::GarbageCollectRequest>,
    ) -> Reply<pb::GarbageCollectResponse> {
        let r = r.into_inner();
        if !r.node.is_empty() {
            ::datastore::model::validate_name("node", &r.node).map_err(status)?;
        }
        let node = self.node_or_default(&r.node).to_owned();
        let live: HashSet<String> = r.live_handles.into_iter().collect();
        let ipam = self.ipam()?;
        let released = ipam
            .gc(&node, &live, &r.handle_prefix, r.dry_run)
            .await
            .map_err(status)?;
        if !r.dry_run {
            // The pods whose addresses went leave network policy too.
            let endpoints = super::policy_service::collect_endpoints(&ipam, &node)
                .await
                .map_err(status)?;
            for e in &endpoints {
                tracing::info!(endpoint = %e, "GC removed a workload endpoint without addresses");
            }
        }
        Ok(Response::new(pb::GarbageCollectResponse {
            released: released
                .into_iter()
                .map(|(handle, addrs)| pb::ReleasedHandle {
                    handle,
                    addresses: addrs.iter().map(ToString::to_string).collect(),
                })
                .collect(),
        }))
    }

    async fn check(&self, _r: Request<pb::CheckRequest>) -> Reply<pb::CheckResponse> {
        let report = self.ipam()?.check().await.map_err(status)?;
        Ok(Response::new(pb::CheckResponse {
            allocations_checked: report.allocations,
            handles_checked: report.handles,
            problems: report.problems,
        }))
    }

    async fn pod_addressing(
        &self,
        r: Request<pb::PodAddressingRequest>,
    ) -> Reply<pb::PodAddressingResponse> {
        let r = r.into_inner();
        let namespace = required("namespace", &r.namespace)?;
        let pod = required("pod", &r.pod)?;
        let ipam = self.ipam()?;
        let Some(kube) = ipam.store().as_kubernetes() else {
            return Ok(Response::new(pb::PodAddressingResponse::default()));
        };
        let Some((of_pod, of_namespace)) =
            kube.pod_annotations(namespace, pod).await.map_err(status)?
        else {
            return Ok(Response::new(pb::PodAddressingResponse::default()));
        };
        let asked = match pod_annotations::read(namespace, pod, &of_pod, &of_namespace) {
            Ok(asked) => asked,
            Err(e) => return Err(self.refused(kube, namespace, pod, e)),
        };
        if asked != pod_annotations::PodAddressing::default() {
            let pools: Vec<_> = ipam
                .list_pools()
                .await
                .map_err(status)?
                .into_iter()
                .map(|(p, _)| p)
                .collect();
            if let Err(e) = asked.check(&pools) {
                return Err(self.refused(kube, namespace, pod, e));
            }
        }
        let to = |a: Option<pod_annotations::Annotated>| {
            a.map(|a| pb::AnnotatedValues {
                values: a.values,
                source: a.source,
            })
        };
        Ok(Response::new(pb::PodAddressingResponse {
            ipv4_pools: to(asked.ipv4_pools),
            ipv6_pools: to(asked.ipv6_pools),
            ip_addrs: to(asked.ip_addrs),
        }))
    }
}

impl IpamService {
    /// The refusal of a Pod's IPAM annotations, also reported (`crate::warnings`: an Event
    /// on the Pod).
    fn refused(
        &self,
        kube: &::datastore::kubernetes::KubeStore,
        namespace: &str,
        pod: &str,
        e: ipam::IpamError,
    ) -> Status {
        crate::warnings::report(
            Some(kube),
            ::datastore::kubernetes::EventSubject::pod(namespace, pod),
            crate::warnings::Reason::InvalidIpamAnnotation,
            vec![e.to_string()],
            &self.node,
        );
        status(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn address_requests_wait_for_the_registration_then_give_up() {
        let (tx, rx) = watch::channel(false);
        let wait = Duration::from_millis(200);
        // Not yet registered, and nothing changes: no.
        assert!(!registration_done(&rx, wait).await);
        // Registered while waiting: yes, without waiting it all out.
        let started = tokio::time::Instant::now();
        tokio::spawn({
            let tx = tx.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                tx.send_replace(true);
            }
        });
        assert!(registration_done(&rx, wait).await);
        assert!(started.elapsed() < wait);
        // Registered before: at once.
        assert!(registration_done(&rx, Duration::ZERO).await);
        // The registration task gone before registering: no.
        let (tx, rx) = watch::channel(false);
        drop(tx);
        assert!(!registration_done(&rx, wait).await);
    }
}
