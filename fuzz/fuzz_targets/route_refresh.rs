//! ROUTE-REFRESH body decoding.
#![no_main]

use bgp_wire::{HEADER_LEN, RefreshSubtype, RouteRefresh};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let header = [0xFF; HEADER_LEN];
    if let Ok(r) = RouteRefresh::decode(&header, data) {
        let mut out = Vec::new();
        r.encode(&mut out).unwrap();
        let again = RouteRefresh::decode(&out[..HEADER_LEN], &out[HEADER_LEN..]).unwrap();
        assert_eq!(again, r);
        // Only BoRR and EoRR must be exactly 4 octets (RFC 7313 §5); a plain request may
        // carry ORF entries and other subtypes are ignored whatever their length.
        if data.len() > 4 {
            assert!(!matches!(
                r.subtype,
                RefreshSubtype::Begin | RefreshSubtype::End
            ));
        }
    }
});
