//! Hostile BGP input, as a catalog: a raw test peer of ours (`lab::tester`) sends bgpd one
//! malformed or hostile message per case over real TCP, from its own address in a namespace
//! (each case is a fresh, separately configured peer, so no case waits out another's error
//! back-off), and checks the exact NOTIFICATION (code, subcode, and data where RFC 4271
//! specifies it) or the exact routes and RFC 7606 counters bgpd holds afterwards. Meanwhile
//! BIRD 2 holds an unrelated eBGP session to the same bgpd: after every case it must still be
//! in the same Established period with its route in bgpd's table. The segment is dual-stack:
//! the RFC 8950 cases run over IPv6 sessions, where bgpd offers the extended next hop
//! capability for IPv4 unicast (and only there), and the tester offers it as a peer would.
//!
//! Why this file is long: it is the catalog itself, one entry per case (input, expected, why),
//! in groups: message header (RFC 4271 §6.1), OPEN (§6.2, RFC 6793, RFC 7607, RFC 9072), FSM
//! (RFC 6608), UPDATE over eBGP and over iBGP (§6.3, RFC 7606, RFC 4760, RFC 8950, RFC 5065,
//! RFC 4456), UPDATE with the extended next hop capability negotiated (RFC 8950, RFC 7606
//! §7.11), ROUTE-REFRESH (RFC 7313) and NOTIFICATION handling; splitting it would scatter the
//! one table a reader wants to see whole.
//!
//! Where the RFCs leave a choice, BIRD 2 is the reference, asked in the same run: the tester
//! replays those cases to BIRD 2 (passive protocols `t1`..`t5` of the same BIRD over IPv4,
//! `t6`..`t13` over IPv6 with `extended next hop on`) and the output shows BIRD's outcome
//! under bgpd's. Matching BIRD 2:
//! - first AS of an eBGP AS_PATH not the peer's AS (RFC 4271 §6.3 and RFC 7606 §7.2 make the
//!   check a MAY): not checked, the route is kept (BIRD's `enforce first as` is off by
//!   default);
//! - a NEXT_HOP that is the receiver's own address (RFC 4271 §5.1.3): the route is not used
//!   (bgpd counts it as rejected, not as malformed);
//! - an IPv4 route in MP_REACH_NLRI with an IPv6 next hop when RFC 8950 was not negotiated
//!   (also when only the peer offered the capability: bgpd offers none on IPv4 sessions):
//!   treat-as-withdraw of those routes only;
//! - with RFC 8950 negotiated: a 16-octet global, a 32-octet global + link-local and a
//!   link-local-alone next hop are held as sent; `::` and multicast ones are treat-as-withdraw;
//!   an IPv4-mapped one (`::ffff:a.b.c.d`) is the IPv4 next hop it maps; a next hop length
//!   other than 4, 16 or 32 resets the session with 3/9 (RFC 7606 §7.11: the NLRI after it
//!   cannot be located);
//! - ORIGINATOR_ID equal to our router id on iBGP (RFC 4456 §8): the route is ignored.
//!
//! Deliberate differences (counted in the summary line):
//! - an unrecognised well-known attribute: bgpd resets the session with 3/2 and the attribute
//!   as data, as RFC 4271 §6.3 prescribes (RFC 7606 does not revise it); BIRD 2 treats the
//!   UPDATE as withdraw instead.
//! - RFC 8950 next hop lengths other than 4, 16 or 32: the same 3/9, but with the attribute
//!   as data, which RFC 4271 §6.3 requires of an Optional Attribute Error; BIRD 2 sends none.
//! - an IPv6 next hop for IPv4 routes on a session where bgpd offered the extended next hop
//!   capability and the peer did not (or only for another family): bgpd holds the routes, as
//!   the capability tells the peer what the receiver can take (RFC 8950 §4) and nothing asks
//!   the sender to offer it too; BIRD 2 (and FRR) negotiate it as both-or-none and treat them
//!   as withdrawn.
//!
//! Found by this catalog and fixed: BoRR/EoRR when enhanced route refresh was not
//! negotiated were acted on (the peer's routes swept) instead of being read as plain
//! RFC 2918 refresh requests, as BIRD 2 reads them (`bgp::fsm`); an IPv4-mapped IPv6 next
//! hop for IPv4 routes was held as that IPv6 address, which no packet can be sent to (and an
//! IPv4 route via IPv6 stays out of the kernel, while it could still be the best route),
//! instead of as the IPv4 address, as BIRD 2 reads it (`bgp_wire::attributes::mp`); on an
//! IPv6 session carrying IPv4 only, a route whose next hop is bgpd's own link-local address
//! was held (RFC 4271 §5.1.3: not usable), because the RIB knew only the session's next hops
//! in use (`bgp::rib::PeerInfo::local_link_local`).
//!
//! Prints one line per case (name, input, expected, got) and the summary
//! `hostile BGP input: N cases, N passed, D deliberate differences`. Needs root and BIRD 2.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use interop_tests::lab::bgp_peer::{BgpPeer, Bgpd, PEER_PREFIX, wait_until};
use interop_tests::lab::bird::{Bird, BirdVersion};
use interop_tests::lab::link6::{bird_next_hops, link_local};
use interop_tests::lab::segment::{Member, Segment};
use interop_tests::lab::tester::{
    AS_TRANS, IPV4_OVER_IPV6, KEEPALIVE, Notified, OPEN, ROUTE_REFRESH, Tester, as_path, attr,
    caps_param, ext_next_hop_cap, hex, keepalive, mp_reach_value, msg, next_hop, nlri24,
    notification, open_with, origin_igp, std_caps, std_open, update,
};

const BGPD: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
const BIRD_ADDR: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);
/// The tester's first IPv4 address: the classic NEXT_HOP of the IPv6 peers' valid routes.
const TESTER: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 9);
/// The segment's IPv6 prefix (a /64): bgpd, BIRD 2 and the IPv6 test peers.
const NET6: [u16; 4] = [0xfd99, 0x99, 0, 0];
const BGPD6: Ipv6Addr = addr6(1);
const BIRD_ADDR6: Ipv6Addr = addr6(2);
/// A global address on the segment that is nobody's session address (a third router on the
/// link): the IPv6 next hop of the RFC 8950 cases, on-link as BIRD 2 wants it.
const OTHER6: Ipv6Addr = addr6(0x77);
/// A link-local address beside it.
const OTHER_LL: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0x77);
/// The same in IPv4 (in no pool): a next hop that differs from the valid route's.
const OTHER4: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 150);

/// `fd99:99::<host>`.
const fn addr6(host: u16) -> Ipv6Addr {
    Ipv6Addr::new(NET6[0], NET6[1], NET6[2], NET6[3], 0, 0, 0, host)
}
const LOCAL_AS: u32 = 64512;
const EBGP_AS: u32 = 65000;
/// A peer AS that needs 4 octets, announced with AS_TRANS and the capability.
const AS4: u32 = 4_200_000_001;
/// Another, for the peer that leaves the capability out.
const AS4_NOCAP: u32 = 4_200_000_002;

/// The kinds of configured test peer; each has a range of addresses, one per case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pool {
    Ebgp,
    Ibgp,
    As4,
    As4NoCap,
    /// eBGP over IPv6 carrying IPv4 unicast: bgpd offers the extended next hop capability
    /// (RFC 8950) there. Host numbers are those of `fd99:99::<host>`.
    Ext,
    /// The same over iBGP.
    ExtIbgp,
}

impl Pool {
    const ALL: [Pool; 6] = [
        Pool::Ebgp,
        Pool::Ibgp,
        Pool::As4,
        Pool::As4NoCap,
        Pool::Ext,
        Pool::ExtIbgp,
    ];

    fn asn(self) -> u32 {
        match self {
            Pool::Ebgp | Pool::Ext => EBGP_AS,
            Pool::Ibgp | Pool::ExtIbgp => LOCAL_AS,
            Pool::As4 => AS4,
            Pool::As4NoCap => AS4_NOCAP,
        }
    }

    /// First and last host octet of the pool's addresses (10.99.0.x).
    fn range(self) -> (u8, u8) {
        match self {
            Pool::Ebgp => (10, 99),
            Pool::Ibgp => (100, 139),
            Pool::As4 => (160, 164),
            Pool::As4NoCap => (170, 174),
            Pool::Ext => (0x10, 0x2f),
            Pool::ExtIbgp => (0x30, 0x37),
        }
    }

    fn index(self) -> usize {
        match self {
            Pool::Ebgp => 0,
            Pool::Ibgp => 1,
            Pool::As4 => 2,
            Pool::As4NoCap => 3,
            Pool::Ext => 4,
            Pool::ExtIbgp => 5,
        }
    }

    /// A peer address of the pool, as bgpd's configuration names it.
    fn address(self, host: u8) -> IpAddr {
        match self {
            Pool::Ext | Pool::ExtIbgp => addr6(u16::from(host)).into(),
            _ => Ipv4Addr::new(10, 99, 0, host).into(),
        }
    }
}

/// The peer a case plays: its address, AS and the prefixes it uses.
#[derive(Debug, Clone, Copy)]
struct Peer {
    /// Its IPv4 address (session and NEXT_HOP) and BGP identifier; on an IPv6 session only
    /// the identifier.
    addr: Ipv4Addr,
    /// Its IPv6 session address, for a session over IPv6.
    addr6: Option<Ipv6Addr>,
    asn: u32,
    /// The case's number: its prefixes are 10.40.n.0/24 (the one under test) and
    /// 10.41.n.0/24 (a sentinel sent after the hostile message).
    n: u8,
}

impl Peer {
    fn external(&self) -> bool {
        self.asn != LOCAL_AS
    }
    fn prefix(&self) -> String {
        format!("10.40.{}.0/24", self.n)
    }
    fn sentinel(&self) -> String {
        format!("10.41.{}.0/24", self.n)
    }
    fn nlri(&self) -> Vec<u8> {
        nlri24(10, 40, self.n)
    }
    /// A valid OPEN for this peer.
    fn open(&self, extra_caps: &[u8]) -> Vec<u8> {
        std_open(self.asn, self.addr, extra_caps)
    }
    /// The session's own address.
    fn transport(&self) -> IpAddr {
        self.addr6.map_or(self.addr.into(), IpAddr::from)
    }
    /// bgpd's address in the session's family.
    fn bgpd(&self) -> IpAddr {
        if self.addr6.is_some() {
            BGPD6.into()
        } else {
            BGPD.into()
        }
    }
    /// Our IPv4 next hop: the session address, or on an IPv6 session the tester's IPv4 one.
    fn nh4(&self) -> Ipv4Addr {
        if self.addr6.is_some() {
            TESTER
        } else {
            self.addr
        }
    }
    /// ORIGIN, AS_PATH ([our AS] on eBGP, empty on iBGP) and NEXT_HOP (our address).
    fn base(&self) -> Vec<u8> {
        [origin_igp(), self.path(), next_hop(self.nh4())].concat()
    }
    fn path(&self) -> Vec<u8> {
        if self.external() {
            as_path(&[self.asn])
        } else {
            as_path(&[])
        }
    }
    /// The valid UPDATE announcing the case's prefix.
    fn good(&self) -> Vec<u8> {
        update(&[], &self.base(), &self.nlri())
    }
    fn good_sentinel(&self) -> Vec<u8> {
        update(&[], &self.base(), &nlri24(10, 41, self.n))
    }
}

/// One catalog entry's outcome.
struct Record {
    group: &'static str,
    name: &'static str,
    input: String,
    expected: String,
    got: String,
    passed: bool,
    mark: Mark,
    /// What BIRD 2 did with the same input, where it was asked.
    bird: Option<String>,
}

/// How a case's outcome counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    /// bgpd must give the expected outcome.
    Plain,
    /// As `Plain`; the outcome differs from BIRD 2's on purpose (see the module text).
    Deliberate,
}

/// BIRD 2 protocols the tester can play the peer of, for the reference cases: `t1`...
/// over IPv4, then `t<BIRD_REFS + 1>`... over IPv6 with `extended next hop on`.
const BIRD_REFS: u8 = 5;
const BIRD_REFS6: u8 = 8;

/// The tester's address as BIRD 2's reference peer `t<k>` (AS 65000).
fn bird_ref_addr(k: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 99, 0, 200 + k)
}

/// The tester's IPv6 address as BIRD 2's reference peer `t<BIRD_REFS + k>`.
fn bird_ref_addr6(k: u8) -> Ipv6Addr {
    addr6(0xf0 + u16::from(k))
}

struct Lab {
    b: Bgpd,
    bird: Bird,
    /// BIRD's session as bgpd saw it before the first case: (since, state).
    bird_before: (Option<u64>, serde_json::Value),
    next: [u8; 6],
    cases: u8,
    group: &'static str,
    records: Vec<Record>,
    /// Reference protocols of BIRD's used so far (IPv4, IPv6).
    bird_refs: u8,
    bird_refs6: u8,
    /// BIRD 2's outcome for the running case, if it asked.
    reference: Option<String>,
    /// bgpd's link-local address on the segment.
    bgpd_ll: Ipv6Addr,
}

/// RFC 7606 counters and state of one peer, as `show protocols` has them.
#[derive(Debug, Default)]
struct Counters {
    taw: u64,
    discard: u64,
    reset: u64,
}

/// What an UPDATE case saw.
enum Seen {
    /// The sentinel arrived: the hostile UPDATE was processed without a reset.
    Processed {
        route: Option<serde_json::Value>,
        c: Counters,
    },
    Notified(Notified),
    /// Something else went wrong (the text says what).
    Broken(String),
}

impl Seen {
    /// "route kept|gone, taw=.. discard=.. reset=..", or the NOTIFICATION.
    fn show(&self) -> String {
        match self {
            Seen::Processed { route, c } => format!(
                "route {}, taw={} discard={} reset={}",
                if route.is_some() { "kept" } else { "gone" },
                c.taw,
                c.discard,
                c.reset
            ),
            Seen::Notified(n) => n.show(true),
            Seen::Broken(s) => s.clone(),
        }
    }
}

/// The expected outcomes, spelled as [`Seen::show`] spells them.
fn withdrawn() -> String {
    "route gone, taw=1 discard=0 reset=0".into()
}
fn kept(discarded: u64) -> String {
    format!("route kept, taw=0 discard={discarded} reset=0")
}
/// Not used, but not malformed either (the RIB rejects it).
fn not_used() -> String {
    "route gone, taw=0 discard=0 reset=0".into()
}

/// A NOTIFICATION's expected text; `data` only where the RFC specifies it.
fn notified(code: u8, subcode: u8, data: Option<&[u8]>) -> String {
    Notified {
        code,
        subcode,
        data: data.unwrap_or_default().to_vec(),
    }
    .show(data.is_some())
}

/// `got` matches `expected` exactly, or `expected` is a NOTIFICATION without data and `got`
/// the same NOTIFICATION with some.
fn matches(expected: &str, got: &str) -> bool {
    got == expected
        || (expected.starts_with("NOTIFICATION") && got.starts_with(&format!("{expected} data ")))
}

impl Lab {
    fn peer(&mut self, pool: Pool) -> Peer {
        let (first, last) = pool.range();
        let i = pool.index();
        let host = first + self.next[i];
        assert!(host <= last, "pool {pool:?} exhausted");
        self.next[i] += 1;
        self.cases += 1;
        let (addr, addr6) = match pool.address(host) {
            IpAddr::V4(a) => (a, None),
            IpAddr::V6(a) => (Ipv4Addr::new(10, 99, 1, host), Some(a)),
        };
        Peer {
            addr,
            addr6,
            asn: pool.asn(),
            n: self.cases,
        }
    }

    fn peer_json(&self, addr: IpAddr) -> serde_json::Value {
        self.b
            .ctl_json(&["show", "protocols", "--json"])
            .as_array()
            .and_then(|a| a.iter().find(|p| p["address"] == addr.to_string()).cloned())
            .unwrap_or_default()
    }

    fn counters(&self, addr: IpAddr) -> Counters {
        let p = self.peer_json(addr);
        let m = &p["malformed"];
        Counters {
            taw: m["treat_as_withdraw"].as_u64().unwrap_or(0),
            discard: m["attribute_discard"].as_u64().unwrap_or(0),
            reset: m["session_reset"].as_u64().unwrap_or(0),
        }
    }

    /// BIRD's session: same Established period, its route in bgpd, BIRD sees it up.
    fn bird_intact(&self) -> Result<(), String> {
        let now = self.bird_since();
        if now != self.bird_before {
            return Err(format!(
                "BIRD's session changed: {:?} -> {now:?}",
                self.bird_before
            ));
        }
        if self.b.route(PEER_PREFIX).is_none() {
            return Err("BIRD's route is gone from bgpd".into());
        }
        if !self.bird.established() {
            return Err("BIRD no longer sees its session Established".into());
        }
        Ok(())
    }

    fn bird_since(&self) -> (Option<u64>, serde_json::Value) {
        let p = self.peer_json(BIRD_ADDR.into());
        (p["since_unix_ms"].as_u64(), p["state"].clone())
    }

    /// Runs one case on a fresh peer of `pool`: `f` returns what it saw, compared with
    /// `expected`; then BIRD's session is checked.
    fn case(
        &mut self,
        name: &'static str,
        input: impl Into<String>,
        pool: Pool,
        expected: String,
        f: impl FnOnce(&mut Lab, Peer) -> String,
    ) {
        self.case_as(name, input, pool, expected, false, f);
    }

    fn case_as(
        &mut self,
        name: &'static str,
        input: impl Into<String>,
        pool: Pool,
        expected: String,
        deliberate: bool,
        f: impl FnOnce(&mut Lab, Peer) -> String,
    ) {
        let mark = if deliberate {
            Mark::Deliberate
        } else {
            Mark::Plain
        };
        self.case_marked(name, input, pool, expected, mark, f);
    }

    fn case_marked(
        &mut self,
        name: &'static str,
        input: impl Into<String>,
        pool: Pool,
        expected: String,
        mark: Mark,
        f: impl FnOnce(&mut Lab, Peer) -> String,
    ) {
        let p = self.peer(pool);
        self.reference = None;
        let mut got = f(self, p);
        let met = matches(&expected, &got);
        let mut passed = met;
        if let Err(e) = self.bird_intact() {
            got = format!("{got}; {e}");
            passed = false;
        }
        let input = input.into();
        let bird = self.reference.take();
        println!(
            "[{}] {name}: {input}\n    expected: {expected}\n    got:      {got}{}{}",
            if passed { "ok" } else { "FAIL" },
            match mark {
                Mark::Deliberate => " (deliberate difference)",
                Mark::Plain => "",
            },
            bird.as_ref()
                .map(|b| format!("\n    BIRD 2:   {b}"))
                .unwrap_or_default()
        );
        self.records.push(Record {
            group: self.group,
            name,
            input,
            expected,
            got,
            passed,
            mark,
            bird,
        });
    }

    fn wait_route(&self, prefix: &str, present: bool, within: Duration) -> bool {
        wait_until(within, || self.b.route(prefix).is_some() == present)
    }
}

/// Connects and brings the session up with `open`; the error text if it did not come up.
fn established(p: &Peer, open: &[u8]) -> Result<Tester, String> {
    let mut t =
        Tester::connect_from(p.transport(), p.bgpd()).map_err(|e| format!("connect: {e}"))?;
    match t.establish(open) {
        Ok(()) => Ok(t),
        Err(Some(n)) => Err(n.show(true)),
        Err(None) => Err("closed before Established".into()),
    }
}

/// The OPEN-case pattern: `open` as the first message; Established or the NOTIFICATION.
fn open_outcome(p: &Peer, open: &[u8]) -> String {
    match established(p, open) {
        Ok(_) => "Established".into(),
        Err(e) => e,
    }
}

/// The UPDATE-case pattern: Established, the case's prefix announced validly, then
/// `hostile`, then the sentinel. The sentinel's arrival shows the hostile UPDATE was
/// processed; then the case's route and counters are read.
fn update_outcome(lab: &Lab, p: &Peer, extra_caps: &[u8], hostile: &[u8]) -> Seen {
    let mut t = match established(p, &p.open(extra_caps)) {
        Ok(t) => t,
        Err(e) => return Seen::Broken(format!("not established: {e}")),
    };
    t.send(&p.good());
    if !lab.wait_route(&p.prefix(), true, Duration::from_secs(5)) {
        return Seen::Broken("the valid UPDATE was not taken".into());
    }
    t.send(hostile);
    t.send(&p.good_sentinel());
    if lab.wait_route(&p.sentinel(), true, Duration::from_secs(5)) {
        return Seen::Processed {
            route: lab.b.route(&p.prefix()),
            c: lab.counters(p.transport()),
        };
    }
    match t.notification() {
        Some(n) => Seen::Notified(n),
        None if t.timed_out => Seen::Broken("no sentinel, no answer".into()),
        None => Seen::Broken("no sentinel; closed without a NOTIFICATION".into()),
    }
}

fn update_case(lab: &mut Lab, p: Peer, hostile: impl FnOnce(&Peer) -> Vec<u8>) -> String {
    let h = hostile(&p);
    update_outcome(lab, &p, &[], &h).show()
}

/// The same UPDATE-case pattern against BIRD 2 (the reference where the RFCs leave a
/// choice), as its next reference peer `t<k>` of the case's session family: "route kept"
/// (over IPv6 with the next hop BIRD holds), "route gone" or the NOTIFICATION. Stored for
/// the running case's record.
fn bird_reference(
    lab: &mut Lab,
    p: &Peer,
    extra_caps: &[u8],
    hostile: impl FnOnce(&Peer) -> Vec<u8>,
) {
    let (proto, me, bird) = if p.addr6.is_some() {
        lab.bird_refs6 += 1;
        let k = lab.bird_refs6;
        assert!(k <= BIRD_REFS6, "BIRD IPv6 reference protocols exhausted");
        let me = Peer {
            addr: Ipv4Addr::new(10, 99, 1, 0xf0 + k),
            addr6: Some(bird_ref_addr6(k)),
            asn: EBGP_AS,
            n: p.n,
        };
        (format!("t{}", BIRD_REFS + k), me, IpAddr::from(BIRD_ADDR6))
    } else {
        lab.bird_refs += 1;
        let k = lab.bird_refs;
        assert!(k <= BIRD_REFS, "BIRD reference protocols exhausted");
        let me = Peer {
            addr: bird_ref_addr(k),
            addr6: None,
            asn: EBGP_AS,
            n: p.n,
        };
        (format!("t{k}"), me, IpAddr::from(BIRD_ADDR))
    };
    let show = |prefix: &str| {
        lab.bird
            .birdc(&["show", "route", "all", prefix, "protocol", &proto])
    };
    let has = |prefix: &str| interop_tests::lab::bird::parse_route(&show(prefix)).is_some();
    let outcome = (|| {
        let mut t =
            Tester::connect_from(me.transport(), bird).map_err(|e| format!("connect: {e}"))?;
        t.establish(&me.open(extra_caps))
            .map_err(|n| format!("not established: {n:?}"))?;
        t.send(&me.good());
        if !wait_until(Duration::from_secs(5), || has(&me.prefix())) {
            return Err("the valid UPDATE was not taken".to_string());
        }
        t.send(&hostile(&me));
        t.send(&me.good_sentinel());
        if wait_until(Duration::from_secs(5), || has(&me.sentinel())) {
            let text = show(&me.prefix());
            return Ok(if interop_tests::lab::bird::parse_route(&text).is_none() {
                "route gone".into()
            } else if me.addr6.is_some() {
                format!("route kept, next hop {}", bird_next_hops(&text).join(" "))
            } else {
                "route kept".into()
            });
        }
        Ok(t.notification()
            .map(|n| n.show(true))
            .unwrap_or_else(|| "no sentinel, no NOTIFICATION".into()))
    })();
    lab.reference = Some(outcome.unwrap_or_else(|e| e));
}

/// An established session, then `raw` bytes: the NOTIFICATION bgpd answers with.
fn after_established(p: &Peer, extra_caps: &[u8], raw: &[u8]) -> String {
    let mut t = match established(p, &p.open(extra_caps)) {
        Ok(t) => t,
        Err(e) => return format!("not established: {e}"),
    };
    t.send(raw);
    answer(&mut t)
}

/// bgpd's NOTIFICATION, or how the connection went without one.
fn answer(t: &mut Tester) -> String {
    match t.notification() {
        Some(n) => n.show(true),
        None if t.timed_out => "no answer within the read timeout".into(),
        None => "closed without a NOTIFICATION".into(),
    }
}

/// `raw` as the first message (bgpd in OpenSent): its answer.
fn first_message(p: &Peer, raw: &[u8]) -> String {
    let mut t = match Tester::connect_from(p.addr, BGPD) {
        Ok(t) => t,
        Err(e) => return format!("connect: {e}"),
    };
    t.send(raw);
    answer(&mut t)
}

/// A header of `len` and `ty` and `body_len` zero octets after it.
fn header(len: u16, ty: u8, body_len: usize) -> Vec<u8> {
    let mut m = vec![0xff; 16];
    m.extend_from_slice(&len.to_be_bytes());
    m.push(ty);
    m.resize(19 + body_len, 0);
    m
}

fn header_cases(lab: &mut Lab) {
    lab.group = "header";
    let mut bad_marker = keepalive();
    bad_marker[..16].fill(0);
    let m = bad_marker.clone();
    lab.case(
        "marker not all ones",
        "KEEPALIVE with a zero marker",
        Pool::Ebgp,
        notified(1, 1, None),
        move |_, p| after_established(&p, &[], &m),
    );
    lab.case(
        "marker not all ones, first message",
        "a zero marker before any OPEN",
        Pool::Ebgp,
        notified(1, 1, None),
        move |_, p| first_message(&p, &bad_marker),
    );
    for (name, input, len, ty, body, data) in [
        (
            "length below 19",
            "header length 18",
            18u16,
            KEEPALIVE,
            0usize,
            [0u8, 18],
        ),
        (
            "length above 4096",
            "UPDATE length 4097 (no extended messages)",
            4097,
            2,
            0,
            [0x10, 0x01],
        ),
        (
            "KEEPALIVE of 20",
            "KEEPALIVE length 20",
            20,
            KEEPALIVE,
            1,
            [0, 20],
        ),
        ("UPDATE of 22", "UPDATE length 22", 22, 2, 3, [0, 22]),
        ("OPEN of 28", "OPEN length 28", 28, OPEN, 9, [0, 28]),
        (
            "NOTIFICATION of 20",
            "NOTIFICATION length 20 on an Established session",
            20,
            3,
            1,
            [0, 20],
        ),
        (
            "ROUTE-REFRESH of 22",
            "ROUTE-REFRESH length 22",
            22,
            ROUTE_REFRESH,
            3,
            [0, 22],
        ),
    ] {
        let m = header(len, ty, body);
        lab.case(
            name,
            input,
            Pool::Ebgp,
            notified(1, 2, Some(&data)),
            move |_, p| after_established(&p, &[], &m),
        );
    }
    for ty in [9u8, 0] {
        let m = header(19, ty, 0);
        lab.case(
            "bad message type",
            format!("message type {ty}"),
            Pool::Ebgp,
            notified(1, 3, Some(&[ty])),
            move |_, p| after_established(&p, &[], &m),
        );
    }
}

#[expect(
    clippy::too_many_lines,
    reason = "the catalogue's OPEN cases, one `lab.case` per malformed field or capability"
)]
fn open_cases(lab: &mut Lab) {
    lab.group = "open";
    let std = |asn: u32| caps_param(&std_caps(asn));
    for v in [3u8, 5] {
        lab.case(
            "unsupported version",
            format!("OPEN version {v}"),
            Pool::Ebgp,
            notified(2, 1, Some(&[0, 4])),
            move |_, p| open_outcome(&p, &open_with(v, 65000, 90, p.addr, &std(EBGP_AS))),
        );
    }
    lab.case(
        "bad peer AS",
        "OPEN AS 65099, configured 65000",
        Pool::Ebgp,
        notified(2, 2, None),
        move |_, p| open_outcome(&p, &open_with(4, 65099, 90, p.addr, &std(65099))),
    );
    lab.case(
        "peer AS 0 (RFC 7607)",
        "OPEN My AS 0, no 4-octet capability",
        Pool::Ebgp,
        notified(2, 2, None),
        move |_, p| {
            let mp = caps_param(&[1, 4, 0, 1, 0, 1]);
            open_outcome(&p, &open_with(4, 0, 90, p.addr, &mp))
        },
    );
    lab.case(
        "bad BGP identifier",
        "OPEN BGP identifier 0.0.0.0",
        Pool::Ebgp,
        notified(2, 3, None),
        move |_, p| {
            open_outcome(
                &p,
                &open_with(4, 65000, 90, Ipv4Addr::UNSPECIFIED, &std(EBGP_AS)),
            )
        },
    );
    lab.case(
        "BGP identifier equal to ours on iBGP (RFC 6286 §2.2)",
        "iBGP OPEN with bgpd's identifier 10.99.0.1",
        Pool::Ibgp,
        notified(2, 3, None),
        move |_, p| open_outcome(&p, &open_with(4, 64512, 90, BGPD, &std(LOCAL_AS))),
    );
    for hold in [1u16, 2] {
        lab.case(
            "unacceptable hold time",
            format!("OPEN hold time {hold}"),
            Pool::Ebgp,
            notified(2, 6, None),
            move |_, p| open_outcome(&p, &open_with(4, 65000, hold, p.addr, &std(EBGP_AS))),
        );
    }
    lab.case(
        "hold time 0",
        "OPEN hold time 0 (no keepalives)",
        Pool::Ebgp,
        "Established".into(),
        move |_, p| open_outcome(&p, &open_with(4, 65000, 0, p.addr, &std(EBGP_AS))),
    );
    lab.case(
        "unsupported optional parameter",
        "OPEN with optional parameter type 99",
        Pool::Ebgp,
        notified(2, 4, None),
        move |_, p| {
            open_outcome(
                &p,
                &open_with(4, 65000, 90, p.addr, &[4, 99, 2, 0xab, 0xcd]),
            )
        },
    );
    lab.case(
        "AS_TRANS with the 4-octet AS capability (RFC 6793)",
        "OPEN My AS 23456, capability AS 4200000001 (configured)",
        Pool::As4,
        "Established".into(),
        move |_, p| open_outcome(&p, &open_with(4, AS_TRANS, 90, p.addr, &std(AS4))),
    );
    lab.case(
        "AS_TRANS without the capability (RFC 6793)",
        "OPEN My AS 23456, no 4-octet capability, configured 4200000002",
        Pool::As4NoCap,
        notified(2, 2, None),
        move |_, p| {
            let mp = caps_param(&[1, 4, 0, 1, 0, 1]);
            open_outcome(&p, &open_with(4, AS_TRANS, 90, p.addr, &mp))
        },
    );
    lab.case(
        "4-octet AS capability naming AS 0 (RFC 7607)",
        "OPEN My AS 65000, capability AS 0",
        Pool::Ebgp,
        notified(2, 2, None),
        move |_, p| {
            let caps = caps_param(&[1, 4, 0, 1, 0, 1, 65, 4, 0, 0, 0, 0]);
            open_outcome(&p, &open_with(4, 65000, 90, p.addr, &caps))
        },
    );
    lab.case(
        "extended optional parameters, well formed (RFC 9072)",
        "OPEN with non-ext length 255, type 255, 2-octet lengths",
        Pool::Ebgp,
        "Established".into(),
        move |_, p| {
            open_outcome(
                &p,
                &open_with(4, 65000, 90, p.addr, &ext_params(&std_caps(EBGP_AS), 0)),
            )
        },
    );
    lab.case(
        "extended optional parameters, length overrun (RFC 9072)",
        "OPEN extended parameters length 3 more than the message holds",
        Pool::Ebgp,
        notified(2, 0, None),
        move |_, p| {
            open_outcome(
                &p,
                &open_with(4, 65000, 90, p.addr, &ext_params(&std_caps(EBGP_AS), 3)),
            )
        },
    );
}

/// RFC 9072 optional parameters: 255, 255, 2-octet total length (plus `overrun`), then one
/// capabilities parameter with a 2-octet length.
fn ext_params(caps: &[u8], overrun: u16) -> Vec<u8> {
    let mut v = vec![255, 255];
    v.extend_from_slice(&((caps.len() as u16 + 3) + overrun).to_be_bytes());
    v.push(2);
    v.extend_from_slice(&(caps.len() as u16).to_be_bytes());
    v.extend_from_slice(caps);
    v
}

fn fsm_cases(lab: &mut Lab) {
    lab.group = "fsm";
    lab.case(
        "UPDATE before OPEN (RFC 6608)",
        "an UPDATE as the first message",
        Pool::Ebgp,
        notified(5, 1, None),
        move |_, p| first_message(&p, &p.good()),
    );
    lab.case(
        "KEEPALIVE before OPEN (RFC 6608)",
        "a KEEPALIVE as the first message",
        Pool::Ebgp,
        notified(5, 1, None),
        move |_, p| first_message(&p, &keepalive()),
    );
    lab.case(
        "OPEN when Established (RFC 6608)",
        "a second OPEN on an Established session",
        Pool::Ebgp,
        notified(5, 3, None),
        move |_, p| after_established(&p, &[], &p.open(&[])),
    );
}

/// An MP_REACH_NLRI attribute (flags 0x80) with this value.
fn mp_reach(value: &[u8]) -> Vec<u8> {
    attr(0x80, 14, value)
}

#[expect(
    clippy::too_many_lines,
    reason = "the catalogue's eBGP UPDATE cases by RFC 7606 section, one `lab.case` per malformation; the catalogue reads as the RFC does"
)]
fn ebgp_update_cases(lab: &mut Lab) {
    lab.group = "update eBGP";
    let e = Pool::Ebgp;
    // Session resets: the fields cannot be located.
    lab.case(
        "withdrawn routes length overrun",
        "withdrawn length 100, 4 octets follow",
        e,
        notified(3, 1, None),
        |lab, p| update_case(lab, p, |_| msg(2, &[0, 100, 24, 10, 40, 1])),
    );
    lab.case(
        "total path attribute length overrun",
        "attribute length 200, 4 octets follow",
        e,
        notified(3, 1, None),
        |lab, p| update_case(lab, p, |_| msg(2, &[0, 0, 0, 200, 0x40, 1, 1, 0])),
    );
    let unknown_wk = attr(0x40, 254, &[1, 2]);
    let data = unknown_wk.clone();
    lab.case_as(
        "unrecognised well-known attribute",
        "attribute flags 0x40 type 254 (unassigned), with NLRI",
        e,
        notified(3, 2, Some(&data)),
        true,
        move |lab, p| {
            let build = |p: &Peer| update(&[], &[p.base(), unknown_wk.clone()].concat(), &p.nlri());
            let got = update_case(lab, p, build);
            bird_reference(lab, &p, &[], build);
            got
        },
    );
    // RFC 7606 §3d: missing well-known mandatory attributes: treat-as-withdraw.
    lab.case(
        "missing ORIGIN",
        "AS_PATH and NEXT_HOP only, with NLRI",
        e,
        withdrawn(),
        |lab, p| {
            update_case(lab, p, |p| {
                update(&[], &[p.path(), next_hop(p.addr)].concat(), &p.nlri())
            })
        },
    );
    lab.case(
        "missing AS_PATH",
        "ORIGIN and NEXT_HOP only, with NLRI",
        e,
        withdrawn(),
        |lab, p| {
            update_case(lab, p, |p| {
                update(&[], &[origin_igp(), next_hop(p.addr)].concat(), &p.nlri())
            })
        },
    );
    lab.case(
        "missing NEXT_HOP",
        "ORIGIN and AS_PATH only, with NLRI",
        e,
        withdrawn(),
        |lab, p| {
            update_case(lab, p, |p| {
                update(&[], &[origin_igp(), p.path()].concat(), &p.nlri())
            })
        },
    );
    // ORIGIN (RFC 7606 §7.1).
    lab.case(
        "invalid ORIGIN value",
        "ORIGIN 3",
        e,
        withdrawn(),
        |lab, p| {
            update_case(lab, p, |p| {
                update(
                    &[],
                    &[attr(0x40, 1, &[3]), p.path(), next_hop(p.addr)].concat(),
                    &p.nlri(),
                )
            })
        },
    );
    lab.case(
        "ORIGIN length 2",
        "ORIGIN with a 2-octet value",
        e,
        withdrawn(),
        |lab, p| {
            update_case(lab, p, |p| {
                update(
                    &[],
                    &[attr(0x40, 1, &[0, 0]), p.path(), next_hop(p.addr)].concat(),
                    &p.nlri(),
                )
            })
        },
    );
    lab.case(
        "attribute flags error on ORIGIN",
        "ORIGIN with flags 0xc0 (optional)",
        e,
        withdrawn(),
        |lab, p| {
            update_case(lab, p, |p| {
                update(
                    &[],
                    &[attr(0xc0, 1, &[0]), p.path(), next_hop(p.addr)].concat(),
                    &p.nlri(),
                )
            })
        },
    );
    lab.case(
        "duplicate ORIGIN",
        "ORIGIN twice (RFC 7606 §3g: all but the first discarded)",
        e,
        kept(1),
        |lab, p| {
            update_case(lab, p, |p| {
                update(&[], &[p.base(), attr(0x40, 1, &[2])].concat(), &p.nlri())
            })
        },
    );
    // AS_PATH (RFC 7606 §7.2).
    lab.case(
        "AS_PATH segment overrun",
        "AS_SEQUENCE claiming 3 ASNs, holding 1",
        e,
        withdrawn(),
        |lab, p| {
            update_case(lab, p, |p| {
                let path = attr(0x40, 2, &[2, 3, 0, 0, 0xfd, 0xe8]);
                update(
                    &[],
                    &[origin_igp(), path, next_hop(p.addr)].concat(),
                    &p.nlri(),
                )
            })
        },
    );
    lab.case(
        "AS_PATH unknown segment type",
        "segment type 5",
        e,
        withdrawn(),
        |lab, p| {
            update_case(lab, p, |p| {
                let path = attr(0x40, 2, &[5, 1, 0, 0, 0xfd, 0xe8]);
                update(
                    &[],
                    &[origin_igp(), path, next_hop(p.addr)].concat(),
                    &p.nlri(),
                )
            })
        },
    );
    for (seg, name) in [(3u8, "AS_CONFED_SEQUENCE"), (4, "AS_CONFED_SET")] {
        lab.case(
            "confederation segment from outside any confederation (RFC 5065 §5, RFC 7606 §7.2)",
            format!("AS_PATH {name} [65000] then AS_SEQUENCE [65000]"),
            e,
            withdrawn(),
            move |lab, p| {
                update_case(lab, p, |p| {
                    let path = attr(0x40, 2, &[seg, 1, 0, 0, 0xfd, 0xe8, 2, 1, 0, 0, 0xfd, 0xe8]);
                    update(
                        &[],
                        &[origin_igp(), path, next_hop(p.addr)].concat(),
                        &p.nlri(),
                    )
                })
            },
        );
    }
    lab.case(
        "first AS not the peer's (RFC 4271 §6.3 MAY; BIRD 2 default)",
        "eBGP AS_PATH [65099] from AS 65000",
        e,
        kept(0),
        |lab, p| {
            let build = |p: &Peer| {
                update(
                    &[],
                    &[origin_igp(), as_path(&[65099]), next_hop(p.addr)].concat(),
                    &p.nlri(),
                )
            };
            let got = update_case(lab, p, build);
            bird_reference(lab, &p, &[], build);
            got
        },
    );
    // NEXT_HOP (RFC 4271 §6.3, RFC 7606 §7.3).
    for (name, nh) in [
        ("NEXT_HOP 0.0.0.0", [0u8, 0, 0, 0]),
        ("NEXT_HOP multicast 224.0.0.1", [224, 0, 0, 1]),
        ("NEXT_HOP broadcast 255.255.255.255", [255, 255, 255, 255]),
    ] {
        lab.case("invalid NEXT_HOP", name, e, withdrawn(), move |lab, p| {
            update_case(lab, p, |p| {
                update(
                    &[],
                    &[origin_igp(), p.path(), attr(0x40, 3, &nh)].concat(),
                    &p.nlri(),
                )
            })
        });
    }
    lab.case(
        "NEXT_HOP length 5",
        "NEXT_HOP with a 5-octet value",
        e,
        withdrawn(),
        |lab, p| {
            update_case(lab, p, |p| {
                update(
                    &[],
                    &[origin_igp(), p.path(), attr(0x40, 3, &[10, 99, 0, 3, 0])].concat(),
                    &p.nlri(),
                )
            })
        },
    );
    lab.case(
        "NEXT_HOP is bgpd's own address (RFC 4271 §5.1.3)",
        "NEXT_HOP 10.99.0.1 (to BIRD 2: its own 10.99.0.2)",
        e,
        not_used(),
        |lab, p| {
            let got = update_case(lab, p, |p| {
                update(
                    &[],
                    &[origin_igp(), p.path(), next_hop(BGPD)].concat(),
                    &p.nlri(),
                )
            });
            bird_reference(lab, &p, &[], |m| {
                update(
                    &[],
                    &[origin_igp(), m.path(), next_hop(BIRD_ADDR)].concat(),
                    &m.nlri(),
                )
            });
            got
        },
    );
    // Optional attributes.
    for (name, a, expected) in [
        (
            "MED length 3 (RFC 7606 §7.4)",
            attr(0x80, 4, &[0, 0, 1]),
            withdrawn(),
        ),
        (
            "COMMUNITIES length 5 (RFC 7606 §7.8)",
            attr(0xc0, 8, &[0, 0, 0, 1, 2]),
            withdrawn(),
        ),
        (
            "COMMUNITIES with flags 0x40 (RFC 7606 §3c)",
            attr(0x40, 8, &[0, 0, 0, 1]),
            withdrawn(),
        ),
        (
            "EXTENDED_COMMUNITIES length 7 (RFC 7606 §7.14)",
            attr(0xc0, 16, &[0; 7]),
            withdrawn(),
        ),
        (
            "LARGE_COMMUNITIES length 11 (RFC 8092 §6)",
            attr(0xc0, 32, &[0; 11]),
            withdrawn(),
        ),
        (
            "ATOMIC_AGGREGATE length 1 (RFC 7606 §7.6)",
            attr(0x40, 6, &[0]),
            kept(1),
        ),
        (
            "AGGREGATOR length 5 (RFC 7606 §7.7)",
            attr(0xc0, 7, &[0; 5]),
            kept(1),
        ),
        (
            "AS4_PATH on a 4-octet session (RFC 6793 §4.1)",
            attr(0xc0, 17, &[2, 1, 0, 0, 0xfd, 0xe8]),
            kept(1),
        ),
        (
            "unrecognised optional non-transitive",
            attr(0x80, 200, &[1, 2, 3]),
            kept(1),
        ),
        (
            "unrecognised optional transitive",
            attr(0xc0, 201, &[1, 2, 3]),
            kept(0),
        ),
        (
            "LOCAL_PREF from an eBGP peer (RFC 7606 §7.5)",
            attr(0x40, 5, &[0, 0, 2, 0x2b]),
            kept(1),
        ),
        (
            "LOCAL_PREF length 3 from an eBGP peer",
            attr(0x40, 5, &[0, 0, 1]),
            kept(1),
        ),
        (
            "ORIGINATOR_ID from an eBGP peer (RFC 7606 §7.9)",
            attr(0x80, 9, &[10, 9, 9, 9]),
            kept(1),
        ),
        (
            "CLUSTER_LIST from an eBGP peer (RFC 7606 §7.10)",
            attr(0x80, 10, &[10, 9, 9, 9]),
            kept(1),
        ),
        (
            "attribute longer than the section (RFC 7606 §4)",
            vec![0xc0, 8, 10, 0, 0, 0, 1],
            withdrawn(),
        ),
    ] {
        let input = format!("valid ORIGIN, AS_PATH, NEXT_HOP + {}", hex(&a));
        lab.case(
            "optional attribute",
            format!("{name}: {input}"),
            e,
            expected,
            move |lab, p| update_case(lab, p, |p| update(&[], &[p.base(), a].concat(), &p.nlri())),
        );
    }
    lab.case(
        "LOCAL_PREF from an eBGP peer is not used",
        "LOCAL_PREF 555 with the route",
        e,
        "local_pref not 555".into(),
        |lab, p| {
            let h = update(
                &[],
                &[p.base(), attr(0x40, 5, &555u32.to_be_bytes())].concat(),
                &p.nlri(),
            );
            match update_outcome(lab, &p, &[], &h) {
                Seen::Processed { route: Some(r), .. } if r["local_pref"] == 555 => {
                    "local_pref 555".into()
                }
                Seen::Processed { route: Some(_), .. } => "local_pref not 555".into(),
                other => other.show(),
            }
        },
    );
    // MP_REACH_NLRI / MP_UNREACH_NLRI (RFC 4760 §7, RFC 7606 §7.11, RFC 8950).
    let short_reach = mp_reach(&[0, 1, 1]);
    let d = short_reach.clone();
    lab.case(
        "MP_REACH_NLRI truncated",
        "MP_REACH_NLRI value AFI 1 SAFI 1 only",
        e,
        notified(3, 9, Some(&d)),
        move |lab, p| {
            update_case(lab, p, |p| {
                update(&[], &[origin_igp(), p.path(), short_reach].concat(), &[])
            })
        },
    );
    let short_unreach = attr(0x80, 15, &[0, 1]);
    let d = short_unreach.clone();
    lab.case(
        "MP_UNREACH_NLRI truncated",
        "MP_UNREACH_NLRI value of 2 octets",
        e,
        notified(3, 9, Some(&d)),
        move |lab, p| update_case(lab, p, |_| update(&[], &short_unreach, &[])),
    );
    lab.case(
        "MP_REACH_NLRI with a 33-bit prefix",
        "MP_REACH_NLRI IPv4, next hop ours, NLRI /33",
        e,
        notified(3, 10, None),
        |lab, p| {
            update_case(lab, p, |p| {
                let mut v = vec![0, 1, 1, 4];
                v.extend_from_slice(&p.addr.octets());
                v.extend_from_slice(&[0, 33, 10, 40, p.n, 0, 0]);
                update(&[], &[origin_igp(), p.path(), mp_reach(&v)].concat(), &[])
            })
        },
    );
    lab.case(
        "MP_REACH_NLRI twice",
        "two MP_REACH_NLRI attributes (RFC 7606 §3g)",
        e,
        notified(3, 1, None),
        |lab, p| {
            update_case(lab, p, |p| {
                let mut v = vec![0, 1, 1, 4];
                v.extend_from_slice(&p.addr.octets());
                v.extend_from_slice(&[0, 24, 10, 40, p.n]);
                let r = mp_reach(&v);
                update(&[], &[origin_igp(), p.path(), r.clone(), r].concat(), &[])
            })
        },
    );
    lab.case(
        "MP_REACH_NLRI of a family not negotiated",
        "IPv6 MP_REACH_NLRI beside the IPv4 NLRI (only IPv4 negotiated)",
        e,
        kept(1),
        |lab, p| {
            update_case(lab, p, |p| {
                let mut v = vec![0, 2, 1, 16, 0x20, 0x01, 0x0d, 0xb8];
                v.extend_from_slice(&[0; 12]);
                v.extend_from_slice(&[0, 48, 0x20, 0x01, 0x0d, 0xb8, 0, 1]);
                update(&[], &[p.base(), mp_reach(&v)].concat(), &p.nlri())
            })
        },
    );
    lab.case(
        "IPv4 routes with an IPv6 next hop, RFC 8950 not negotiated",
        "MP_REACH_NLRI IPv4 unicast, next hop 2001:db8::1, the case's prefix",
        e,
        withdrawn(),
        |lab, p| {
            update_case(lab, p, |p| {
                let mut v = vec![0, 1, 1, 16, 0x20, 0x01, 0x0d, 0xb8];
                v.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
                v.extend_from_slice(&[0, 24, 10, 40, p.n]);
                update(&[], &[origin_igp(), p.path(), mp_reach(&v)].concat(), &[])
            })
        },
    );
    lab.case(
        "NLRI with a 33-bit prefix",
        "classic NLRI /33 (RFC 7606 §5.3)",
        e,
        notified(3, 10, None),
        |lab, p| update_case(lab, p, |p| update(&[], &p.base(), &[33, 10, 40, p.n, 0, 0])),
    );
}

#[expect(
    clippy::too_many_lines,
    reason = "the catalogue's iBGP UPDATE cases, one `lab.case` per attribute and RFC clause"
)]
fn ibgp_update_cases(lab: &mut Lab) {
    lab.group = "update iBGP";
    let i = Pool::Ibgp;
    lab.case(
        "LOCAL_PREF from an iBGP peer is used",
        "LOCAL_PREF 555 with the route",
        i,
        "local_pref 555".into(),
        |lab, p| {
            let h = update(
                &[],
                &[p.base(), attr(0x40, 5, &555u32.to_be_bytes())].concat(),
                &p.nlri(),
            );
            match update_outcome(lab, &p, &[], &h) {
                Seen::Processed { route: Some(r), c } if c.discard == 0 => {
                    format!("local_pref {}", r["local_pref"])
                }
                other => other.show(),
            }
        },
    );
    for (name, a, expected) in [
        (
            "LOCAL_PREF length 3 (RFC 7606 §7.5)",
            attr(0x40, 5, &[0, 0, 1]),
            withdrawn(),
        ),
        (
            "ORIGINATOR_ID from an iBGP peer (RFC 4456)",
            attr(0x80, 9, &[10, 9, 9, 9]),
            kept(0),
        ),
        (
            "ORIGINATOR_ID length 3 (RFC 7606 §7.9)",
            attr(0x80, 9, &[10, 9, 9]),
            withdrawn(),
        ),
        (
            "CLUSTER_LIST from an iBGP peer (RFC 4456)",
            attr(0x80, 10, &[10, 9, 9, 9]),
            kept(0),
        ),
        (
            "CLUSTER_LIST length 5 (RFC 7606 §7.10)",
            attr(0x80, 10, &[10, 9, 9, 9, 9]),
            withdrawn(),
        ),
        (
            "COMMUNITIES length 5 (RFC 7606 §7.8)",
            attr(0xc0, 8, &[0, 0, 0, 1, 2]),
            withdrawn(),
        ),
    ] {
        let input = format!("valid ORIGIN, AS_PATH, NEXT_HOP + {}", hex(&a));
        lab.case(
            "iBGP attribute",
            format!("{name}: {input}"),
            i,
            expected,
            move |lab, p| update_case(lab, p, |p| update(&[], &[p.base(), a].concat(), &p.nlri())),
        );
    }
    lab.case(
        "first AS is not checked on iBGP",
        "iBGP AS_PATH [65099]",
        i,
        kept(0),
        |lab, p| {
            update_case(lab, p, |p| {
                update(
                    &[],
                    &[origin_igp(), as_path(&[65099]), next_hop(p.addr)].concat(),
                    &p.nlri(),
                )
            })
        },
    );
    lab.case(
        "confederation segment on iBGP, bgpd in no confederation (RFC 7606 §7.2)",
        "iBGP AS_PATH AS_CONFED_SEQUENCE [64512]",
        i,
        withdrawn(),
        |lab, p| {
            update_case(lab, p, |p| {
                let path = attr(0x40, 2, &[3, 1, 0, 0, 0xfc, 0x00]);
                update(
                    &[],
                    &[origin_igp(), path, next_hop(p.addr)].concat(),
                    &p.nlri(),
                )
            })
        },
    );
    lab.case(
        "missing ORIGIN on iBGP",
        "AS_PATH and NEXT_HOP only, with NLRI",
        i,
        withdrawn(),
        |lab, p| {
            update_case(lab, p, |p| {
                update(&[], &[p.path(), next_hop(p.addr)].concat(), &p.nlri())
            })
        },
    );
    lab.case(
        "NEXT_HOP is bgpd's own address on iBGP",
        "NEXT_HOP 10.99.0.1",
        i,
        not_used(),
        |lab, p| {
            update_case(lab, p, |p| {
                update(
                    &[],
                    &[origin_igp(), p.path(), next_hop(BGPD)].concat(),
                    &p.nlri(),
                )
            })
        },
    );
    lab.case(
        "ORIGINATOR_ID is bgpd's router id (RFC 4456 §8)",
        "iBGP ORIGINATOR_ID 10.99.0.1",
        i,
        not_used(),
        |lab, p| {
            update_case(lab, p, |p| {
                update(
                    &[],
                    &[p.base(), attr(0x80, 9, &BGPD.octets())].concat(),
                    &p.nlri(),
                )
            })
        },
    );
}

/// What an RFC 8950 case offers: the extended next hop capability for IPv4 unicast over
/// IPv6 next hops.
fn ext_caps() -> Vec<u8> {
    ext_next_hop_cap(&[IPV4_OVER_IPV6])
}

/// An UPDATE announcing the case's prefix in MP_REACH_NLRI (IPv4 unicast) with `nh` as the
/// next hop field, whatever its length.
fn v4_reach(p: &Peer, nh: &[u8]) -> Vec<u8> {
    let reach = mp_reach(&mp_reach_value(1, 1, nh, &p.nlri()));
    update(&[], &[origin_igp(), p.path(), reach].concat(), &[])
}

/// `a` then `b`, as one next hop field (global and link-local).
fn nh32(a: Ipv6Addr, b: Ipv6Addr) -> Vec<u8> {
    [a.octets(), b.octets()].concat()
}

/// As [`Seen::show`], plus for a route held its next hop as bgpd shows it (the global or
/// IPv4 address, then the link-local one when there is one).
fn ext_outcome(lab: &Lab, p: &Peer, caps: &[u8], hostile: &[u8]) -> String {
    let seen = update_outcome(lab, p, caps, hostile);
    match &seen {
        Seen::Processed { route: Some(r), .. } => {
            let ll = r["next_hop_link_local"].as_str().unwrap_or_default();
            format!(
                "{}, next hop {}{}{ll}",
                seen.show(),
                r["next_hop"].as_str().unwrap_or("none"),
                if ll.is_empty() { "" } else { " " }
            )
        }
        _ => seen.show(),
    }
}

/// The route is held (nothing counted as malformed) with this next hop.
fn held(nh: &str) -> String {
    format!("{}, next hop {nh}", kept(0))
}

/// One RFC 8950 case: `build` makes the hostile UPDATE for a peer, sent after the OPEN
/// with `caps`; with `reference`, replayed to BIRD 2 (over IPv6 when the pool's sessions
/// are) with the same capabilities.
fn ext_case(
    lab: &mut Lab,
    p: Peer,
    caps: &[u8],
    reference: bool,
    build: impl Fn(&Peer) -> Vec<u8>,
) -> String {
    let got = ext_outcome(lab, &p, caps, &build(&p));
    if reference {
        bird_reference(lab, &p, caps, &build);
    }
    got
}

#[expect(
    clippy::too_many_lines,
    reason = "the catalogue's RFC 8950 extended next hop cases, one `lab.case` per next-hop shape and capability side"
)]
fn ext_next_hop_cases(lab: &mut Lab) {
    lab.group = "update RFC 8950";
    let x = Pool::Ext;
    // The capability both ways (bgpd offers it on IPv6 sessions carrying IPv4, the tester
    // as a peer would). Each case's prefix is first announced with a classic IPv4
    // NEXT_HOP; the hostile UPDATE announces it again in MP_REACH_NLRI.
    lab.case(
        "IPv4 route with a global IPv6 next hop",
        "MP_REACH_NLRI IPv4 unicast, next hop length 16: fd99:99::77",
        x,
        held("fd99:99::77"),
        |lab, p| ext_case(lab, p, &ext_caps(), true, |p| v4_reach(p, &OTHER6.octets())),
    );
    lab.case(
        "IPv4 route with a global and a link-local IPv6 next hop",
        "next hop length 32: fd99:99::77 fe80::77",
        x,
        held("fd99:99::77 fe80::77"),
        |lab, p| {
            ext_case(lab, p, &ext_caps(), true, |p| {
                v4_reach(p, &nh32(OTHER6, OTHER_LL))
            })
        },
    );
    lab.case(
        "IPv4 next hop in MP_REACH_NLRI is still taken (RFC 4760)",
        "next hop length 4: 10.99.0.150",
        x,
        held("10.99.0.150"),
        |lab, p| {
            ext_case(lab, p, &ext_caps(), false, |p| {
                v4_reach(p, &OTHER4.octets())
            })
        },
    );
    // RFC 7606 §7.11: a next hop length the family does not have: the NLRI after it cannot
    // be located reliably, so the session is reset (3/9 with the attribute, RFC 4271
    // §6.3). The prefix is fixed so the expected data is known beforehand.
    for (len, nh) in [
        (8usize, OTHER6.octets()[..8].to_vec()),
        (20, [&OTHER6.octets()[..], &TESTER.octets()].concat()),
        (33, [nh32(OTHER6, OTHER_LL), vec![0]].concat()),
    ] {
        let a = mp_reach(&mp_reach_value(1, 1, &nh, &nlri24(10, 42, 0)));
        let d = a.clone();
        lab.case_as(
            "next hop length neither 4, 16 nor 32 (RFC 7606 §7.11)",
            format!("MP_REACH_NLRI IPv4 unicast, next hop length {len}"),
            x,
            notified(3, 9, Some(&d)),
            // BIRD 2 sends 3/9 without data (replayed for length 20).
            true,
            move |lab, p| {
                ext_case(lab, p, &ext_caps(), len == 20, |p| {
                    update(&[], &[origin_igp(), p.path(), a.clone()].concat(), &[])
                })
            },
        );
    }
    // Next hops no router has: treat-as-withdraw (RFC 7606 §7.3 read for MP_REACH_NLRI's
    // next hop, RFC 4271 §6.3), as for the classic NEXT_HOP.
    for (name, nh, reference) in [
        ("unspecified IPv6 next hop ::", Ipv6Addr::UNSPECIFIED, true),
        (
            "multicast IPv6 next hop ff02::1",
            Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1),
            false,
        ),
    ] {
        lab.case(
            name,
            format!("next hop length 16: {nh}"),
            x,
            withdrawn(),
            move |lab, p| {
                ext_case(lab, p, &ext_caps(), reference, |p| {
                    v4_reach(p, &nh.octets())
                })
            },
        );
    }
    lab.case(
        "link-local address alone as the next hop",
        "next hop length 16: fe80::77 (an unnumbered peer's form)",
        x,
        held("fe80::77"),
        |lab, p| {
            ext_case(lab, p, &ext_caps(), true, |p| {
                v4_reach(p, &OTHER_LL.octets())
            })
        },
    );
    lab.case(
        "IPv4-mapped IPv6 next hop is the IPv4 address it maps",
        "next hop length 16: ::ffff:10.99.0.150",
        x,
        held("10.99.0.150"),
        |lab, p| {
            ext_case(lab, p, &ext_caps(), true, |p| {
                v4_reach(p, &OTHER4.to_ipv6_mapped().octets())
            })
        },
    );
    lab.case(
        "IPv6 next hop that is bgpd's own address",
        "next hop length 16: fd99:99::1",
        x,
        not_used(),
        |lab, p| ext_case(lab, p, &ext_caps(), false, |p| v4_reach(p, &BGPD6.octets())),
    );
    lab.case(
        "IPv6 next hop that is bgpd's own link-local address (RFC 4271 §5.1.3)",
        "next hop length 16: bgpd's fe80:: address on the segment",
        x,
        not_used(),
        |lab, p| {
            let ll = lab.bgpd_ll;
            ext_case(lab, p, &ext_caps(), false, move |p| {
                v4_reach(p, &ll.octets())
            })
        },
    );
    lab.case(
        "MP_UNREACH_NLRI withdraws a route learned with an IPv6 next hop",
        "the route via fd99:99::77, then MP_UNREACH_NLRI IPv4 unicast with the prefix",
        x,
        not_used(),
        |lab, p| {
            ext_case(lab, p, &ext_caps(), false, |p| {
                let unreach = attr(0x80, 15, &[&[0, 1, 1][..], &p.nlri()].concat());
                [v4_reach(p, &OTHER6.octets()), update(&[], &unreach, &[])].concat()
            })
        },
    );
    // Capability on one side only. bgpd takes IPv6 next hops for IPv4 wherever it offered
    // the capability (RFC 8950 §4: it tells the peer what this speaker can receive); BIRD
    // 2 (and FRR) also want the peer's own for the family.
    for (name, input, caps) in [
        (
            "IPv6 next hop from a peer that did not offer the capability",
            "OPEN without extended next hop; next hop fd99:99::77",
            Vec::new(),
        ),
        (
            "IPv6 next hop from a peer that offered it for another family only",
            "OPEN extended next hop for VPN-IPv4 (1/128/2) only; next hop fd99:99::77",
            ext_next_hop_cap(&[(1, 128, 2)]),
        ),
    ] {
        lab.case_as(name, input, x, held("fd99:99::77"), true, move |lab, p| {
            ext_case(lab, p, &caps, true, |p| v4_reach(p, &OTHER6.octets()))
        });
    }
    // iBGP: the same rules; the next hop is kept as sent (no next-hop-self on the way in).
    lab.case(
        "IPv4 route with a global IPv6 next hop on iBGP",
        "iBGP over IPv6, next hop length 32: fd99:99::77 fe80::77",
        Pool::ExtIbgp,
        held("fd99:99::77 fe80::77"),
        |lab, p| {
            ext_case(lab, p, &ext_caps(), false, |p| {
                v4_reach(p, &nh32(OTHER6, OTHER_LL))
            })
        },
    );
    lab.case(
        "unspecified IPv6 next hop on iBGP",
        "iBGP over IPv6, next hop length 16: ::",
        Pool::ExtIbgp,
        withdrawn(),
        |lab, p| {
            ext_case(lab, p, &ext_caps(), false, |p| {
                v4_reach(p, &Ipv6Addr::UNSPECIFIED.octets())
            })
        },
    );
    lab.case(
        "IPv6 next hop when only the peer offered the capability",
        "IPv4 session (bgpd offers none there), OPEN with extended next hop; next hop fd99:99::77",
        Pool::Ebgp,
        withdrawn(),
        |lab, p| ext_case(lab, p, &ext_caps(), true, |p| v4_reach(p, &OTHER6.octets())),
    );
}

/// Capabilities: route refresh and enhanced route refresh.
const REFRESH_CAPS: [u8; 4] = [2, 0, 70, 0];

fn refresh(afi: u16, subtype: u8, safi: u8, extra: &[u8]) -> Vec<u8> {
    let mut b = afi.to_be_bytes().to_vec();
    b.extend_from_slice(&[subtype, safi]);
    b.extend_from_slice(extra);
    msg(ROUTE_REFRESH, &b)
}

fn refresh_cases(lab: &mut Lab) {
    lab.group = "route refresh";
    for (name, subtype) in [("BoRR", 1u8), ("EoRR", 2)] {
        let m = refresh(1, subtype, 1, &[0]);
        let d = m.clone();
        lab.case(
            "BoRR/EoRR of a bad length (RFC 7313 §5)",
            format!("{name} with one octet too many"),
            Pool::Ebgp,
            notified(7, 1, Some(&d)),
            move |_, p| after_established(&p, &REFRESH_CAPS, &m),
        );
    }
    for (name, input, m) in [
        (
            "unknown subtype is ignored (RFC 7313 §5)",
            "ROUTE-REFRESH subtype 3",
            refresh(1, 3, 1, &[]),
        ),
        (
            "unknown family is ignored",
            "ROUTE-REFRESH AFI 99",
            refresh(99, 0, 1, &[]),
        ),
    ] {
        lab.case(name, input, Pool::Ebgp, kept(0), move |lab, p| {
            update_outcome(lab, &p, &REFRESH_CAPS, &m).show()
        });
    }
    lab.case(
        "BoRR then EoRR without re-advertising (RFC 7313 §4)",
        "BoRR, EoRR with the route not sent again (enhanced refresh negotiated)",
        Pool::Ebgp,
        "route gone, taw=0 discard=0 reset=0".into(),
        |lab, p| {
            let m = [refresh(1, 1, 1, &[]), refresh(1, 2, 1, &[])].concat();
            // The sentinel is announced after EoRR, so it stands; the case's route goes
            // with the refresh.
            update_outcome(lab, &p, &REFRESH_CAPS, &m).show()
        },
    );
    lab.case(
        "BoRR and EoRR without enhanced route refresh negotiated",
        "BoRR, EoRR with the route not sent again (route refresh sent, not enhanced)",
        Pool::Ebgp,
        // Without the enhanced route refresh capability the subtype octet is RFC 2918's
        // Reserved field, "ignored by the receiver": two plain refresh requests, and the
        // peer's routes stay (BIRD 2: `subtype = p->enhanced_refresh ? pkt[21] :
        // BGP_RR_REQUEST`).
        kept(0),
        |lab, p| {
            let m = [refresh(1, 1, 1, &[]), refresh(1, 2, 1, &[])].concat();
            let got = update_outcome(lab, &p, &[2, 0], &m).show();
            bird_reference(lab, &p, &[2, 0], |_| m.clone());
            got
        },
    );
}

fn notification_cases(lab: &mut Lab) {
    lab.group = "notification";
    lab.case(
        "NOTIFICATION from the peer closes; bgpd restarts after its error wait",
        "Cease/Administrative Shutdown on an Established session, then reconnect at once",
        Pool::Ebgp,
        "closed without reply; OPEN again after the 1 s error wait".into(),
        |_, p| {
            let mut t = match established(&p, &p.open(&[])) {
                Ok(t) => t,
                Err(e) => return format!("not established: {e}"),
            };
            t.send(&notification(6, 2, &[0]));
            if let Err(e) = t.closed_silently() {
                return e;
            }
            let start = Instant::now();
            let mut t = match Tester::connect_from(p.addr, BGPD) {
                Ok(t) => t,
                Err(e) => return format!("reconnect: {e}"),
            };
            let mut o = p.open(&[]);
            o.extend_from_slice(&keepalive());
            t.send(&o);
            match t.read() {
                Some((OPEN, _)) => {
                    let waited = start.elapsed();
                    if (Duration::from_millis(700)..Duration::from_secs(3)).contains(&waited) {
                        "closed without reply; OPEN again after the 1 s error wait".into()
                    } else {
                        format!("closed without reply; OPEN again after {waited:?}")
                    }
                }
                other => format!("closed without reply; then {other:?}"),
            }
        },
    );
    lab.case(
        "NOTIFICATION shorter than 21 octets",
        "NOTIFICATION length 20 (code only)",
        Pool::Ebgp,
        notified(1, 2, Some(&[0, 20])),
        |_, p| after_established(&p, &[], &msg(3, &[6])),
    );
    lab.case(
        "NOTIFICATION as the first message",
        "Cease before any OPEN",
        Pool::Ebgp,
        "closed without reply".into(),
        |_, p| {
            let Ok(mut t) = Tester::connect_from(p.addr, BGPD) else {
                return "connect failed".into();
            };
            t.send(&notification(6, 4, &[]));
            match t.closed_silently() {
                Ok(()) => "closed without reply".into(),
                Err(e) => e,
            }
        },
    );
    lab.case(
        "NOTIFICATION of an unknown code",
        "code 99 subcode 99 with 300 octets of data",
        Pool::Ebgp,
        "closed without reply".into(),
        |_, p| {
            let mut t = match established(&p, &p.open(&[])) {
                Ok(t) => t,
                Err(e) => return format!("not established: {e}"),
            };
            t.send(&notification(99, 99, &[0xee; 300]));
            match t.closed_silently() {
                Ok(()) => "closed without reply".into(),
                Err(e) => e,
            }
        },
    );
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "sets up the hostile-input lab (segment, bgpd, BIRD 2 reference, tester) and runs every group of cases against it; one lab for the whole catalogue"
)]
fn hostile_bgp_input_catalog() {
    let seg = Segment::new("hst").unwrap();
    let a = seg.attach("hsta", "10.99.0.1/24").unwrap();
    let bird_ns = seg.attach("hstb", "10.99.0.2/24").unwrap();
    let tester: Member = seg.attach("hstc", &format!("{TESTER}/24")).unwrap();
    // IPv6 beside IPv4 (nodad: duplicate address detection would keep the addresses
    // unusable for a second or more; nothing else is on this segment).
    for (m, a) in [(&a, BGPD6), (&bird_ns, BIRD_ADDR6)] {
        m.ns.ip(&[
            "-6",
            "addr",
            "add",
            &format!("{a}/64"),
            "dev",
            "eth0",
            "nodad",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
    }
    // The kernel's own link-local address goes through duplicate address detection first.
    let mut bgpd_ll = None;
    assert!(
        wait_until(Duration::from_secs(10), || {
            bgpd_ll = link_local(&a.ns, "eth0").and_then(|s| s.parse().ok());
            bgpd_ll.is_some()
                && !a
                    .ns
                    .ip(&["-6", "addr", "show", "dev", "eth0"])
                    .unwrap_or_default()
                    .contains("tentative")
        }),
        "bgpd's link-local address did not come up"
    );
    let bgpd_ll: Ipv6Addr = bgpd_ll.unwrap_or(Ipv6Addr::UNSPECIFIED);
    let mut peers = String::new();
    let mut addrs = Vec::new();
    for pool in Pool::ALL {
        let (first, last) = pool.range();
        for host in first..=last {
            let addr = pool.address(host);
            // IPv4 unicast only: on an IPv6 session that makes bgpd offer the extended
            // next hop capability.
            let families = if addr.is_ipv6() {
                "families = [\"ipv4\"]\n"
            } else {
                ""
            };
            peers.push_str(&format!(
                "[[bgp.peers]]\naddress = \"{addr}\"\nas = {}\npassive = true\n\
                 graceful_restart = false\n{families}",
                pool.asn()
            ));
            addrs.push(addr);
        }
    }
    // BIRD 2 as in `Bird::start`, plus passive protocols t1... for the tester: the
    // reference for the cases where the RFCs leave a choice (routes from them go nowhere).
    // Over IPv6 they take IPv4 routes with IPv6 next hops (RFC 8950), as bgpd does there.
    let refs: String = (1..=BIRD_REFS)
        .map(|k| (k, IpAddr::from(bird_ref_addr(k)), ""))
        .chain((1..=BIRD_REFS6).map(|k| {
            (
                BIRD_REFS + k,
                IpAddr::from(bird_ref_addr6(k)),
                " extended next hop on;",
            )
        }))
        .map(|(k, addr, ext)| {
            format!(
                "protocol bgp t{k} {{\n  local as 65001;\n  neighbor {addr} as {EBGP_AS};\n  passive on;\n\
                   ipv4 {{ import all; export none;{ext} }};\n  error wait time 1,10;\n}}\n"
            )
        })
        .collect();
    addrs.extend((1..=BIRD_REFS).map(|k| IpAddr::from(bird_ref_addr(k))));
    addrs.extend((1..=BIRD_REFS6).map(|k| IpAddr::from(bird_ref_addr6(k))));
    let bird = Bird::start_config(
        BirdVersion::V2,
        &bird_ns.ns,
        &format!(
            "router id 10.99.0.2;\n\
             protocol device {{ scan time 2; }}\n\
             protocol direct {{ ipv4; interface \"*\"; }}\n\
             protocol static st {{ ipv4; route {PEER_PREFIX} blackhole; }}\n\
             protocol bgp m {{\n  local as 65001;\n  neighbor 10.99.0.1 as {LOCAL_AS};\n\
               ipv4 {{ import all; export where proto = \"st\"; next hop self; }};\n\
               connect delay time 1;\n  connect retry time 3;\n  error wait time 1,10;\n}}\n{refs}"
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let script: String = addrs
        .iter()
        .map(|a| match a {
            IpAddr::V4(a) => format!("ip addr add {a}/24 dev eth0\n"),
            IpAddr::V6(a) => format!("ip -6 addr add {a}/64 dev eth0 nodad\n"),
        })
        .collect();
    tester.ns.sh(&script).unwrap();
    let b = Bgpd::start_with(
        &a.ns,
        &format!(
            "[bgp]\nas = {LOCAL_AS}\nrouter_id = \"10.99.0.1\"\nerror_wait_time = [1, 60]\n\
             [[bgp.peers]]\naddress = \"10.99.0.2\"\nas = 65001\nhold_time = 9\n{peers}"
        ),
    );
    assert!(
        wait_until(Duration::from_secs(40), || bird.established()
            && b.route(PEER_PREFIX).is_some()),
        "BIRD's session did not come up\n{}",
        b.log()
    );
    let mut lab = Lab {
        b,
        bird,
        bird_before: (None, serde_json::Value::Null),
        next: [0; 6],
        cases: 0,
        group: "",
        records: Vec::new(),
        bird_refs: 0,
        bird_refs6: 0,
        reference: None,
        bgpd_ll,
    };
    lab.bird_before = lab.bird_since();
    assert_eq!(lab.bird_before.1, "Established");

    let started = Instant::now();
    let lab = tester
        .ns
        .run_in(move || {
            header_cases(&mut lab);
            open_cases(&mut lab);
            fsm_cases(&mut lab);
            ebgp_update_cases(&mut lab);
            ibgp_update_cases(&mut lab);
            ext_next_hop_cases(&mut lab);
            refresh_cases(&mut lab);
            notification_cases(&mut lab);
            lab
        })
        .unwrap();

    // bgpd is still the process we started.
    let mut lab = lab;
    assert!(
        lab.b.process.try_wait().is_none(),
        "bgpd exited\n{}",
        lab.b.log()
    );
    let n = lab.records.len();
    let passed = lab.records.iter().filter(|r| r.passed).count();
    let deliberate = lab
        .records
        .iter()
        .filter(|r| r.mark == Mark::Deliberate)
        .count();
    let failed: Vec<String> = lab
        .records
        .iter()
        .filter(|r| !r.passed)
        .map(|r| {
            format!(
                "[{}] {}: {}\n    expected: {}\n    got:      {}{}",
                r.group,
                r.name,
                r.input,
                r.expected,
                r.got,
                r.bird
                    .as_ref()
                    .map(|b| format!("\n    BIRD 2:   {b}"))
                    .unwrap_or_default()
            )
        })
        .collect();
    println!(
        "hostile BGP input: {n} cases, {passed} passed, {deliberate} deliberate differences ({:?})",
        started.elapsed()
    );
    assert!(failed.is_empty(), "failed cases:\n{}", failed.join("\n"));
}
