//! BFD control-packet decoding (the `bfd` crate, fuzzed with the BGP decoders since bgpd
//! reads both from the network); whatever decodes re-encodes to the same packet, and a
//! session fed it does not panic.
#![no_main]

use bfd::{ControlPacket, Session, SessionConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = ControlPacket::decode(data) {
        assert_eq!(ControlPacket::decode(&p.encode()), Ok(p));
        let now = std::time::Instant::now();
        if let Ok(config) = SessionConfig::from_ms(10, 10, 3) {
            let mut s = Session::new(p.your_discriminator.max(1), config, 1, now);
            let _ = s.on_packet(&p, now);
            s.on_timeout(now + std::time::Duration::from_secs(5));
            while s.poll_output().is_some() {}
        }
    }
});
