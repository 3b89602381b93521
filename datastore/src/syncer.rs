//! Follows several kinds at once, as Calico's syncer does: each kind is listed, then watched
//! from its list's version, and the changes of all of them come out of one stream. The
//! contract watches one kind at a time (the Kubernetes API can do no more); whoever needs a
//! view of the cluster (bgpd's brain) follows the kinds it reads through this.

use tokio::sync::mpsc;

use crate::contract::{Datastore, Kind, ObjectEvent, ObjectList, Result, Watch};

/// The changes of every kind followed, each in its kind's order (no order across kinds).
/// Ends with `Err` when any kind's watch ends: list again (the contract says which errors
/// are "too old").
pub struct KindsWatch {
    rx: mpsc::Receiver<Result<(Kind, ObjectEvent)>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl KindsWatch {
    /// The next change of any kind; `None` only if every watch stopped without saying why.
    pub async fn next(&mut self) -> Option<Result<(Kind, ObjectEvent)>> {
        self.rx.recv().await
    }
}

impl Drop for KindsWatch {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Lists each of `kinds` in the order given, then watches each from its own list's version:
/// together, every object as listed and every change after it, nothing twice.
pub async fn list_and_watch<D: Datastore>(
    store: &D,
    kinds: &[Kind],
) -> Result<(Vec<(Kind, ObjectList)>, KindsWatch)> {
    let mut lists = Vec::with_capacity(kinds.len());
    for &kind in kinds {
        lists.push((kind, store.list(kind, "").await?));
    }
    let (tx, rx) = mpsc::channel(Watch::DEPTH);
    let mut tasks = Vec::with_capacity(kinds.len());
    for (kind, list) in &lists {
        let mut watch = store.watch(*kind, list.version).await?;
        let (tx, kind) = (tx.clone(), *kind);
        tasks.push(tokio::spawn(async move {
            while let Some(event) = watch.next().await {
                let end = event.is_err();
                if tx.send(event.map(|e| (kind, e))).await.is_err() || end {
                    return;
                }
            }
        }));
    }
    Ok((lists, KindsWatch { rx, tasks }))
}
