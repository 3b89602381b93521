//! routewriter's status as bgpctl and `routewriter status` show it: fetched from the running
//! agent's own listener (`routewriter.metrics_listen`, `GET /status`), rendered as text.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The agent's status object (JSON text).
pub fn fetch_status(addr: SocketAddr) -> Result<String, String> {
    let fail = |e: std::io::Error| {
        format!(
            "cannot reach routewriter at {addr}: {e} (is it running, in this network namespace?)"
        )
    };
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(fail)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(fail)?;
    s.write_all(b"GET /status HTTP/1.1\r\nHost: routewriter\r\n\r\n")
        .map_err(fail)?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(fail)?;
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .ok_or_else(|| "routewriter answered without a body".to_owned())
}

/// The status as lines for people.
pub fn render(body: &str) -> Result<String, String> {
    let v: serde_json::Value =
        serde_json::from_str(body).map_err(|e| format!("routewriter's status is not JSON: {e}"))?;
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
