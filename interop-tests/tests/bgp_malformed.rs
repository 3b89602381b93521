//! Revised error handling (RFC 7606) on the wire: a test peer of ours (the only speaker that
//! will send broken UPDATEs on purpose) talks eBGP to bgpd and sends one UPDATE of each
//! class of error, while BIRD 2 holds a second session to bgpd on the same segment:
//! - a malformed ORIGIN: treat-as-withdraw (the route it replaces goes);
//! - a missing well-known NEXT_HOP: treat-as-withdraw;
//! - a malformed ATOMIC_AGGREGATE and a duplicate MED: attribute discard (the route stands);
//! - an NLRI longer than 32 bits: session reset with UPDATE Message Error / Invalid Network
//!   Field.
//!
//! After each, bgpd keeps running, counts the disposition per peer (`show protocols`), and
//! BIRD's session never notices (same Established period, its route still there).
//! Needs root and BIRD 2.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::time::Duration;

use bgp_wire::{Asn, Capability, Decoded, Family, Message, Open, SessionParams, decode_message};
use interop_tests::lab::bgp_peer::{BgpPeer, Bgpd, PEER_PREFIX, wait_until};
use interop_tests::lab::bird::{Bird, BirdVersion};
use interop_tests::lab::segment::Segment;

const TESTER_AS: u32 = 65000;
const TESTER: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 3);

/// Our test peer's end of a session, after OPEN/KEEPALIVE.
struct Tester {
    s: TcpStream,
    params: SessionParams,
}

impl Tester {
    fn connect() -> Tester {
        let mut s = TcpStream::connect(("10.99.0.1", 179)).expect("connect to bgpd");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let open = Open::new(
            Asn(TESTER_AS),
            90,
            TESTER,
            vec![
                Capability::Multiprotocol(Family::IPV4_UNICAST),
                Capability::FourOctetAs(Asn(TESTER_AS)),
            ],
        );
        let mut out = Vec::new();
        Message::Open(open)
            .encode(&SessionParams::default(), &mut out)
            .unwrap();
        Message::Keepalive
            .encode(&SessionParams::default(), &mut out)
            .unwrap();
        s.write_all(&out).unwrap();
        let mut t = Tester {
            s,
            params: SessionParams::default(),
        };
        // Their OPEN, then their KEEPALIVE: Established.
        assert!(matches!(t.read(), Decoded::Open(_)));
        t.params.four_octet_as = true;
        t.params.external = true;
        loop {
            if matches!(t.read(), Decoded::Keepalive) {
                break;
            }
        }
        t
    }

    fn read(&mut self) -> Decoded {
        let mut head = [0u8; 19];
        self.s.read_exact(&mut head).expect("read a header");
        let len = usize::from(u16::from_be_bytes([head[16], head[17]]));
        let mut msg = head.to_vec();
        msg.resize(len, 0);
        self.s.read_exact(&mut msg[19..]).expect("read a body");
        decode_message(&msg, &self.params).expect("bgpd sent a valid message")
    }

    /// The NOTIFICATION bgpd sends, skipping what comes before it.
    fn notification(&mut self) -> (u8, u8) {
        loop {
            if let Decoded::Notification(n) = self.read() {
                return (n.code, n.subcode);
            }
        }
    }

    fn send_update(&mut self, attrs: &[u8], nlri: &[u8]) {
        let len = 19 + 2 + 2 + attrs.len() + nlri.len();
        let mut m = vec![0xff; 16];
        m.extend_from_slice(&(len as u16).to_be_bytes());
        m.push(2);
        m.extend_from_slice(&0u16.to_be_bytes());
        m.extend_from_slice(&(attrs.len() as u16).to_be_bytes());
        m.extend_from_slice(attrs);
        m.extend_from_slice(nlri);
        self.s.write_all(&m).unwrap();
    }
}

const ORIGIN_IGP: &[u8] = &[0x40, 1, 1, 0];
/// AS_SEQUENCE [65000], 4-octet ASNs.
const AS_PATH: &[u8] = &[0x40, 2, 6, 2, 1, 0, 0, 0xfd, 0xe8];
const NEXT_HOP: &[u8] = &[0x40, 3, 4, 10, 99, 0, 3];

fn attrs(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// `10.40.<n>.0/24` as NLRI.
fn nlri(n: u8) -> Vec<u8> {
    vec![24, 10, 40, n]
}

fn counters(b: &Bgpd) -> (serde_json::Value, String) {
    let peers = b.ctl_json(&["show", "protocols", "--json"]);
    let p = peers
        .as_array()
        .and_then(|a| a.iter().find(|p| p["address"] == TESTER.to_string()))
        .cloned()
        .unwrap_or_default();
    (
        p["malformed"].clone(),
        p["state"].as_str().unwrap_or("").into(),
    )
}

#[test]
fn each_class_of_malformed_update_gets_its_disposition() {
    let seg = Segment::new("malf").unwrap();
    let a = seg.attach("malfa", "10.99.0.1/24").unwrap();
    let bird_ns = seg.attach("malfb", "10.99.0.2/24").unwrap();
    let tester_ns = seg.attach("malfc", "10.99.0.3/24").unwrap();
    let bird = Bird::start(BirdVersion::V2, &bird_ns.ns, 65001).unwrap_or_else(|e| panic!("{e}"));
    let b = Bgpd::start_with(
        &a.ns,
        &format!(
            "[bgp]\nas = 64512\nrouter_id = \"10.99.0.1\"\n\
             [[bgp.peers]]\naddress = \"10.99.0.2\"\nas = 65001\nhold_time = 9\n\
             [[bgp.peers]]\naddress = \"{TESTER}\"\nas = {TESTER_AS}\npassive = true\n\
             graceful_restart = false\n"
        ),
    );
    assert!(
        wait_until(Duration::from_secs(40), || bird.established()
            && b.route(PEER_PREFIX).is_some()),
        "BIRD's session did not come up\n{}",
        b.log()
    );
    let bird_since = || {
        b.ctl_json(&["show", "protocols", "--json"])
            .as_array()
            .and_then(|a| a.iter().find(|p| p["address"] == "10.99.0.2").cloned())
            .map(|p| (p["since_unix_ms"].as_u64(), p["state"].clone()))
    };
    let before = bird_since();

    tester_ns
        .ns
        .run_in(|| {
            let mut t = Tester::connect();
            let good = attrs(&[ORIGIN_IGP, AS_PATH, NEXT_HOP]);
            t.send_update(&good, &nlri(1));
            assert!(
                wait_until(Duration::from_secs(10), || b
                    .route("10.40.1.0/24")
                    .is_some()),
                "a valid UPDATE was not taken\n{}",
                b.log()
            );

            // ORIGIN 7: treat-as-withdraw, so 10.40.1.0/24 goes.
            let bad_origin = attrs(&[&[0x40, 1, 1, 7], AS_PATH, NEXT_HOP]);
            t.send_update(&bad_origin, &nlri(1));
            assert!(
                wait_until(Duration::from_secs(10), || b
                    .route("10.40.1.0/24")
                    .is_none()),
                "malformed ORIGIN was not treated as withdraw\n{}",
                b.log()
            );
            // No NEXT_HOP with NLRI: treat-as-withdraw.
            t.send_update(&attrs(&[ORIGIN_IGP, AS_PATH]), &nlri(3));
            // ATOMIC_AGGREGATE of length 1 and a second MED: discarded, the route stands.
            let med = [0x80, 4, 4, 0, 0, 0, 5];
            let discard = attrs(&[ORIGIN_IGP, AS_PATH, NEXT_HOP, &[0x40, 6, 1, 0], &med, &med]);
            t.send_update(&discard, &nlri(2));
            assert!(
                wait_until(Duration::from_secs(10), || b
                    .route("10.40.2.0/24")
                    .is_some()),
                "an UPDATE with a discardable attribute was refused\n{}",
                b.log()
            );
            assert!(b.route("10.40.3.0/24").is_none());
            let (m, state) = counters(&b);
            assert_eq!(state, "Established", "{m}");
            assert_eq!(m["treat_as_withdraw"], 2, "{m}");
            assert!(m["attribute_discard"].as_u64() >= Some(2), "{m}");
            assert_eq!(m["session_reset"], 0, "{m}");

            // An NLRI of 33 bits: the session is reset with the right NOTIFICATION.
            t.send_update(&good, &[33, 10, 40, 4, 0, 0]);
            assert_eq!(
                t.notification(),
                (3, 10),
                "UPDATE Message Error / Invalid Network Field"
            );
        })
        .unwrap();

    assert!(
        wait_until(Duration::from_secs(10), || counters(&b).0["session_reset"]
            == 1),
        "{:?}",
        counters(&b)
    );
    // bgpd is fine, the tester's routes are gone with its session, BIRD never noticed.
    assert!(b.route("10.40.2.0/24").is_none());
    assert_eq!(bird_since(), before, "BIRD's session was disturbed");
    assert!(b.route(PEER_PREFIX).is_some());
    assert!(bird.established());
    let table = String::from_utf8_lossy(
        &interop_tests::lab::bgpd::bgpctl(&b.socket, &["show", "protocols"]).stdout,
    )
    .into_owned();
    assert!(table.contains("malformed:"), "{table}");
}
