//! bgpd and its datastore: SQLite opened at start, etcd retried in the background while it is
//! unreachable, the state visible in `bgpctl status` and in the health service.

use std::time::{Duration, Instant};

use interop_tests::lab::bgpd::{Daemon, bgpctl, runtime, spawn};
use interop_tests::lab::{etcd::EtcdCluster, free_port};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

fn status_json(d: &Daemon) -> serde_json::Value {
    let out = bgpctl(&d.socket, &["status", "--json"]);
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn health(d: &Daemon) -> ServingStatus {
    runtime().block_on(async {
        let channel = proto::client::connect_unix(&d.socket).await.unwrap();
        HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap()
            .into_inner()
            .status()
    })
}

/// Polls `f` until it is true or `limit` passes.
fn eventually(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn sqlite_is_connected_at_start() {
    let d = Daemon::start("");
    let v = status_json(&d);
    assert_eq!(v["datastore_state"], "connected", "{v}");
    assert_eq!(health(&d), ServingStatus::Serving);
    assert!(d.dir.path().join("store.db").exists());
}

#[test]
fn etcd_unreachable_at_start_is_retried_and_reported() {
    let port = free_port();
    let extra =
        format!("[datastore]\nkind = \"etcd\"\nendpoints = [\"http://127.0.0.1:{port}\"]\n");
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("bgpd.sock");
    let config = dir.path().join("bgpd.toml");
    std::fs::write(
        &config,
        format!(
            "[node]\nname = \"etcd-node\"\n[api]\nsocket = \"{}\"\n{extra}",
            socket.display()
        ),
    )
    .unwrap();
    let d = Daemon::start_with_config(dir, socket, &config);

    // Up and serving, honest about the datastore.
    let v = status_json(&d);
    assert_eq!(v["datastore_state"], "unavailable", "{v}");
    assert_eq!(v["datastore"], format!("etcd:http://127.0.0.1:{port}"));
    assert_eq!(health(&d), ServingStatus::NotServing);
    let table = String::from_utf8(bgpctl(&d.socket, &["status"]).stdout).unwrap();
    assert!(table.contains("(unavailable)"), "{table}");

    // etcd comes up on that port: bgpd connects by itself.
    let mut etcd = EtcdCluster::start_on(&[port]);
    eventually(Duration::from_secs(40), "datastore connected", || {
        status_json(&d)["datastore_state"] == "connected"
    });
    assert_eq!(health(&d), ServingStatus::Serving);

    // etcd goes away: reported again, bgpd keeps running.
    etcd.kill(0);
    eventually(
        Duration::from_secs(15),
        "datastore unavailable again",
        || status_json(&d)["datastore_state"] == "unavailable",
    );
    assert_eq!(health(&d), ServingStatus::NotServing);
    drop(etcd);
}

#[test]
fn a_foreign_sqlite_file_stops_bgpd_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("bgpd.sock");
    // The lab config puts the store at <dir>/store.db: make that a file of someone else's.
    std::fs::write(dir.path().join("store.db"), b"not a database at all").unwrap();
    let out = spawn(dir.path(), &socket, "").wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains(&dir.path().join("store.db").display().to_string()),
        "{err}"
    );
    assert!(err.contains("nothing was written"), "{err}");
    assert_eq!(
        std::fs::read(dir.path().join("store.db")).unwrap(),
        b"not a database at all"
    );
    assert!(!socket.exists());
}
