//! The `Services` service: single service addresses announced from this node under a lease
//! (see `crate::services`). A thin adapter: it checks a request (the address against the
//! cluster's `BGPConfiguration`, read from the datastore on each call so that a changed range
//! counts at once) and hands it to the services task, which owns the leases.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ::datastore::Resources;
use ::datastore::model::BgpConfiguration;
use proto::v1::services_server::Services;
use proto::v1::{
    AnnounceServiceRequest, ListServicesRequest, ListServicesResponse, ServiceLease,
    WithdrawServiceRequest, WithdrawServiceResponse,
};
use tonic::{Request, Response, Status};

use crate::api::convert;
use crate::datastore::DatastoreHandle;
use crate::services::{LeaseError, LeaseView, ServicesError, ServicesHandle, leases};

#[derive(Clone)]
pub struct ServicesService {
    services: ServicesHandle,
    datastore: DatastoreHandle,
}

impl ServicesService {
    pub fn new(services: ServicesHandle, datastore: DatastoreHandle) -> Self {
        Self {
            services,
            datastore,
        }
    }

    async fn configuration(&self) -> Result<BgpConfiguration, Status> {
        let store = self
            .datastore
            .store()
            .ok_or_else(|| convert::unavailable(&self.datastore))?;
        Ok(Resources::new(&store)
            .bgp_configuration()
            .await
            .map_err(convert::status)?
            .map(|(c, _)| c)
            .unwrap_or_default())
    }
}

fn status(e: ServicesError) -> Status {
    match &e {
        ServicesError::Lease(LeaseError::NotAnnounced(_)) => Status::not_found(e.to_string()),
        ServicesError::Lease(_) => Status::invalid_argument(e.to_string()),
        ServicesError::Speaker { .. } => Status::internal(e.to_string()),
        ServicesError::Stopped => Status::unavailable(e.to_string()),
    }
}

fn lease_error(e: LeaseError) -> Status {
    status(ServicesError::Lease(e))
}

fn lease_message(v: &LeaseView) -> ServiceLease {
    let expires = SystemTime::now() + v.expires_in;
    ServiceLease {
        address: v.address.to_string(),
        owner: v.owner.clone(),
        ttl_s: v.ttl_s,
        expires_unix_ms: expires
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_millis()
            .try_into()
            .unwrap_or(u64::MAX),
    }
}

#[tonic::async_trait]
impl Services for ServicesService {
    async fn announce_service(
        &self,
        request: Request<AnnounceServiceRequest>,
    ) -> Result<Response<ServiceLease>, Status> {
        let r = request.into_inner();
        // Cheap checks first: a bad request is refused even without a datastore.
        let address = leases::address(&r.address).map_err(lease_error)?;
        leases::ttl(r.ttl_s).map_err(lease_error)?;
        let owner = leases::owner(&r.owner).map_err(lease_error)?;
        leases::allowed(address, &self.configuration().await?).map_err(lease_error)?;
        let (view, _) = self
            .services
            .announce(address, owner, r.ttl_s)
            .await
            .map_err(status)?;
        Ok(Response::new(lease_message(&view)))
    }

    async fn withdraw_service(
        &self,
        request: Request<WithdrawServiceRequest>,
    ) -> Result<Response<WithdrawServiceResponse>, Status> {
        let address = leases::address(&request.into_inner().address).map_err(lease_error)?;
        self.services.withdraw(address).await.map_err(status)?;
        Ok(Response::new(WithdrawServiceResponse {}))
    }

    async fn list_services(
        &self,
        _request: Request<ListServicesRequest>,
    ) -> Result<Response<ListServicesResponse>, Status> {
        let leases = self.services.list().await.map_err(status)?;
        Ok(Response::new(ListServicesResponse {
            leases: leases.iter().map(lease_message).collect(),
        }))
    }
}
