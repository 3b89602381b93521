//! The `Daemon` service: who this bgpd is and what it is connected to.

use std::time::Instant;

use proto::v1::daemon_server::Daemon;
use proto::v1::{DaemonStatus, DatastoreState, GetStatusRequest};
use tonic::{Request, Response, Status};

/// What the daemon knows about itself.
#[derive(Debug, Clone)]
pub struct DaemonInfo {
    pub node: String,
    pub datastore: String,
    pub started: Instant,
}

#[derive(Debug, Clone)]
pub struct DaemonService {
    info: DaemonInfo,
}

impl DaemonService {
    pub fn new(info: DaemonInfo) -> Self {
        Self { info }
    }
}

#[tonic::async_trait]
impl Daemon for DaemonService {
    async fn get_status(
        &self,
        _request: Request<GetStatusRequest>,
    ) -> Result<Response<DaemonStatus>, Status> {
        Ok(Response::new(DaemonStatus {
            node: self.info.node.clone(),
            datastore: self.info.datastore.clone(),
            // The datastore is opened once the datastore issue lands; until then say so.
            datastore_state: DatastoreState::NotOpened.into(),
            uptime_s: self.info.started.elapsed().as_secs(),
            version: crate::VERSION.to_owned(),
            datastore_error: String::new(),
        }))
    }
}
