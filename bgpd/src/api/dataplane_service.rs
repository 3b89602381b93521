//! The `Dataplane` service: routewriter's stream of the desired kernel state.

use std::pin::Pin;

use proto::v1 as pb;
use proto::v1::dataplane_server::Dataplane;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::dataplane::Hub;

#[derive(Clone)]
pub struct DataplaneService {
    hub: Hub,
}

impl DataplaneService {
    pub fn new(hub: Hub) -> Self {
        Self { hub }
    }
}

type UpdateStream = Pin<Box<dyn Stream<Item = Result<pb::DataplaneUpdate, Status>> + Send>>;

#[tonic::async_trait]
impl Dataplane for DataplaneService {
    type WatchStream = UpdateStream;

    async fn watch(
        &self,
        r: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let (first, mut live) = self.hub.subscribe(r.into_inner().from_revision);
        let hub = self.hub.clone();
        // Bounded: a client that stops reading holds this task, not memory.
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            let mut last = 0;
            for u in first {
                last = u.revision;
                if tx.send(Ok((*u).clone())).await.is_err() {
                    return;
                }
            }
            loop {
                let next = tokio::select! {
                    // The client went away: end now, not at the next update. A quiet desired
                    // state may not change for hours, and until it did every abandoned
                    // stream kept its task, queue and subscription (10 000 of them, 100 MB).
                    () = tx.closed() => return,
                    next = live.recv() => next,
                };
                let update = match next {
                    Ok(u) if u.revision <= last => continue,
                    Ok(u) => u,
                    // Fell behind the live updates: start over from a snapshot.
                    Err(broadcast::error::RecvError::Lagged(_)) => hub.snapshot(),
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                last = update.revision;
                if tx.send(Ok((*update).clone())).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
