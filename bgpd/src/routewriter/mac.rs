//! The VTEP MAC address derived from the node name, as Calico derives it: 0x66, then the first
//! five bytes of SHA-1 of the name. 0x66 has the locally-administered bit set and the multicast
//! bit clear, so the address is a valid unicast MAC that no vendor hands out.
//!
//! SHA-1 is written here (FIPS 180-4, section 6.1) because no SHA-1 crate is a dependency and
//! the MAC is its only use: it names an address, it protects nothing.

/// A MAC address.
pub type Mac = [u8; 6];

/// SHA-1 of `data`.
pub fn sha1(data: &[u8]) -> [u8; 20] {
    let mut h: [u32; 5] = [
        0x6745_2301,
        0xEFCD_AB89,
        0x98BA_DCFE,
        0x1032_5476,
        0xC3D2_E1F0,
    ];
    // Padding: 0x80, zeros, then the length in bits as a big-endian u64, to a multiple of 64.
    let bit_len = (data.len() as u64).wrapping_mul(8);
    let mut tail = Vec::with_capacity(128);
    let full = data.len() - data.len() % 64;
    tail.extend_from_slice(&data[full..]);
    tail.push(0x80);
    while tail.len() % 64 != 56 {
        tail.push(0);
    }
    tail.extend_from_slice(&bit_len.to_be_bytes());
    for block in data[..full].chunks_exact(64).chain(tail.chunks_exact(64)) {
        compress(&mut h, block);
    }
    let mut out = [0u8; 20];
    for (i, word) in h.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&word.to_be_bytes());
    }
    out
}

fn compress(h: &mut [u32; 5], block: &[u8]) {
    let mut w = [0u32; 80];
    for (i, chunk) in block.chunks_exact(4).enumerate() {
        w[i] = u32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
    }
    for i in 16..80 {
        w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
    }
    let [mut a, mut b, mut c, mut d, mut e] = *h;
    for (i, wi) in w.iter().enumerate() {
        let (f, k) = match i {
            0..=19 => ((b & c) | (!b & d), 0x5A82_7999),
            20..=39 => (b ^ c ^ d, 0x6ED9_EBA1),
            40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC),
            _ => (b ^ c ^ d, 0xCA62_C1D6),
        };
        let t = a
            .rotate_left(5)
            .wrapping_add(f)
            .wrapping_add(e)
            .wrapping_add(k)
            .wrapping_add(*wi);
        e = d;
        d = c;
        c = b.rotate_left(30);
        b = a;
        a = t;
    }
    for (hi, v) in h.iter_mut().zip([a, b, c, d, e]) {
        *hi = hi.wrapping_add(v);
    }
}

/// The VTEP MAC of node `name`: 0x66 and the first five bytes of SHA-1 of the name.
pub fn vtep_mac(name: &str) -> Mac {
    let d = sha1(name.as_bytes());
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
        let m = vtep_mac("node-a");
        assert_eq!(m[0], 0x66);
        assert_eq!(m[0] & 0x01, 0, "unicast");
        assert_eq!(m[0] & 0x02, 0x02, "locally administered");
        assert_eq!(m, vtep_mac("node-a"));
        assert_ne!(m, vtep_mac("node-b"));
        assert_eq!(&m[1..], &sha1(b"node-a")[..5]);
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
