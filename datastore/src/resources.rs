//! Typed access to resources through the core contract: each call is one object's get,
//! list or compare-and-swap write, so it works the same on every backend. Beside the generic
//! calls, the cluster's own resources that every bgpd reads live (nodes, the BGP
//! configuration, BGP peers and filters) with their validation and retries; IPAM's (pools,
//! blocks, affinities, handles) are the `ipam` crate's.

use crate::contract::{Datastore, StoreError, Version};
use crate::error::ResourceError;
use crate::model::{BgpConfiguration, BgpFilter, BgpPeer, Node, validate_name};
use crate::resource::{Resource, decode, encode};

/// How often a read-modify-write that lost a race is tried again.
pub const RETRIES: u32 = 100;

/// Typed resources over the core contract: each call is one object's get, list or
/// compare-and-swap write, so it works the same on every backend.
pub struct Resources<'a, D> {
    store: &'a D,
}

impl<'a, D: Datastore> Resources<'a, D> {
    pub fn new(store: &'a D) -> Self {
        Resources { store }
    }

    /// The resource named `name` and its version, if it exists.
    pub async fn get<T: Resource>(
        &self,
        name: &str,
    ) -> Result<Option<(T, Version)>, ResourceError> {
        match self.store.get(T::kind(), name).await? {
            Some(o) => Ok(Some((decode(&o.value)?, o.version))),
            None => Ok(None),
        }
    }

    /// Every resource of the kind whose name starts with `name_prefix` ("" for all), by name.
    pub async fn list<T: Resource>(
        &self,
        name_prefix: &str,
    ) -> Result<Vec<(T, Version)>, ResourceError> {
        let list = self.store.list(T::kind(), name_prefix).await?;
        list.items
            .into_iter()
            .map(|o| Ok((decode(&o.value)?, o.version)))
            .collect()
    }

    /// Writes the resource: created when `expected` is `None` (`AlreadyExists` if it is
    /// there), else replaced if still at `expected` (`Stale` otherwise). Returns its version.
    pub async fn put<T: Resource>(
        &self,
        name: &str,
        resource: &T,
        expected: Option<Version>,
    ) -> Result<Version, ResourceError> {
        let value = encode(resource);
        let written = match expected {
            None => self.store.create(T::kind(), name, value).await,
            Some(v) => self.store.update(T::kind(), name, value, v).await,
        };
        written.map_err(|e| lost_race::<T>(e, name, expected))
    }

    /// Deletes the resource if still at `expected` (`Stale` otherwise).
    pub async fn delete<T: Resource>(
        &self,
        name: &str,
        expected: Version,
    ) -> Result<(), ResourceError> {
        self.store
            .delete(T::kind(), name, expected)
            .await
            .map_err(|e| lost_race::<T>(e, name, Some(expected)))
    }
}

/// A lost compare-and-swap in the words of the caller's intent.
fn lost_race<T: Resource>(e: StoreError, name: &str, expected: Option<Version>) -> ResourceError {
    match (e, expected) {
        (StoreError::Conflict { .. }, None) => {
            ResourceError::AlreadyExists(format!("{} {name}", T::KIND))
        }
        (StoreError::Conflict { .. }, Some(_)) => {
            ResourceError::Stale(format!("{} {name}", T::KIND))
        }
        (e, _) => e.into(),
    }
}

// ---- the cluster's resources ----

impl<D: Datastore> Resources<'_, D> {
    /// Writes `resource` over whatever is stored (or creates it), re-reading on a lost race.
    async fn put_latest<T: Resource>(
        &self,
        name: &str,
        resource: &T,
        what: &str,
    ) -> Result<Version, ResourceError> {
        for _ in 0..RETRIES {
            let current = self.get::<T>(name).await?.map(|(_, v)| v);
            match self.put(name, resource, current).await {
                Err(ResourceError::AlreadyExists(_) | ResourceError::Stale(_)) => continue,
                other => return other,
            }
        }
        Err(ResourceError::Contention {
            what: what.to_owned(),
            attempts: RETRIES,
        })
    }

    /// Deletes the resource as it is now; `NotFound` if there is none.
    async fn delete_latest<T: Resource>(
        &self,
        name: &str,
        what: &str,
    ) -> Result<(), ResourceError> {
        for _ in 0..RETRIES {
            let Some((_, v)) = self.get::<T>(name).await? else {
                return Err(ResourceError::NotFound(what.to_owned()));
            };
            match self.delete::<T>(name, v).await {
                Err(ResourceError::Stale(_)) => continue,
                other => return other,
            }
        }
        Err(ResourceError::Contention {
            what: what.to_owned(),
            attempts: RETRIES,
        })
    }

    /// The cluster's BGP configuration, if one was stored.
    pub async fn bgp_configuration(
        &self,
    ) -> Result<Option<(BgpConfiguration, Version)>, ResourceError> {
        self.get(BgpConfiguration::NAME).await
    }

    /// Stores the BGP configuration: created when `expected` is `None`, else replaced if its
    /// version is still `expected` (a conflict is `Stale`, so a caller re-reads).
    pub async fn set_bgp_configuration(
        &self,
        config: &BgpConfiguration,
        expected: Option<Version>,
    ) -> Result<Version, ResourceError> {
        config.validate()?;
        self.put(BgpConfiguration::NAME, config, expected)
            .await
            .map_err(|e| match e {
                ResourceError::AlreadyExists(_) | ResourceError::Stale(_) => ResourceError::Stale(
                    "the BGP configuration changed since it was read; read it again".into(),
                ),
                e => e,
            })
    }

    pub async fn list_bgp_peers(&self) -> Result<Vec<(BgpPeer, Version)>, ResourceError> {
        self.list("").await
    }

    /// Creates or replaces a `BGPPeer` resource.
    pub async fn put_bgp_peer(&self, peer: &BgpPeer) -> Result<Version, ResourceError> {
        peer.validate()?;
        self.put_latest(&peer.name, peer, &format!("BGP peer {}", peer.name))
            .await
    }

    /// Deletes a `BGPPeer` resource; `NotFound` if there is none of that name.
    pub async fn delete_bgp_peer(&self, name: &str) -> Result<(), ResourceError> {
        self.delete_latest::<BgpPeer>(name, &format!("BGP peer {name}"))
            .await
    }

    pub async fn list_bgp_filters(&self) -> Result<Vec<(BgpFilter, Version)>, ResourceError> {
        self.list("").await
    }

    pub async fn get_bgp_filter(&self, name: &str) -> Result<(BgpFilter, Version), ResourceError> {
        self.get(name)
            .await?
            .ok_or_else(|| ResourceError::NotFound(format!("BGP filter {name}")))
    }

    /// Creates or replaces a `BGPFilter` resource. With `expected`, only if the stored one is
    /// still at that version (else `Stale`, or `NotFound` if it is gone): a file read with
    /// `get` applies back only over what it read.
    pub async fn put_bgp_filter(
        &self,
        filter: &BgpFilter,
        expected: Option<Version>,
    ) -> Result<Version, ResourceError> {
        filter.validate()?;
        let what = format!("BGP filter {}", filter.name);
        let Some(v) = expected else {
            return self.put_latest(&filter.name, filter, &what).await;
        };
        if self.get::<BgpFilter>(&filter.name).await?.is_none() {
            return Err(ResourceError::NotFound(format!("{what} (at revision {v})")));
        }
        self.put(&filter.name, filter, Some(v))
            .await
            .map_err(|e| match e {
                ResourceError::Stale(_) => ResourceError::Stale(what.clone()),
                e => e,
            })
    }

    /// Deletes a `BGPFilter` resource; `NotFound` if there is none of that name. Peers that
    /// name it stay: bgpd skips a missing filter (as Calico does).
    pub async fn delete_bgp_filter(&self, name: &str) -> Result<(), ResourceError> {
        self.delete_latest::<BgpFilter>(name, &format!("BGP filter {name}"))
            .await
    }

    /// Registers a node (or changes it): with `expected`, only over that version (`Stale`
    /// otherwise).
    pub async fn register_node(
        &self,
        node: &Node,
        expected: Option<Version>,
    ) -> Result<Version, ResourceError> {
        validate_name("name", &node.name)?;
        for _ in 0..RETRIES {
            let current = self.get::<Node>(&node.name).await?;
            if let (Some(e), Some((_, v))) = (expected, &current)
                && e != *v
            {
                return Err(ResourceError::Stale(format!("node {}", node.name)));
            }
            // Unchanged (a restart re-registers the same node): no write, so that the nodes
            // watching the cluster are not all woken to recompute nothing.
            if let Some((stored, v)) = &current
                && stored == node
            {
                return Ok(*v);
            }
            match self.put(&node.name, node, current.map(|(_, v)| v)).await {
                Err(ResourceError::AlreadyExists(_) | ResourceError::Stale(_))
                    if expected.is_none() =>
                {
                    continue;
                }
                Err(ResourceError::AlreadyExists(_) | ResourceError::Stale(_)) => {
                    return Err(ResourceError::Stale(format!("node {}", node.name)));
                }
                other => return other,
            }
        }
        Err(ResourceError::Contention {
            what: format!("node {}", node.name),
            attempts: RETRIES,
        })
    }

    pub async fn get_node(&self, name: &str) -> Result<(Node, Version), ResourceError> {
        self.get(name)
            .await?
            .ok_or_else(|| ResourceError::NotFound(format!("node {name}")))
    }

    pub async fn list_nodes(&self) -> Result<Vec<(Node, Version)>, ResourceError> {
        self.list("").await
    }
}
