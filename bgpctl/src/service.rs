//! `bgpctl service announce|withdraw|list`: single service addresses this node announces
//! under a lease (bgpd's `Services` service). The TTL is parsed here (`60s`, `5m`, `1h`, or
//! plain seconds); its range and the address are bgpd's to check.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Subcommand;
use proto::v1 as pb;
use proto::v1::services_client::ServicesClient;
use serde_json::json;
use tonic::transport::Channel;

use super::status::human_duration;
use super::table::Table;
use super::{CtlError, Output};

#[derive(Subcommand)]
pub enum ServiceCommand {
    /// Announce (or renew) a service address from this node as a /32 or /128; it must lie
    /// inside serviceExternalIPs or serviceLoadBalancerIPs of the BGPConfiguration.
    Announce {
        address: String,
        /// How long the announcement lasts unless renewed: 60s, 5m, 1h or seconds (1s-24h).
        #[arg(long, default_value = "60s", value_parser = parse_ttl)]
        ttl: u32,
        /// Who asks, e.g. NAMESPACE/NAME of the service (shown by list).
        #[arg(long, default_value = "")]
        owner: String,
        #[arg(long)]
        json: bool,
    },
    /// Stop announcing a service address from this node.
    Withdraw {
        address: String,
        #[arg(long)]
        json: bool,
    },
    /// The service addresses this node announces, with their leases.
    List {
        #[arg(long)]
        json: bool,
    },
}

/// `60s`, `5m`, `2h`, `1d` or plain seconds, as whole seconds.
pub fn parse_ttl(text: &str) -> Result<u32, String> {
    let t = text.trim();
    let (digits, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let n: u32 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 60s, 5m or 1h"))?;
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: the unit must be s, m, h or d")),
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too long"))
}

/// Milliseconds from now until `unix_ms` (0 when past).
fn remaining(unix_ms: u64, now: SystemTime) -> Duration {
    let now_ms = now
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis();
    Duration::from_millis(u64::try_from(u128::from(unix_ms).saturating_sub(now_ms)).unwrap_or(0))
}

pub fn lease_json(l: &pb::ServiceLease, now: SystemTime) -> serde_json::Value {
    json!({
        "address": l.address,
        "owner": l.owner,
        "ttl_s": l.ttl_s,
        "expires_unix_ms": l.expires_unix_ms,
        "expires_in_s": remaining(l.expires_unix_ms, now).as_secs(),
    })
}

pub fn to_table(leases: &[pb::ServiceLease], now: SystemTime) -> String {
    let mut t = Table::new(&["address", "owner", "ttl", "expires in"]);
    for l in leases {
        t.row(vec![
            l.address.clone(),
            if l.owner.is_empty() {
                "-".into()
            } else {
                l.owner.clone()
            },
            human_duration(u64::from(l.ttl_s)),
            human_duration(remaining(l.expires_unix_ms, now).as_secs()),
        ]);
    }
    t.render()
}

pub async fn run(
    channel: Channel,
    command: ServiceCommand,
    out: &mut Output,
) -> Result<(), CtlError> {
    let mut client = ServicesClient::new(channel);
    match command {
        ServiceCommand::Announce {
            address,
            ttl,
            owner,
            json,
        } => {
            let lease = client
                .announce_service(pb::AnnounceServiceRequest {
                    address,
                    ttl_s: ttl,
                    owner,
                })
                .await?
                .into_inner();
            if json {
                out.json(&lease_json(&lease, SystemTime::now()))
            } else {
                out.line(&format!(
                    "{} announced for {}",
                    lease.address,
                    human_duration(u64::from(lease.ttl_s))
                ))
            }
        }
        ServiceCommand::Withdraw { address, json } => {
            client
                .withdraw_service(pb::WithdrawServiceRequest {
                    address: address.clone(),
                })
                .await?;
            if json {
                out.json(&json!({"withdrawn": address}))
            } else {
                out.line(&format!("{address} withdrawn"))
            }
        }
        ServiceCommand::List { json } => {
            let leases = client
                .list_services(pb::ListServicesRequest {})
                .await?
                .into_inner()
                .leases;
            let now = SystemTime::now();
            if json {
                out.json(&serde_json::Value::Array(
                    leases.iter().map(|l| lease_json(l, now)).collect(),
                ))
            } else {
                out.text(&to_table(&leases, now))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls() {
        assert_eq!(parse_ttl("60s"), Ok(60));
        assert_eq!(parse_ttl("60"), Ok(60));
        assert_eq!(parse_ttl("5m"), Ok(300));
        assert_eq!(parse_ttl("2h"), Ok(7200));
        assert_eq!(parse_ttl("1d"), Ok(86_400));
        assert_eq!(parse_ttl("0"), Ok(0));
        assert!(parse_ttl("1.5s").is_err());
        assert!(parse_ttl("10x").unwrap_err().contains("unit"));
        assert!(parse_ttl("").is_err());
        assert!(parse_ttl("99999999d").unwrap_err().contains("too long"));
    }

    #[test]
    fn the_list_shows_address_owner_ttl_and_time_left() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let leases = vec![
            pb::ServiceLease {
                address: "192.0.2.10".into(),
                owner: "default/web".into(),
                ttl_s: 60,
                expires_unix_ms: 1_000_042_500,
            },
            pb::ServiceLease {
                address: "2001:db8::10".into(),
                owner: String::new(),
                ttl_s: 3600,
                // Already past (clocks disagree by a moment): zero, not a wrap.
                expires_unix_ms: 999_999_000,
            },
        ];
        assert_eq!(
            to_table(&leases, now),
            "ADDRESS       OWNER        TTL       EXPIRES IN\n\
             192.0.2.10    default/web  1m 0s     42s\n\
             2001:db8::10  -            1h 0m 0s  0s\n"
        );
        let j = lease_json(&leases[0], now);
        assert_eq!(j["expires_in_s"], 42);
        assert_eq!(j["owner"], "default/web");
        assert_eq!(j["ttl_s"], 60);
    }
}
