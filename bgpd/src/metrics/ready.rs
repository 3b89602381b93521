//! Readiness and liveness as pure functions: what bgpd knows of its datastore and its BGP
//! sessions in, a verdict with one line per reason out. Nothing here waits or asks: the
//! listener gathers the facts (with time limits) and serves the verdict.
//!
//! Ready: the datastore is connected, the speaker answered, and every BGP session is
//! Established or allowed down by `metrics.ready_allow_down`. Live: the daemon's main loops
//! answer (the speaker within its time limit, the datastore's supervisor running); a node that
//! is merely not ready must not be restarted, so liveness asks nothing of the datastore's
//! reachability or of the sessions.

use crate::datastore::DatastoreState;

/// A BGP session as the endpoints report it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PeerRow {
    /// The peer's name, as `PeerSpec::name()` gives it ("peer_10_0_0_1").
    pub name: String,
    pub address: String,
    #[serde(rename = "as")]
    pub asn: u32,
    /// The FSM state's name ("Established").
    pub state: &'static str,
    pub established: bool,
    pub received: u64,
    pub accepted: u64,
    pub advertised: u64,
    pub last_error: Option<String>,
    /// Malformed UPDATEs by RFC 7606 disposition.
    pub malformed_treat_as_withdraw: u64,
    pub malformed_attribute_discard: u64,
    pub malformed_session_reset: u64,
}

impl PeerRow {
    pub fn from_status(p: &crate::speaker::PeerStatus) -> Self {
        Self {
            name: p.spec.name(),
            address: p.spec.address.to_string(),
            asn: p.spec.asn.0,
            state: p.state.name(),
            established: p.state == bgp::fsm::State::Established,
            received: p.received,
            accepted: p.accepted,
            advertised: p.advertised,
            last_error: p.last_error.clone(),
            malformed_treat_as_withdraw: p.malformed.treat_as_withdraw,
            malformed_attribute_discard: p.malformed.attribute_discard,
            malformed_session_reset: p.malformed.session_reset,
        }
    }
}

/// The verdict of a probe: the reasons it fails, one line each; none means it passes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    pub reasons: Vec<String>,
}

impl Verdict {
    pub fn ok(&self) -> bool {
        self.reasons.is_empty()
    }

    /// The body a probe answers: `pass` alone, or the reasons one a line.
    pub fn body(&self, pass: &str) -> String {
        if self.ok() {
            format!("{pass}\n")
        } else {
            let mut s = self.reasons.join("\n");
            s.push('\n');
            s
        }
    }

    fn fail(&mut self, reason: String) {
        // One line a reason, whatever a peer's error message holds.
        self.reasons.push(reason.replace(['\r', '\n'], " "));
    }
}

/// Whether bgpd is ready to be relied on. `peers` is the speaker's answer, or why there is
/// none; `datastore` names the datastore in the reasons.
pub fn readiness(
    datastore: &str,
    state: &DatastoreState,
    peers: &Result<Vec<PeerRow>, String>,
    allow_down: &[String],
) -> Verdict {
    let mut v = Verdict::default();
    match state {
        DatastoreState::Connected => {}
        DatastoreState::Connecting => v.fail(format!("datastore {datastore}: still connecting")),
        DatastoreState::Unavailable(why) => {
            v.fail(format!("datastore {datastore}: unavailable: {why}"))
        }
    }
    match peers {
        Err(why) => v.fail(why.clone()),
        Ok(peers) => {
            for p in peers {
                if p.established || allow_down.iter().any(|a| glob(a, &p.name)) {
                    continue;
                }
                let mut reason = format!(
                    "BGP session {} ({} AS {}) is {}",
                    p.name, p.address, p.asn, p.state
                );
                if let Some(e) = &p.last_error {
                    reason.push_str(": ");
                    reason.push_str(e);
                }
                v.fail(reason);
            }
        }
    }
    v
}

/// Whether bgpd's main loops answer.
pub fn liveness(
    speaker: &Result<Vec<PeerRow>, String>,
    datastore_supervisor_alive: bool,
) -> Verdict {
    let mut v = Verdict::default();
    if let Err(why) = speaker {
        v.fail(why.clone());
    }
    if !datastore_supervisor_alive {
        v.fail("the datastore supervisor has stopped".to_owned());
    }
    v
}

/// Whether `name` matches `pattern`, where `*` stands for any run of characters (also none)
/// and every other character for itself.
pub fn glob(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    // split always yields at least one part.
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let middle: Vec<&str> = parts.collect();
    let Some((last, middle)) = middle.split_last() else {
        // No `*` at all: the whole name.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(name: &str, state: &'static str, error: Option<&str>) -> PeerRow {
        PeerRow {
            name: name.into(),
            address: "127.0.0.9".into(),
            asn: 65000,
            state,
            established: state == "Established",
            received: 0,
            accepted: 0,
            advertised: 0,
            last_error: error.map(Into::into),
            malformed_treat_as_withdraw: 0,
            malformed_attribute_discard: 0,
            malformed_session_reset: 0,
        }
    }

    #[test]
    fn globs_match_stars_and_only_stars() {
        for (p, n) in [
            ("*", "peer_10_0_0_1"),
            ("*", ""),
            ("peer_10_0_0_1", "peer_10_0_0_1"),
            ("peer_10_*", "peer_10_0_0_1"),
            ("*_1", "peer_10_0_0_1"),
            ("peer_*_0_*", "peer_10_0_0_1"),
            ("p*1*1", "peer_10_0_0_1"),
        ] {
            assert!(glob(p, n), "{p} ~ {n}");
        }
        for (p, n) in [
            ("peer_10_0_0_1", "peer_10_0_0_10"),
            ("peer_10_0_0_1", "peer_10_0_0_"),
            ("peer_11_*", "peer_10_0_0_1"),
            ("*_2", "peer_10_0_0_1"),
            ("peer_1*0_1*0", "peer_10_1"),
            ("?eer_10_0_0_1", "peer_10_0_0_1"),
            ("a*a", "a"),
        ] {
            assert!(!glob(p, n), "{p} !~ {n}");
        }
    }

    #[test]
    fn ready_needs_the_datastore_and_every_session_or_its_allowance() {
        let ok: Result<Vec<PeerRow>, String> = Ok(vec![
            peer("peer_a", "Established", None),
            peer("peer_b", "Established", Some("old")),
        ]);
        let v = readiness("sqlite:/x", &DatastoreState::Connected, &ok, &[]);
        assert!(v.ok(), "{v:?}");
        assert_eq!(v.body("ready"), "ready\n");
        // No peers at all: nothing to wait for.
        assert!(readiness("s", &DatastoreState::Connected, &Ok(vec![]), &[]).ok());

        let down = Ok(vec![
            peer("peer_a", "Established", None),
            peer("peer_b", "Active", Some("connection refused\nby 127.0.0.9")),
            peer("peer_c", "Idle", None),
        ]);
        let v = readiness(
            "sqlite:/x",
            &DatastoreState::Unavailable("disk gone".into()),
            &down,
            &[],
        );
        assert!(!v.ok());
        assert_eq!(
            v.body("ready"),
            "datastore sqlite:/x: unavailable: disk gone\n\
             BGP session peer_b (127.0.0.9 AS 65000) is Active: connection refused by 127.0.0.9\n\
             BGP session peer_c (127.0.0.9 AS 65000) is Idle\n"
        );
        let allow = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let v = readiness("s", &DatastoreState::Connected, &down, &allow(&["peer_b"]));
        assert_eq!(v.reasons.len(), 1, "{v:?}");
        assert!(v.reasons[0].contains("peer_c"));
        assert!(
            readiness(
                "s",
                &DatastoreState::Connected,
                &down,
                &allow(&["peer_[bc]", "peer_*"])
            )
            .ok()
        );
        assert!(readiness("s", &DatastoreState::Connected, &down, &allow(&["*"])).ok());
        // The allowance covers sessions only.
        let v = readiness("s", &DatastoreState::Connecting, &down, &allow(&["*"]));
        assert_eq!(v.reasons, ["datastore s: still connecting"]);
        let v = readiness(
            "s",
            &DatastoreState::Connected,
            &Err("BGP speaker did not answer within 2s".into()),
            &allow(&["*"]),
        );
        assert_eq!(v.reasons, ["BGP speaker did not answer within 2s"]);
    }

    #[test]
    fn live_asks_only_the_main_loops() {
        assert!(liveness(&Ok(vec![peer("peer_b", "Active", None)]), true).ok());
        let v = liveness(&Err("BGP speaker has stopped".into()), false);
        assert_eq!(v.reasons.len(), 2);
        assert_eq!(
            v.body("live"),
            "BGP speaker has stopped\nthe datastore supervisor has stopped\n"
        );
    }
}
