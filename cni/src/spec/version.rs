//! CNI specification versions: parsing the `cniVersion` string, the versions margay speaks, and
//! which commands and result layouts each version has.
//!
//! Result layouts: 0.3.0 to 0.4.0 tag every IP with `"version": "4"|"6"`; 1.0.0 drops that tag;
//! 1.1.0 adds interface `mtu`/`socketPath`/`pciID` and route `mtu`/`advmss`/`priority`/`table`/
//! `scope`. 0.1.0 and 0.2.0 (the flat `ip4`/`ip6` result) are not spoken: no runtime still in
//! support sends them, and they cannot carry chained results.

use std::fmt;

/// A CNI specification version (`major.minor.patch`; "1.0" reads as 1.0.0, as libcni does).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    pub const V0_1_0: Version = Version::new(0, 1, 0);
    pub const V0_3_0: Version = Version::new(0, 3, 0);
    pub const V0_3_1: Version = Version::new(0, 3, 1);
    pub const V0_4_0: Version = Version::new(0, 4, 0);
    pub const V1_0_0: Version = Version::new(1, 0, 0);
    pub const V1_1_0: Version = Version::new(1, 1, 0);
    /// The newest version margay speaks.
    pub const LATEST: Version = Version::V1_1_0;

    pub const fn new(major: u32, minor: u32, patch: u32) -> Version {
        Version {
            major,
            minor,
            patch,
        }
    }

    /// Parses "1.0.0", "1.0" or "1". Pre-release and build suffixes are refused: no CNI
    /// version has one, and accepting them would make "1.0.0-rc1" look like 1.0.0.
    pub fn parse(text: &str) -> Result<Version, VersionError> {
        let bad = || VersionError(text.to_owned());
        let mut parts = [0u32; 3];
        for (n, piece) in text.split('.').enumerate() {
            if n == 3 || piece.is_empty() || !piece.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            parts[n] = piece.parse().map_err(|_| bad())?;
        }
        Ok(Version::new(parts[0], parts[1], parts[2]))
    }

    /// Whether margay speaks this version.
    pub fn is_supported(self) -> bool {
        SUPPORTED.contains(&self)
    }

    /// CHECK exists from 0.4.0 on.
    pub fn has_check(self) -> bool {
        self >= Version::V0_4_0
    }

    /// GC and STATUS exist from 1.1.0 on.
    pub fn has_gc_and_status(self) -> bool {
        self >= Version::V1_1_0
    }

    /// IPs carry `"version": "4"|"6"` before 1.0.0.
    pub fn ips_carry_version(self) -> bool {
        self < Version::V1_0_0
    }

    /// Interface `mtu` and the route attributes exist from 1.1.0 on.
    pub fn has_1_1_fields(self) -> bool {
        self >= Version::V1_1_0
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Every version margay speaks, oldest first (what VERSION reports).
pub const SUPPORTED: &[Version] = &[
    Version::V0_3_0,
    Version::V0_3_1,
    Version::V0_4_0,
    Version::V1_0_0,
    Version::V1_1_0,
];

/// The supported versions as the strings VERSION prints.
pub fn supported_strings() -> Vec<String> {
    SUPPORTED.iter().map(ToString::to_string).collect()
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a CNI version (expected major.minor.patch, e.g. \"1.0.0\")")]
pub struct VersionError(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_full_short_and_refuses_junk() {
        assert_eq!(Version::parse("1.1.0").unwrap(), Version::V1_1_0);
        assert_eq!(Version::parse("0.3.1").unwrap(), Version::V0_3_1);
        assert_eq!(Version::parse("1.0").unwrap(), Version::V1_0_0);
        assert_eq!(Version::parse("1").unwrap(), Version::V1_0_0);
        assert_eq!(
            Version::parse("10.20.30").unwrap(),
            Version::new(10, 20, 30)
        );
        for junk in [
            "",
            ".",
            "1.",
            ".1",
            "1..0",
            "1.0.0.0",
            "v1.0.0",
            "1.0.0-rc1",
            "1.0.x",
            " 1.0.0",
            "-1.0.0",
            "99999999999.0.0",
            "1.0.0+build",
        ] {
            assert!(Version::parse(junk).is_err(), "{junk:?}");
        }
    }

    #[test]
    fn display_round_trips() {
        for v in SUPPORTED {
            assert_eq!(Version::parse(&v.to_string()).unwrap(), *v);
        }
    }

    #[test]
    fn supported_set_and_features() {
        assert_eq!(
            supported_strings(),
            ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
        );
        for v in ["0.1.0", "0.2.0", "0.4.1", "1.0.1", "1.2.0", "2.0.0"] {
            assert!(!Version::parse(v).unwrap().is_supported(), "{v}");
        }
        assert!(!Version::V0_3_1.has_check());
        assert!(Version::V0_4_0.has_check());
        assert!(!Version::V1_0_0.has_gc_and_status());
        assert!(Version::V1_1_0.has_gc_and_status());
        assert!(Version::V0_4_0.ips_carry_version());
        assert!(!Version::V1_0_0.ips_carry_version());
        assert!(!Version::V1_0_0.has_1_1_fields());
        assert!(Version::V1_1_0.has_1_1_fields());
        assert!(Version::V0_3_0 < Version::V0_3_1 && Version::V0_4_0 < Version::V1_0_0);
    }
}
