//! routewriter's status as `routewriter status` and `bgpctl routewriter` show it: the client
//! of the agent's own listener (`routewriter.metrics_listen`, `GET /status`, served by
//! [`super::http`]) and the text people read. What the fields mean is routewriter's; the
//! client sits beside its server so that bgpctl reads the status without linking the agent.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error(
        "cannot reach routewriter at {addr}: {source} (is it running, in this network namespace? routewriter.metrics_listen says where it listens)"
    )]
    Unreachable {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(
        "{addr} answered `{status}` to GET /status, not routewriter's status (is routewriter.metrics_listen this address?)"
    )]
    NotStatus { addr: SocketAddr, status: String },
    #[error(
        "routewriter's status is not JSON: {0} (is routewriter.metrics_listen this address? a newer routewriter than this client?)"
    )]
    NotJson(serde_json::Error),
}

/// The agent's status object (JSON text), from its listener at `addr`.
pub fn fetch(addr: SocketAddr) -> Result<String, StatusError> {
    let fail = |source| StatusError::Unreachable { addr, source };
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(fail)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(fail)?;
    s.write_all(b"GET /status HTTP/1.1\r\nHost: routewriter\r\n\r\n")
        .map_err(fail)?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(fail)?;
    let status = out.lines().next().unwrap_or_default();
    match out.split_once("\r\n\r\n") {
        Some((_, body)) if status.split(' ').nth(1) == Some("200") => Ok(body.to_owned()),
        _ => Err(StatusError::NotStatus {
            addr,
            status: status.to_owned(),
        }),
    }
}

/// The status as lines for people.
pub fn render(body: &str) -> Result<String, StatusError> {
    let v: serde_json::Value = serde_json::from_str(body).map_err(StatusError::NotJson)?;
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let yes = |k: &str| if v[k] == true { "yes" } else { "no" };
    let map = |k: &str| {
        v[k].as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "none".into())
    };
    let mut out = String::new();
    let mut line = |l: String| {
        out.push_str(&l);
        out.push('\n');
    };
    line(format!("revision            {}", n("revision")));
    line(format!(
        "stream connected    {} (reconnects {})",
        yes("stream_connected"),
        n("stream_reconnects")
    ));
    line(format!("synced              {}", yes("synced")));
    line(format!("routes              {}", map("routes")));
    let per_family = |k: &str| {
        v[k].as_object()
            .map(|m| {
                m.iter()
                    .map(|(family, x)| {
                        // A family's total over its kinds, or the number itself.
                        let n = x.as_u64().unwrap_or_else(|| {
                            x.as_object()
                                .map(|k| k.values().filter_map(|n| n.as_u64()).sum())
                                .unwrap_or(0)
                        });
                        format!("{family} {n}")
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "none".into())
    };
    line(format!(
        "routes by family    {}",
        per_family("routes_by_family")
    ));
    line(format!("vteps by family     {}", per_family("vteps")));
    line(format!(
        "failing             {} (waiting for their device {}, unsupported: {})",
        n("routes_failing"),
        n("routes_waiting_for_device"),
        map("routes_unsupported")
    ));
    line(format!("corrections         {}", map("corrections")));
    line(format!(
        "policy              {} interfaces, {} rules, {} sets; {}",
        n("policy_endpoints"),
        n("policy_rules"),
        n("policy_sets"),
        match v["policy_error"].as_str() {
            Some(e) => format!("NOT IN FORCE, the previous ruleset stays: {e}"),
            None => format!("in force ({} writes refused so far)", n("policy_refused")),
        }
    ));
    line(format!(
        "writes              netlink {}, nft {}, sysctl {}",
        n("netlink_writes"),
        n("nft_writes"),
        n("sysctl_writes")
    ));
    line(format!(
        "last resync         {:.1} ms ({} resyncs)",
        v["last_resync_seconds"].as_f64().unwrap_or(0.0) * 1e3,
        n("resyncs")
    ));
    let devices: Vec<&str> = v["vxlan_devices"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| d.as_str())
        .collect();
    line(format!(
        "vxlan devices       {}",
        if devices.is_empty() {
            "none".to_owned()
        } else {
            devices.join(", ")
        }
    ));
    line(format!(
        "last error          {}",
        v["last_error"].as_str().unwrap_or("none")
    ));
    for f in v["failing_examples"].as_array().into_iter().flatten() {
        line(format!("  {}", f.as_str().unwrap_or_default()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::observe::http::{self, Request, Response};

    #[tokio::test]
    async fn fetches_the_status_from_the_listener() {
        let l = http::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = l.local_addr().unwrap();
        let task = tokio::spawn(http::serve(l, |r: Request| async move {
            match r.path.as_str() {
                "/status" => Response::new(200, http::JSON, r#"{"revision": 7}"#),
                _ => Response::not_found(&["/status"]),
            }
        }));
        let body = tokio::task::spawn_blocking(move || fetch(addr))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(body, r#"{"revision": 7}"#);
        assert!(
            render(&body)
                .unwrap()
                .starts_with("revision            7\n")
        );
        task.abort();

        // Nobody there any more: the error says where it looked and what to check.
        let _ = task.await;
        let e = tokio::task::spawn_blocking(move || fetch(addr))
            .await
            .unwrap()
            .unwrap_err();
        assert!(matches!(e, StatusError::Unreachable { .. }), "{e}");
        assert!(
            e.to_string()
                .starts_with(&format!("cannot reach routewriter at {addr}: ")),
            "{e}"
        );
    }

    #[tokio::test]
    async fn another_listener_is_not_taken_for_routewriter() {
        let l = http::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = l.local_addr().unwrap();
        let task = tokio::spawn(http::serve(l, |_r: Request| async {
            Response::not_found(&["/metrics"])
        }));
        let e = tokio::task::spawn_blocking(move || fetch(addr))
            .await
            .unwrap()
            .unwrap_err();
        assert!(
            e.to_string().contains("answered `HTTP/1.1 404 Not Found`"),
            "{e}"
        );
        task.abort();
    }

    #[test]
    fn renders_both_families() {
        let body = r#"{"revision": 3, "synced": true, "routes": {"blackhole": 2, "vxlan": 1},
            "routes_by_family": {"ipv4": {"blackhole": 1, "vxlan": 1}, "ipv6": {"blackhole": 1, "vxlan": 0}},
            "vteps": {"ipv4": 2, "ipv6": 1}, "vxlan_devices": ["vxlan.calico", "vxlan-v6.calico"]}"#;
        let t = render(body).unwrap();
        assert!(t.contains("routes by family    ipv4 2, ipv6 1\n"), "{t}");
        assert!(t.contains("vteps by family     ipv4 2, ipv6 1\n"), "{t}");
        assert!(
            t.contains("vxlan devices       vxlan.calico, vxlan-v6.calico\n"),
            "{t}"
        );
        assert!(
            t.contains("policy              0 interfaces, 0 rules, 0 sets; in force"),
            "{t}"
        );
        let t = render(r#"{"policy_endpoints": 2, "policy_error": "nft said no"}"#).unwrap();
        assert!(
            t.contains("2 interfaces, 0 rules, 0 sets; NOT IN FORCE, the previous ruleset stays: nft said no"),
            "{t}"
        );
        let t = render("{}").unwrap();
        assert!(t.contains("vxlan devices       none\n"), "{t}");
        assert!(render("not json").is_err());
    }
}
