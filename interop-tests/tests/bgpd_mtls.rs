//! The TCP listener serves only clients with a certificate from the configured CA.

use interop_tests::lab::bgpd::{Daemon, runtime};
use interop_tests::lab::free_port;
use proto::v1::GetStatusRequest;
use proto::v1::daemon_client::DaemonClient;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let pem = params.self_signed(&key).unwrap().pem();
    Ca {
        pem,
        issuer: Issuer::new(params, key),
    }
}

/// A leaf certificate and key (PEM) signed by `ca`.
fn leaf(ca: &Ca, names: &[&str]) -> (String, String) {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let params = CertificateParams::new(names).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

async fn status_over_tcp(
    port: u16,
    server_ca: &str,
    identity: Option<(String, String)>,
) -> Result<proto::v1::DaemonStatus, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(server_ca))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let endpoint = Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?;
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| proto::client::error_chain(&e))?;
    DaemonClient::new(channel)
        .get_status(GetStatusRequest {})
        .await
        .map(|r| r.into_inner())
        .map_err(|s| s.to_string())
}

#[test]
fn mutual_tls_serves_only_certified_clients() {
    let server_ca = ca("margay server CA");
    let client_ca = ca("margay clients CA");
    let stranger_ca = ca("someone else");
    let (server_cert, server_key) = leaf(&server_ca, &["localhost", "127.0.0.1"]);

    let dir = tempfile::tempdir().unwrap();
    for (name, text) in [
        ("server.pem", &server_cert),
        ("server-key.pem", &server_key),
        ("clients-ca.pem", &client_ca.pem),
    ] {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let port = free_port();
    let extra = format!(
        "tcp_listen = \"127.0.0.1:{port}\"\ntls_cert = \"{0}/server.pem\"\n\
         tls_key = \"{0}/server-key.pem\"\ntls_client_ca = \"{0}/clients-ca.pem\"\n",
        dir.path().display()
    );
    let socket = dir.path().join("bgpd.sock");
    let _daemon = Daemon::start_in(dir, socket, &extra);

    let good = leaf(&client_ca, &["bgpctl"]);
    let foreign = leaf(&stranger_ca, &["bgpctl"]);
    runtime().block_on(async {
        // The daemon's unix socket is up; give the TCP listener the same chance.
        let mut served = status_over_tcp(port, &server_ca.pem, Some(good.clone())).await;
        for _ in 0..50 {
            if served.is_ok() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            served = status_over_tcp(port, &server_ca.pem, Some(good.clone())).await;
        }
        let status = served.expect("a client with a certificate from the CA is served");
        assert_eq!(status.node, "test-node");

        let anonymous = status_over_tcp(port, &server_ca.pem, None).await;
        assert!(
            anonymous.is_err(),
            "a client without a certificate was served"
        );
        let stranger = status_over_tcp(port, &server_ca.pem, Some(foreign)).await;
        assert!(
            stranger.is_err(),
            "a client with a foreign certificate was served"
        );
        // Plain HTTP/2 without TLS is refused as well.
        let plain = Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .connect()
            .await;
        if let Ok(channel) = plain {
            let r = DaemonClient::new(channel)
                .get_status(GetStatusRequest {})
                .await;
            assert!(r.is_err(), "a plaintext client was served");
        }
    });
}

#[test]
fn tcp_without_tls_files_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("bgpd.sock");
    let out =
        interop_tests::lab::bgpd::spawn(dir.path(), &socket, "tcp_listen = \"127.0.0.1:1\"\n")
            .wait_with_output()
            .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("api.tcp_listen") && err.contains("tls_client_ca"),
        "{err}"
    );
}

#[test]
fn an_unreadable_certificate_stops_start_up_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("bgpd.sock");
    let missing = dir.path().join("missing.pem");
    let extra = format!(
        "tcp_listen = \"127.0.0.1:{port}\"\ntls_cert = \"{m}\"\ntls_key = \"{m}\"\ntls_client_ca = \"{m}\"\n",
        m = missing.display(),
        port = free_port(),
    );
    let out = interop_tests::lab::bgpd::spawn(dir.path(), &socket, &extra)
        .wait_with_output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains(&missing.display().to_string()), "{err}");
}
