use super::*;

fn env(pairs: &[(&str, &str)]) -> Option<config::Map<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

fn write(text: &str) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), text).unwrap();
    f
}

#[test]
fn the_sample_configuration_loads() {
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/node.toml");
    let c = Config::load_with_env(Some(Path::new(sample)), env(&[])).unwrap();
    assert_eq!(c.node.name, "node-a");
    assert_eq!(c.node.address, Some("10.0.0.5/24".parse().unwrap()));
    assert_eq!(c.api.socket, PathBuf::from(DEFAULT_SOCKET));
    assert_eq!(c.datastore.kind, DatastoreKind::Sqlite);
    assert_eq!(c.bgp.as_number, 64512);
    assert_eq!(c.bgp.router_id, Some(Ipv4Addr::new(10, 0, 0, 5)));
    let pool = &c.ipam.default_pools[0];
    assert_eq!(pool.cidr.to_string(), "172.20.0.0/16");
    assert_eq!(pool.vxlan_mode, ::datastore::model::EncapMode::CrossSubnet);
    assert!(pool.nat_outgoing);
}

#[test]
fn a_bad_default_pool_is_refused_at_load() {
    let f = write("[[ipam.default_pools]]\nname = \"p\"\ncidr = \"10.0.0.1/16\"\n");
    let err = Config::load_with_env(Some(f.path()), env(&[("MARGAY_NODE__NAME", "n")]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ipam.default_pools") && err.contains("not a network address"),
        "{err}"
    );
    let err = Config::load_with_env(None, env(&[("MARGAY_NODE__NAME", "Bad_Name")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("node.name"), "{err}");
}

#[test]
fn defaults_without_a_file() {
    let c = Config::load_with_env(None, env(&[("MARGAY_NODE__NAME", "n1")])).unwrap();
    assert_eq!(c.node.name, "n1");
    assert_eq!(c.api.socket, PathBuf::from(DEFAULT_SOCKET));
    assert_eq!(c.datastore.describe(), "sqlite:/var/lib/margay/store.db");
    assert_eq!(c.bgp.listen_port, 179);
    assert_eq!(c.log.level, LogLevel::Info);
    // No IPv4 address: the id is hashed from the name, stable and never 0.0.0.0.
    assert_eq!(c.bgp.router_id, Some(super::hashed_router_id("n1")));
    assert_ne!(c.bgp.router_id, Some(Ipv4Addr::UNSPECIFIED));
    let again = Config::load_with_env(None, env(&[("MARGAY_NODE__NAME", "n1")])).unwrap();
    assert_eq!(again.bgp.router_id, c.bgp.router_id);
    let other = Config::load_with_env(None, env(&[("MARGAY_NODE__NAME", "n2")])).unwrap();
    assert_ne!(other.bgp.router_id, c.bgp.router_id);
}

#[test]
fn environment_overrides_the_file() {
    let f = write("[node]\nname = \"a\"\naddress = \"10.1.1.1/16\"\n[bgp]\nas = 65001\n");
    let c = Config::load_with_env(
        Some(f.path()),
        env(&[
            ("MARGAY_NODE__ADDRESS", "10.0.0.5/24"),
            ("MARGAY_BGP__AS", "64512"),
            ("MARGAY_API__SOCKET", "/tmp/x.sock"),
            ("MARGAY_DATASTORE__KIND", "etcd"),
            (
                "MARGAY_DATASTORE__ENDPOINTS",
                "http://127.0.0.1:1,http://127.0.0.1:2",
            ),
            ("MARGAY_LOG__LEVEL", "debug"),
        ]),
    )
    .unwrap();
    assert_eq!(c.node.name, "a");
    assert_eq!(c.node.address, Some("10.0.0.5/24".parse().unwrap()));
    assert_eq!(c.bgp.as_number, 64512);
    assert_eq!(c.api.socket, PathBuf::from("/tmp/x.sock"));
    assert_eq!(c.datastore.kind, DatastoreKind::Etcd);
    assert_eq!(
        c.datastore.describe(),
        "etcd:http://127.0.0.1:1,http://127.0.0.1:2"
    );
    assert_eq!(c.log.level, LogLevel::Debug);
}

#[test]
fn bad_values_name_the_field() {
    let cases: &[(&str, &str)] = &[
        ("[node]\nname = \"n\"\naddress = \"10.0.0.5\"\n", "address"),
        ("[node]\nname = \"n\"\nnmae = \"x\"\n", "nmae"),
        ("[bgp]\nas = 0\n", "bgp.as"),
        ("[bgp]\nas = -1\n", "as"),
        ("[log]\nlevel = \"loud\"\n", "level"),
        ("[api]\ntcp_listen = \"127.0.0.1:5000\"\n", "api.tcp_listen"),
        ("[datastore]\nkind = \"mysql\"\n", "kind"),
    ];
    for (text, needle) in cases {
        let f = write(text);
        let err = Config::load_with_env(Some(f.path()), env(&[("MARGAY_NODE__NAME", "n")]))
            .expect_err(text)
            .to_string();
        assert!(err.contains(needle), "{text:?}: {err}");
    }
}

#[test]
fn a_missing_file_is_named() {
    let err = Config::load_with_env(Some(Path::new("/nonexistent/bgpd.toml")), env(&[]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("/nonexistent/bgpd.toml"), "{err}");
}

#[test]
fn bgp_peers_and_announcements_load_and_are_checked() {
    let f = write(
        "[bgp]\nas = 64512\n[[bgp.peers]]\naddress = \"10.0.0.2\"\nas = 65000\npassive = true\n\
         port = 1179\nhold_time = 9\n[[bgp.announce]]\nprefix = \"10.10.1.0/24\"\n\
         next_hop = \"10.0.0.1\"\ncommunities = [\"65000:7\"]\n",
    );
    let c = Config::load_with_env(Some(f.path()), env(&[("MARGAY_NODE__NAME", "n")])).unwrap();
    let p = &c.bgp.peers[0];
    assert_eq!(
        (p.address, p.as_number, p.passive),
        (
            std::net::IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
            65000,
            true
        )
    );
    assert_eq!(
        (p.port, p.hold_time, p.keepalive),
        (Some(1179), Some(9), None)
    );
    assert_eq!(c.bgp.announce[0].communities, vec!["65000:7".to_owned()]);
    // Defaults of the session options a BGPPeer resource also has.
    assert_eq!(
        (p.local_as, p.allow_local_as, p.next_hop),
        (None, 0, ::datastore::model::NextHopMode::Auto)
    );
    let f = write(
        "[[bgp.peers]]\naddress = \"10.0.0.3\"\nas = 65000\nlocal_as = 65010\nallow_local_as = 2\n\
         next_hop = \"Self\"\n",
    );
    let c = Config::load_with_env(Some(f.path()), env(&[("MARGAY_NODE__NAME", "n")])).unwrap();
    let p = &c.bgp.peers[0];
    assert_eq!(
        (p.local_as, p.allow_local_as, p.next_hop),
        (Some(65010), 2, ::datastore::model::NextHopMode::SelfNextHop)
    );
    for (bad, needle) in [
        ("[[bgp.peers]]\naddress = \"10.0.0.2\"\nas = 0\n", "AS 0"),
        (
            "[[bgp.peers]]\naddress = \"10.0.0.2\"\nas = 1\nlocal_as = 23456\n",
            "local_as",
        ),
        (
            "[[bgp.peers]]\naddress = \"10.0.0.2\"\nas = 1\nnext_hop = \"sometimes\"\n",
            "next_hop",
        ),
        (
            "[[bgp.peers]]\naddress = \"10.0.0.2\"\nas = 1\nhold_time = 2\n",
            "hold_time",
        ),
        (
            "[[bgp.announce]]\nprefix = \"10.1.0.0/24\"\ncommunities = [\"x\"]\n",
            "community",
        ),
    ] {
        let f = write(bad);
        let err = Config::load_with_env(Some(f.path()), env(&[("MARGAY_NODE__NAME", "n")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{bad}: {err}");
    }
}

#[test]
fn metrics_section_loads_with_environment_overrides() {
    let c = Config::load_with_env(None, env(&[("MARGAY_NODE__NAME", "n")])).unwrap();
    assert_eq!(c.metrics, MetricsConfig::default());
    assert_eq!(c.metrics.listen, None);

    let f = write(
        "[metrics]\nlisten = \"127.0.0.1:9098\"\nready_allow_down = [\"peer_10_0_0_1\", \"peer_10_1_*\"]\n",
    );
    let c = Config::load_with_env(Some(f.path()), env(&[("MARGAY_NODE__NAME", "n")])).unwrap();
    assert_eq!(c.metrics.listen, Some("127.0.0.1:9098".parse().unwrap()));
    assert_eq!(c.metrics.ready_allow_down, ["peer_10_0_0_1", "peer_10_1_*"]);

    let c = Config::load_with_env(
        Some(f.path()),
        env(&[
            ("MARGAY_NODE__NAME", "n"),
            ("MARGAY_METRICS__LISTEN", "127.0.0.1:19098"),
            ("MARGAY_METRICS__READY_ALLOW_DOWN", "peer_a,*"),
        ]),
    )
    .unwrap();
    assert_eq!(c.metrics.listen, Some("127.0.0.1:19098".parse().unwrap()));
    assert_eq!(c.metrics.ready_allow_down, ["peer_a", "*"]);
}

#[test]
fn bad_metrics_values_name_the_field() {
    for (text, needle) in [
        ("[metrics]\nlisten = \"localhost\"\n", "listen"),
        (
            "[metrics]\nready_allow_down = [\"\"]\n",
            "metrics.ready_allow_down",
        ),
        (
            "[metrics]\nready_allow_down = \"peer_a\"\n",
            "ready_allow_down",
        ),
        ("[metrics]\nlisten_on = \"127.0.0.1:1\"\n", "listen_on"),
    ] {
        let f = write(text);
        let err = Config::load_with_env(Some(f.path()), env(&[("MARGAY_NODE__NAME", "n")]))
            .expect_err(text)
            .to_string();
        assert!(err.contains(needle), "{text:?}: {err}");
    }
}

#[test]
fn bfd_of_a_peer_loads_and_bad_intervals_name_the_field() {
    let peer = |bfd: &str| {
        format!("[bgp]\n[[bgp.peers]]\naddress = \"10.0.0.9\"\nas = 65000\nbfd = {bfd}\n")
    };
    let load = |text: &str| {
        let f = write(text);
        Config::load_with_env(Some(f.path()), env(&[("MARGAY_NODE__NAME", "n")]))
    };
    let c = load(&peer(
        "{ min_rx_ms = 100, min_tx_ms = 100, multiplier = 3 }",
    ))
    .unwrap();
    let b = c.bgp.peers[0].bfd.expect("bfd set");
    let s = b.session().unwrap();
    assert_eq!(
        (s.required_min_rx, s.desired_min_tx, s.detect_mult),
        (
            std::time::Duration::from_millis(100),
            std::time::Duration::from_millis(100),
            3
        )
    );
    // Keys left out take FRR's defaults.
    let c = load(&peer("{ multiplier = 5 }")).unwrap();
    assert_eq!(
        c.bgp.peers[0].bfd,
        Some(BfdConfig {
            min_rx_ms: 300,
            min_tx_ms: 300,
            multiplier: 5
        })
    );
    for (bfd, want) in [
        ("{ min_rx_ms = 9 }", "bgp.peers[0].bfd.min_rx_ms = 9 ms"),
        ("{ min_tx_ms = 5 }", "bgp.peers[0].bfd.min_tx_ms = 5 ms"),
        ("{ multiplier = 0 }", "bgp.peers[0].bfd.multiplier = 0"),
        ("{ multiplier = 256 }", "bgp.peers[0].bfd.multiplier = 256"),
    ] {
        let err = load(&peer(bfd)).unwrap_err().to_string();
        assert!(err.contains(want), "{bfd}: {err}");
    }
    let err = load(&peer("{ min_rx = 100 }")).unwrap_err().to_string();
    assert!(err.contains("min_rx"), "{err}");
}

#[test]
fn the_error_wait_time_defaults_to_calicos_and_is_checked() {
    let n = env(&[("MARGAY_NODE__NAME", "n")]);
    let f = write("[[bgp.peers]]\naddress = \"10.0.0.9\"\nas = 65000\n");
    let c = Config::load_with_env(Some(f.path()), n.clone()).unwrap();
    assert_eq!(c.bgp.error_wait_time, [5, 30]);
    assert_eq!(c.bgp.peers[0].error_wait_time, None);
    let f = write(
        "[bgp]\nerror_wait_time = [1, 60]\n\
         [[bgp.peers]]\naddress = \"10.0.0.9\"\nas = 65000\nerror_wait_time = [2, 4]\n",
    );
    let c = Config::load_with_env(Some(f.path()), n.clone()).unwrap();
    assert_eq!(
        (c.bgp.error_wait_time, c.bgp.peers[0].error_wait_time),
        ([1, 60], Some([2, 4]))
    );
    for (text, name) in [
        (
            "[bgp]\nerror_wait_time = [0, 30]\n",
            "bgp.error_wait_time = [0, 30]",
        ),
        (
            "[bgp]\nerror_wait_time = [30, 5]\n",
            "bgp.error_wait_time = [30, 5]",
        ),
        (
            "[[bgp.peers]]\naddress = \"10.0.0.9\"\nas = 65000\nerror_wait_time = [1, 9999]\n",
            "bgp.peers[0].error_wait_time = [1, 9999]",
        ),
    ] {
        let err = Config::load_with_env(Some(write(text).path()), n.clone())
            .unwrap_err()
            .to_string();
        assert!(err.contains(name), "{err}");
    }
}

// ---- The API's caps (`[api]` max_connections, max_streams_per_connection, max_watch_streams) ----

fn load_caps(text: &str) -> Result<Config, ConfigError> {
    let f = write(text);
    Config::load_with_env(Some(f.path()), env(&[("MARGAY_NODE__NAME", "n")]))
}

#[test]
fn api_caps_default_and_load() {
    let c = load_caps("").unwrap();
    assert_eq!(
        (
            c.api.max_connections,
            c.api.max_streams_per_connection,
            c.api.max_watch_streams
        ),
        (1024, 4096, 20_000)
    );
    let c = load_caps(
        "[api]\nmax_connections = 8\nmax_streams_per_connection = 10\nmax_watch_streams = 50\n",
    )
    .unwrap();
    assert_eq!(
        (
            c.api.max_connections,
            c.api.max_streams_per_connection,
            c.api.max_watch_streams
        ),
        (8, 10, 50)
    );
}

#[test]
fn a_cap_of_zero_or_too_large_names_its_key() {
    for (text, key) in [
        ("[api]\nmax_connections = 0\n", "api.max_connections"),
        (
            "[api]\nmax_streams_per_connection = 0\n",
            "api.max_streams_per_connection",
        ),
        ("[api]\nmax_watch_streams = 0\n", "api.max_watch_streams"),
        (
            "[api]\nmax_watch_streams = 1000001\n",
            "api.max_watch_streams",
        ),
        ("[api]\nmax_connections = -1\n", "max_connections"),
    ] {
        let err = load_caps(text).expect_err(text).to_string();
        assert!(err.contains(key), "{text:?}: {err}");
    }
}

#[test]
fn addresses_found_after_loading_bring_the_router_id_unless_one_was_set() {
    let f = write("[node]\nname = \"n1\"\n");
    let mut c = Config::load_with_env(Some(f.path()), env(&[])).unwrap();
    assert_eq!(c.bgp.router_id, Some(hashed_router_id("n1")));
    c.adopt_addresses(Some("10.0.0.7/24".parse().unwrap()), None);
    assert_eq!(c.node.address, Some("10.0.0.7/24".parse().unwrap()));
    assert_eq!(c.bgp.router_id, Some("10.0.0.7".parse().unwrap()));
    let f = write("[node]\nname = \"n1\"\n[bgp]\nrouter_id = \"1.2.3.4\"\n");
    let mut c = Config::load_with_env(Some(f.path()), env(&[])).unwrap();
    c.adopt_addresses(Some("10.0.0.7/24".parse().unwrap()), None);
    assert_eq!(c.bgp.router_id, Some("1.2.3.4".parse().unwrap()));
}
