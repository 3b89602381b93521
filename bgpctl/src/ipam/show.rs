//! What `bgpctl ipam show` prints: utilisation per pool and, with `--show-blocks`, per block,
//! in `calicoctl ipam show`'s shape (a GROUPING column of "IP Pool" and "Block" rows, each
//! block under its pool; totals, in use and free with their share) for both families alike,
//! and the same as one JSON document. Sans-IO: it renders an answer of `Ipam.ShowBlocks`.

use std::net::IpAddr;

use proto::v1 as pb;
use serde_json::{Value, json};

use crate::table::Table;

/// A prefix as the CLI needs it: its family, how many addresses it spans, what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    len: u8,
}

impl Cidr {
    /// "172.20.0.0/16", "fd00::/48"; `None` for anything else.
    pub fn parse(text: &str) -> Option<Cidr> {
        let (addr, len) = text.split_once('/')?;
        let addr: IpAddr = addr.parse().ok()?;
        let len: u8 = len.parse().ok()?;
        (len <= Self::max_len(addr)).then_some(Cidr { addr, len })
    }

    fn max_len(addr: IpAddr) -> u8 {
        if addr.is_ipv4() { 32 } else { 128 }
    }

    pub fn is_ipv6(&self) -> bool {
        self.addr.is_ipv6()
    }

    /// "IPv4" or "IPv6".
    pub fn family(&self) -> &'static str {
        if self.is_ipv6() { "IPv6" } else { "IPv4" }
    }

    /// How many addresses it spans (an IPv6 /0's 2^128 saturates).
    pub fn addresses(&self) -> u128 {
        1u128
            .checked_shl(u32::from(Self::max_len(self.addr) - self.len))
            .unwrap_or(u128::MAX)
    }

    pub fn contains(&self, addr: IpAddr) -> bool {
        let (net, a) = match (self.addr, addr) {
            (IpAddr::V4(n), IpAddr::V4(a)) => (
                u128::from(u32::from(n)) << 96,
                u128::from(u32::from(a)) << 96,
            ),
            (IpAddr::V6(n), IpAddr::V6(a)) => (u128::from(n), u128::from(a)),
            _ => return false,
        };
        let mask = u128::MAX
            .checked_shl(128 - u32::from(self.len))
            .unwrap_or(0);
        net & mask == a & mask
    }

    /// Orders IPv4 before IPv6, then by address and length (not as text: 10.0.10.0 after 10.0.2.0).
    fn order(&self) -> (bool, u128, u8) {
        let n = match self.addr {
            IpAddr::V4(a) => u128::from(u32::from(a)),
            IpAddr::V6(a) => u128::from(a),
        };
        (self.addr.is_ipv6(), n, self.len)
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// A count as people read it: exact up to 2^32 (every IPv4 count), beyond that as
/// `calicoctl` prints counts (Go's `%.5g`), e.g. 1.2089e+24 for an IPv6 /48.
pub fn count(n: u128) -> String {
    if n < 1 << 32 {
        return n.to_string();
    }
    let text = format!("{:.4e}", n as f64);
    let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
    let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.abs())
}

/// "5 (8%)": a count and its share of `total`.
fn share(n: u128, total: u128) -> String {
    let percent = if total == 0 {
        0.0
    } else {
        100.0 * n as f64 / total as f64
    };
    format!("{} ({percent:.0}%)", count(n))
}

/// A count in JSON: an exact integer when it fits 64 bits, else a float (an IPv6 pool's).
fn json_count(n: u128) -> Value {
    match u64::try_from(n) {
        Ok(n) => json!(n),
        Err(_) => json!(n as f64),
    }
}

pub fn state_name(s: i32) -> &'static str {
    match pb::BlockState::try_from(s) {
        Ok(pb::BlockState::Pending) => "pending",
        Ok(pb::BlockState::Confirmed) => "confirmed",
        Ok(pb::BlockState::PendingDeletion) => "pending-deletion",
        _ => "-",
    }
}

/// A pool's size from its CIDR: the server's 64-bit `size` saturates for IPv6 pools.
fn pool_total(p: &pb::PoolUsage) -> u128 {
    Cidr::parse(&p.cidr).map_or(u128::from(p.size), |c| c.addresses())
}

fn block_total(b: &pb::BlockUsage) -> u128 {
    Cidr::parse(&b.cidr).map_or(u128::from(b.used + b.free), |c| c.addresses())
}

fn family_of(cidr: &str) -> &'static str {
    Cidr::parse(cidr).map_or("-", |c| c.family())
}

/// The blocks of the answer in address order, each with the index of its pool (`None` for a
/// block of no listed pool: shown last rather than hidden).
fn blocks_by_pool(r: &pb::ShowBlocksResponse) -> Vec<(Option<usize>, &pb::BlockUsage)> {
    let mut blocks: Vec<(Option<usize>, &pb::BlockUsage)> = r
        .blocks
        .iter()
        .map(|b| (r.pools.iter().position(|p| p.name == b.pool), b))
        .collect();
    blocks.sort_by_key(|(pool, b)| {
        (
            pool.is_none(),
            *pool,
            Cidr::parse(&b.cidr).map(|c| c.order()),
        )
    });
    blocks
}

pub fn table(r: &pb::ShowBlocksResponse, show_blocks: bool) -> String {
    let mut headers = vec![
        "grouping",
        "cidr",
        "ips total",
        "ips in use",
        "ips free",
        "pool",
        "blocks",
    ];
    if show_blocks {
        headers.extend(["affinity", "state", "borrowed"]);
    }
    let mut t = Table::new(&headers);
    let blocks = blocks_by_pool(r);
    let block_row = |b: &pb::BlockUsage| {
        let total = block_total(b);
        vec![
            "Block".into(),
            b.cidr.clone(),
            count(total),
            share(b.used.into(), total),
            share(b.free.into(), total),
            b.pool.clone(),
            "-".into(),
            if b.affinity.is_empty() {
                "-".into()
            } else {
                b.affinity.clone()
            },
            state_name(b.state).into(),
            b.borrowed.to_string(),
        ]
    };
    for (i, p) in r.pools.iter().enumerate() {
        let total = pool_total(p);
        let used = u128::from(p.used);
        let mut row = vec![
            "IP Pool".into(),
            p.cidr.clone(),
            count(total),
            share(used, total),
            share(total.saturating_sub(used), total),
            p.name.clone(),
            p.blocks.to_string(),
        ];
        if show_blocks {
            let mine = blocks.iter().filter(|(pool, _)| *pool == Some(i));
            let borrowed: u32 = mine.clone().map(|(_, b)| b.borrowed).sum();
            row.extend(["-".into(), "-".into(), borrowed.to_string()]);
            t.row(row);
            for (_, b) in mine {
                t.row(block_row(b));
            }
        } else {
            t.row(row);
        }
    }
    if show_blocks {
        for (_, b) in blocks.iter().filter(|(pool, _)| pool.is_none()) {
            t.row(block_row(b));
        }
    }
    t.render()
}

pub fn to_json(r: &pb::ShowBlocksResponse) -> Value {
    json!({
        "pools": r.pools.iter().map(|p| {
            let total = pool_total(p);
            json!({
                "name": p.name,
                "cidr": p.cidr,
                "family": family_of(&p.cidr),
                "size": json_count(total),
                "used": p.used,
                "free": json_count(total.saturating_sub(u128::from(p.used))),
                "blocks": p.blocks,
            })
        }).collect::<Vec<_>>(),
        "blocks": blocks_by_pool(r).into_iter().map(|(_, b)| json!({
            "cidr": b.cidr,
            "family": family_of(&b.cidr),
            "pool": b.pool,
            "affinity": b.affinity,
            "state": state_name(b.state),
            "size": json_count(block_total(b)),
            "used": b.used,
            "free": b.free,
            "borrowed": b.borrowed,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_of_both_families() {
        let v4 = Cidr::parse("172.20.0.0/16").unwrap();
        assert_eq!((v4.family(), v4.addresses()), ("IPv4", 65536));
        assert!(v4.contains("172.20.255.1".parse().unwrap()));
        assert!(!v4.contains("172.21.0.1".parse().unwrap()));
        assert!(!v4.contains("::ffff:172.20.0.1".parse().unwrap()));
        let v6 = Cidr::parse("fd00:20::/48").unwrap();
        assert_eq!((v6.family(), v6.addresses()), ("IPv6", 1 << 80));
        assert!(v6.contains("fd00:20:0:ffff::1".parse().unwrap()));
        assert!(!v6.contains("fd00:21::1".parse().unwrap()));
        assert!(!v6.contains("10.0.0.1".parse().unwrap()));
        assert_eq!(Cidr::parse("::/0").unwrap().addresses(), u128::MAX);
        assert!(
            Cidr::parse("::/0")
                .unwrap()
                .contains("fd00::1".parse().unwrap())
        );
        for bad in [
            "10.0.0.0/33",
            "fd00::/129",
            "10.0.0.0",
            "blue",
            "10.0.0.0/x",
        ] {
            assert_eq!(Cidr::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn counts_read_like_calicoctls() {
        assert_eq!(count(64), "64");
        assert_eq!(count(65536), "65536");
        assert_eq!(count(u128::from(u32::MAX)), "4294967295");
        assert_eq!(count(1 << 64), "1.8447e+19");
        assert_eq!(count(1 << 80), "1.2089e+24");
        assert_eq!(count(10_000_000_000), "1e+10");
        assert_eq!(share(5, 64), "5 (8%)");
        assert_eq!(share((1 << 80) - 7, 1 << 80), "1.2089e+24 (100%)");
        assert_eq!(share(0, 0), "0 (0%)");
    }

    fn answer() -> pb::ShowBlocksResponse {
        let block = |cidr: &str, pool: &str, node: &str, used: u32, free: u32| pb::BlockUsage {
            cidr: cidr.into(),
            pool: pool.into(),
            affinity: node.into(),
            state: pb::BlockState::Confirmed.into(),
            used,
            free,
            borrowed: 0,
        };
        pb::ShowBlocksResponse {
            pools: vec![
                pb::PoolUsage {
                    name: "v4".into(),
                    cidr: "10.0.0.0/16".into(),
                    size: 65536,
                    used: 3,
                    free: 65533,
                    blocks: 2,
                },
                pb::PoolUsage {
                    name: "v6".into(),
                    cidr: "fd00::/48".into(),
                    // What a server sends for 2^80: saturated.
                    size: u64::MAX,
                    used: 2,
                    free: u64::MAX - 2,
                    blocks: 1,
                },
            ],
            // In the server's (text) order: 10.0.10.0 before 10.0.2.0.
            blocks: vec![
                block("fd00::40/122", "v6", "node-a", 2, 62),
                block("10.0.10.0/26", "v4", "node-b", 1, 63),
                block("10.0.2.0/26", "v4", "node-a", 2, 62),
            ],
        }
    }

    #[test]
    fn both_families_in_one_table() {
        let text = table(&answer(), true);
        let rows: Vec<Vec<&str>> = text
            .lines()
            .map(|l| {
                l.split("  ")
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .collect()
            })
            .collect();
        assert_eq!(
            rows[0],
            [
                "GROUPING",
                "CIDR",
                "IPS TOTAL",
                "IPS IN USE",
                "IPS FREE",
                "POOL",
                "BLOCKS",
                "AFFINITY",
                "STATE",
                "BORROWED"
            ]
        );
        assert_eq!(
            rows[1],
            [
                "IP Pool",
                "10.0.0.0/16",
                "65536",
                "3 (0%)",
                "65533 (100%)",
                "v4",
                "2",
                "-",
                "-",
                "0"
            ]
        );
        assert_eq!(
            rows[2][..5],
            ["Block", "10.0.2.0/26", "64", "2 (3%)", "62 (97%)"]
        );
        assert_eq!(rows[2][7..], ["node-a", "confirmed", "0"]);
        assert_eq!(rows[3][1], "10.0.10.0/26");
        assert_eq!(
            rows[4][..7],
            [
                "IP Pool",
                "fd00::/48",
                "1.2089e+24",
                "2 (0%)",
                "1.2089e+24 (100%)",
                "v6",
                "1"
            ]
        );
        assert_eq!(
            rows[5][..5],
            ["Block", "fd00::40/122", "64", "2 (3%)", "62 (97%)"]
        );
        assert_eq!(rows.len(), 6);
        // Without --show-blocks: the pool rows only, no block columns.
        let text = table(&answer(), false);
        assert_eq!(text.lines().count(), 3);
        assert!(
            !text.contains("AFFINITY") && !text.contains("Block"),
            "{text}"
        );
    }

    #[test]
    fn json_counts_are_exact_where_they_can_be() {
        let v = to_json(&answer());
        assert_eq!(v["pools"][0]["family"], "IPv4");
        assert_eq!(v["pools"][0]["size"], 65536);
        assert_eq!(v["pools"][0]["free"], 65533);
        assert_eq!(v["pools"][1]["family"], "IPv6");
        assert_eq!(v["pools"][1]["size"].as_f64(), Some(2f64.powi(80)));
        assert_eq!(v["pools"][1]["used"], 2);
        let cidrs: Vec<&str> = v["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["cidr"].as_str().unwrap())
            .collect();
        assert_eq!(cidrs, ["10.0.2.0/26", "10.0.10.0/26", "fd00::40/122"]);
        assert_eq!(v["blocks"][2]["family"], "IPv6");
        assert_eq!(v["blocks"][2]["size"], 64);
    }
}
