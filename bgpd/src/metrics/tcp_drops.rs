//! What the kernel drops before a BGP message exists: TCP segments refused by TCP MD5
//! (RFC 2385) and by GTSM's minimum TTL (RFC 5082, `IP_MINTTL`). bgpd never sees them, so it
//! cannot count them itself; the kernel's own counters (`/proc/net/netstat`, `TcpExt`, of
//! bgpd's network namespace) are exported as they are. They count for the namespace, not
//! per session.

/// The counters exported: (label, the kernel's name).
const COUNTERS: [(&str, &str); 4] = [
    ("md5_failure", "TCPMD5Failure"),
    ("md5_not_found", "TCPMD5NotFound"),
    ("md5_unexpected", "TCPMD5Unexpected"),
    ("min_ttl", "TCPMinTTLDrop"),
];

/// The counters from the text of `/proc/net/netstat` (pairs of a header line and a value
/// line per group); a counter the kernel lacks is left out.
pub fn parse(netstat: &str) -> Vec<(&'static str, u64)> {
    let lines: Vec<&str> = netstat.lines().collect();
    let Some((names, values)) = lines.windows(2).find_map(|w| {
        let names = w[0].strip_prefix("TcpExt:")?;
        let values = w[1].strip_prefix("TcpExt:")?;
        Some((names, values))
    }) else {
        return Vec::new();
    };
    let pairs: Vec<(&str, &str)> = names
        .split_whitespace()
        .zip(values.split_whitespace())
        .collect();
    COUNTERS
        .iter()
        .filter_map(|(label, name)| {
            let (_, v) = pairs.iter().find(|(n, _)| n == name)?;
            Some((*label, v.parse().ok()?))
        })
        .collect()
}

/// This namespace's counters now (none when the file cannot be read).
pub fn read() -> Vec<(&'static str, u64)> {
    std::fs::read_to_string("/proc/net/netstat")
        .map(|t| parse(&t))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tcpext_group_is_found_and_missing_counters_left_out() {
        let text = "TcpExt: SyncookiesSent TCPMD5NotFound TCPMD5Unexpected TCPMD5Failure X\n\
                    TcpExt: 0 3 1 7 9\n\
                    IpExt: TCPMinTTLDrop\nIpExt: 5\n";
        assert_eq!(
            parse(text),
            vec![
                ("md5_failure", 7),
                ("md5_not_found", 3),
                ("md5_unexpected", 1)
            ]
        );
        assert!(parse("garbage").is_empty());
        assert!(parse("TcpExt: TCPMD5Failure\nTcpExt: lots\n").is_empty());
    }

    #[test]
    fn this_kernel_has_them() {
        let got = read();
        assert!(got.iter().any(|(l, _)| *l == "md5_failure"), "{got:?}");
        assert!(got.iter().any(|(l, _)| *l == "min_ttl"), "{got:?}");
    }
}
