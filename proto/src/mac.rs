//! The VTEP MAC address derived from the node name, as Calico derives it: 0x66, then the first
//! five bytes of SHA-1 of the name. 0x66 has the locally-administered bit set and the multicast
//! bit clear, so the address is a valid unicast MAC that no vendor hands out.
//!
//! bgpd writes the MAC into its `Node` and routewriter falls back to it when the desired state
//! names none: both take it from here so they always agree. SHA-1 names an address here; it
//! protects nothing.

/// A MAC address.
pub type Mac = [u8; 6];

/// SHA-1 of `data` (`sha1_smol`: no dependencies of its own).
pub fn sha1(data: &[u8]) -> [u8; 20] {
    sha1_smol::Sha1::from(data).digest().bytes()
}

/// The VTEP MAC of node `name` for one family: 0x66 and the first five bytes of SHA-1 of the
/// name (IPv4), or of the name followed by "/v6" (IPv6: a second device, so a second MAC).
pub fn vtep_mac(name: &str, family: crate::v1::IpFamily) -> Mac {
    let d = match family {
        crate::v1::IpFamily::V6 => sha1(format!("{name}/v6").as_bytes()),
        _ => sha1(name.as_bytes()),
    };
    [0x66, d[0], d[1], d[2], d[3], d[4]]
}

/// "aa:bb:cc:dd:ee:ff" (also accepts '-' as the separator and upper case).
pub fn parse_mac(s: &str) -> Option<Mac> {
    let mut mac = [0u8; 6];
    let mut parts = s.split([':', '-']);
    for byte in mac.iter_mut() {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *byte = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// "aa:bb:cc:dd:ee:ff".
pub fn format_mac(mac: &Mac) -> String {
    let m = mac;
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(d: &[u8]) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    // The examples of FIPS 180 (and the NIST example set) for SHA-1.
    #[test]
    fn sha1_fips_180_vectors() {
        assert_eq!(
            hex(&sha1(b"abc")),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        assert_eq!(hex(&sha1(b"")), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
        assert_eq!(
            hex(&sha1(
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
            )),
            "84983e441c3bd26ebaae4aa1f95129e5e54670f1"
        );
        assert_eq!(
            hex(&sha1(&vec![b'a'; 1_000_000])),
            "34aa973cd4c4daa4f61eeb2bdbad27316534016f"
        );
    }

    #[test]
    fn sha1_block_boundaries() {
        // Lengths around the 55/56/64-byte padding edges, checked against sha1sum.
        assert_eq!(
            hex(&sha1(&[b'a'; 55])),
            "c1c8bbdc22796e28c0e15163d20899b65621d65a"
        );
        assert_eq!(
            hex(&sha1(&[b'a'; 56])),
            "c2db330f6083854c99d4b5bfb6e8f29f201be699"
        );
        assert_eq!(
            hex(&sha1(&[b'a'; 64])),
            "0098ba824b5c16427bd7a1122a5a442a25ec644d"
        );
    }

    #[test]
    fn vtep_mac_is_local_unicast_and_stable() {
        use crate::v1::IpFamily::{V4, V6};
        let m = vtep_mac("node-a", V4);
        assert_eq!(m[0], 0x66);
        assert_eq!(m[0] & 0x01, 0, "unicast");
        assert_eq!(m[0] & 0x02, 0x02, "locally administered");
        assert_eq!(m, vtep_mac("node-a", V4));
        assert_ne!(m, vtep_mac("node-b", V4));
        assert_eq!(&m[1..], &sha1(b"node-a")[..5]);
        let m6 = vtep_mac("node-a", V6);
        assert_ne!(m6, m, "each family's device has its own MAC");
        assert_eq!(&m6[1..], &sha1(b"node-a/v6")[..5]);
    }

    #[test]
    fn mac_text_round_trip() {
        let m = parse_mac("66:0A:bb:cc:dd:ee").unwrap();
        assert_eq!(format_mac(&m), "66:0a:bb:cc:dd:ee");
        assert_eq!(parse_mac("66-0a-bb-cc-dd-ee"), Some(m));
        for bad in [
            "",
            "66:0a:bb:cc:dd",
            "66:0a:bb:cc:dd:ee:ff",
            "6:0a:bb:cc:dd:ee",
            "zz:0a:bb:cc:dd:ee",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad}");
        }
    }
}
