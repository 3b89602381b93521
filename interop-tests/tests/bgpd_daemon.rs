//! bgpd as a process: its socket, its API, its signals, its refusal to run twice.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::time::Duration;

use interop_tests::lab::bgpd::{Daemon, bgpctl, runtime, spawn};
use proto::v1::GetStatusRequest;
use proto::v1::daemon_client::DaemonClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

#[test]
fn health_says_serving() {
    let d = Daemon::start("");
    runtime().block_on(async {
        let channel = proto::client::connect_unix(&d.socket).await.unwrap();
        let mut health = HealthClient::new(channel);
        for service in ["", "margay.v1.Daemon"] {
            let r = health
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(r.status(), ServingStatus::Serving, "service {service:?}");
        }
        let unknown = health
            .check(HealthCheckRequest {
                service: "margay.v1.Nope".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::NotFound);
    });
}

/// The services a reflection `version` (`v1`, `v1alpha`: the same messages in two packages)
/// lists on bgpd's socket.
macro_rules! reflected_services {
    ($version:ident, $socket:expr) => {
        runtime().block_on(async {
            use tonic_reflection::pb::$version::ServerReflectionRequest;
            use tonic_reflection::pb::$version::server_reflection_client::ServerReflectionClient;
            use tonic_reflection::pb::$version::server_reflection_request::MessageRequest;
            use tonic_reflection::pb::$version::server_reflection_response::MessageResponse;
            let channel = proto::client::connect_unix($socket).await.unwrap();
            let request = ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::ListServices(String::new())),
            };
            let mut stream = ServerReflectionClient::new(channel)
                .server_reflection_info(tokio_stream::iter([request]))
                .await
                .unwrap()
                .into_inner();
            match stream.message().await.unwrap().unwrap().message_response {
                Some(MessageResponse::ListServicesResponse(list)) => {
                    list.service.into_iter().map(|s| s.name).collect::<Vec<_>>()
                }
                other => panic!("unexpected reflection answer {other:?}"),
            }
        })
    };
}

#[test]
fn reflection_lists_every_service_of_the_contract() {
    let d = Daemon::start("");
    let names = reflected_services!(v1, &d.socket);
    for service in proto::v1::SERVICE_NAMES
        .iter()
        .chain(&["grpc.health.v1.Health"])
    {
        assert!(
            names.iter().any(|n| n == service),
            "{service} missing from {names:?}"
        );
    }
    // The older protocol version (grpcurl before 1.9 asks it) lists the same; each version
    // names itself as the reflection service.
    let alpha = reflected_services!(v1alpha, &d.socket);
    let others = |list: &[String]| {
        let mut l: Vec<String> = list
            .iter()
            .filter(|n| !n.starts_with("grpc.reflection."))
            .cloned()
            .collect();
        l.sort();
        l
    };
    assert_eq!(
        others(&names),
        others(&alpha),
        "v1 and v1alpha list different services"
    );
}

#[test]
fn filters_are_served_and_service_cidrs_are_checked() {
    let d = Daemon::start("");
    runtime().block_on(async {
        let channel = proto::client::connect_unix(&d.socket).await.unwrap();
        let mut client = proto::v1::bgp_client::BgpClient::new(channel);
        // Once the brain has generated the filters (a moment after start): each export scope
        // and the kernel's end in an unconditional rule; import ends in one catch-all per peer
        // class (cluster peers: only pool addresses; external peers: accepted).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let rules = loop {
            let rules = client
                .get_filters(proto::v1::GetFiltersRequest::default())
                .await
                .unwrap()
                .into_inner()
                .rules;
            if rules
                .iter()
                .any(|r| r.reason == "cluster peers announce only pool addresses")
            {
                break rules;
            }
            assert!(std::time::Instant::now() < deadline, "{rules:?}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        let of = |scope: proto::v1::FilterScope| -> Vec<&proto::v1::FilterRule> {
            rules.iter().filter(|r| r.scope == scope as i32).collect()
        };
        for scope in [
            proto::v1::FilterScope::Kernel,
            proto::v1::FilterScope::ExportCluster,
            proto::v1::FilterScope::ExportExternal,
        ] {
            let last = of(scope).last().copied();
            assert!(
                last.is_some_and(|r| r.r#match == "all"),
                "{scope:?}: {rules:?}"
            );
        }
        let import = of(proto::v1::FilterScope::Import);
        let tail: Vec<(&str, &str)> = import
            .iter()
            .rev()
            .take(2)
            .map(|r| (r.r#match.as_str(), r.action.as_str()))
            .collect();
        assert_eq!(
            tail,
            vec![
                ("from external peers", "accept"),
                ("from cluster peers", "reject")
            ],
            "{rules:?}"
        );
        // Service CIDRs are stored; one with host bits set is refused, naming the field, and
        // nothing changes.
        let set = |cidr: &str| proto::v1::SetConfigurationRequest {
            configuration: Some(proto::v1::BgpConfiguration {
                service_cluster_cidrs: vec![cidr.into()],
                ..Default::default()
            }),
        };
        client.set_configuration(set("10.96.0.0/12")).await.unwrap();
        let err = client
            .set_configuration(set("10.96.0.1/12"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains("service_cluster"), "{err:?}");
        let stored = client
            .get_configuration(proto::v1::GetConfigurationRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(stored.service_cluster_cidrs, ["10.96.0.0/12"]);
    });
}

#[test]
fn bgpctl_status_table_and_json() {
    let d = Daemon::start("");
    let out = bgpctl(&d.socket, &["status"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["node", "test-node"]
    );
    let store = d.dir.path().join("store.db");
    assert!(lines[1].starts_with("datastore"), "{text}");
    assert!(
        lines[1].contains(&format!("sqlite:{}", store.display())),
        "{text}"
    );
    assert!(lines[2].starts_with("uptime"), "{text}");
    assert_eq!(
        lines[3].split_whitespace().collect::<Vec<_>>(),
        ["version", bgpd::VERSION]
    );

    std::thread::sleep(Duration::from_millis(1100));
    let out = bgpctl(&d.socket, &["status", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["node"], "test-node");
    assert_eq!(v["datastore"], format!("sqlite:{}", store.display()));
    assert!(v["uptime_s"].as_u64().unwrap() >= 1, "{v}");
    assert_eq!(v["version"], bgpd::VERSION);
}

#[test]
fn bgpctl_without_a_daemon_says_so_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nobody.sock");
    for args in [&["status"][..], &["status", "--json"][..]] {
        let out = bgpctl(&socket, args);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert!(out.stdout.is_empty(), "{out:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("cannot reach bgpd"), "{err}");
        assert!(err.contains(&socket.display().to_string()), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn the_socket_is_root_only() {
    let d = Daemon::start("");
    let meta = std::fs::metadata(&d.socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
}

#[test]
fn sigterm_and_sigint_stop_it_and_remove_the_socket() {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let mut d = Daemon::start("");
        let rt = runtime();
        // A client that stays connected after its request must not hold up the stop.
        let _channel = rt.block_on(async {
            let channel = proto::client::connect_unix(&d.socket).await.unwrap();
            DaemonClient::new(channel.clone())
                .get_status(GetStatusRequest {})
                .await
                .unwrap();
            channel
        });
        let started = std::time::Instant::now();
        let status = d.signal_and_wait(signal);
        assert!(status.success(), "signal {signal}: {status}");
        assert!(!d.socket.exists(), "signal {signal}: socket left behind");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "signal {signal}: stopping took {:?}",
            started.elapsed()
        );
    }
}

#[test]
fn a_silent_connection_delays_the_stop_by_the_grace_period_at_most() {
    let mut d = Daemon::start("");
    // Connected, never speaks HTTP/2.
    let _raw = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
    let started = std::time::Instant::now();
    let status = d.signal_and_wait(libc::SIGTERM);
    assert!(status.success(), "{status}");
    assert!(!d.socket.exists());
    assert!(
        started.elapsed() < Duration::from_secs(7),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_second_daemon_is_refused_and_a_stale_socket_replaced() {
    let mut first = Daemon::start("");
    let socket = first.socket.clone();

    let dir2 = tempfile::tempdir().unwrap();
    let second = spawn(dir2.path(), &socket, "").wait_with_output().unwrap();
    assert_eq!(second.status.code(), Some(1), "{second:?}");
    let err = String::from_utf8(second.stderr).unwrap();
    assert!(err.contains("already serving"), "{err}");
    assert!(err.contains(&socket.display().to_string()), "{err}");
    // The first one is untouched.
    assert!(bgpctl(&socket, &["status"]).status.success());

    let status = first.signal_and_wait(libc::SIGKILL);
    assert!(!status.success());
    assert!(socket.exists(), "kill -9 leaves the socket behind");

    let dir3 = tempfile::tempdir().unwrap();
    let third = Daemon::start_in(dir3, socket.clone(), "");
    let out = bgpctl(&third.socket, &["status", "--json"]);
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn a_file_in_the_sockets_place_is_not_removed() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("bgpd.sock");
    std::fs::write(&socket, "precious").unwrap();
    let out = spawn(dir.path(), &socket, "").wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("not a socket"), "{err}");
    assert_eq!(std::fs::read_to_string(&socket).unwrap(), "precious");
}

#[test]
fn environment_overrides_reach_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("bgpd.sock");
    let config = dir.path().join("bgpd.toml");
    std::fs::write(&config, "[node]\nname = \"from-file\"\n").unwrap();
    let mut child = std::process::Command::new(interop_tests::lab::binary("bgpd"))
        .arg("--config")
        .arg(&config)
        .env("MARGAY_API__SOCKET", &socket)
        .env("MARGAY_NODE__NAME", "from-env")
        .env("MARGAY_DATASTORE__PATH", dir.path().join("s.db"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(std::time::Instant::now() < deadline, "bgpd did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = runtime().block_on(async {
        let channel = proto::client::connect_unix(&socket).await.unwrap();
        DaemonClient::new(channel)
            .get_status(GetStatusRequest {})
            .await
            .unwrap()
            .into_inner()
    });
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(status.node, "from-env");
}

#[test]
fn a_bad_configuration_exits_1_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("bgpd.sock");
    let out = spawn(dir.path(), &socket, "[bgp]\nas = 0\n")
        .wait_with_output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("bgp.as"), "{err}");
    assert!(!socket.exists());
}
