//! What must hold for any input the runtime hands a plugin, whatever the bytes: the
//! network configuration on stdin and the CNI_* environment parse to a value or to an error
//! object with one of the spec's codes (or margay's documented ones), never a panic, and an
//! error is one the runtime can read. Shared by the fuzz targets (`fuzz/fuzz_targets/cni_*`)
//! and the hostile-input tests, so both check the same thing.

use super::env::CniArgs;
use super::error::code;
use super::{CniError, Env, NetConf};

/// The codes a parse error may carry: the spec's for a bad configuration or environment.
const PARSE_CODES: [u32; 4] = [
    code::INCOMPATIBLE_VERSION,
    code::UNSUPPORTED_FIELD,
    code::DECODE,
    code::INVALID_CONFIG,
];

fn readable(e: &CniError, allowed: &[u32], what: &str) {
    assert!(
        allowed.contains(&e.code),
        "{what}: code {} is not one of {allowed:?}: {e:?}",
        e.code
    );
    assert!(!e.msg.is_empty(), "{what}: an error without a message");
    let j = e.to_json("1.0.0");
    assert_eq!(j["code"].as_u64(), Some(u64::from(e.code)), "{what}: {j}");
    assert_eq!(CniError::from_json(&j).as_ref(), Some(e), "{what}: {j}");
}

/// stdin: a configuration or a decode / config / version error.
pub fn netconf(stdin: &[u8]) {
    // The version an error object is written in is always one margay speaks.
    let v = NetConf::version_for_errors(stdin);
    assert!(
        super::Version::parse(&v).is_ok_and(super::Version::is_supported),
        "{v}"
    );
    match NetConf::parse(stdin) {
        Ok(conf) => {
            let _ = conf.handle("0123456789abcdef");
            let _ = conf.handle_prefix();
            let _ = conf.ipam_gateway();
            let _ = conf.ipam_is_ours();
            let _ = conf.ipam_socket();
        }
        Err(e) => readable(&e, &PARSE_CODES, "stdin"),
    }
}

/// The environment, as `KEY=VALUE` lines (what is not UTF-8 counts as unset, as
/// `std::env::var` has it): parsed, or refused as invalid environment.
pub fn environment(text: &[u8]) {
    let text = String::from_utf8_lossy(text);
    let vars: Vec<(&str, &str)> = text.lines().filter_map(|l| l.split_once('=')).collect();
    let get = |k: &str| {
        vars.iter()
            .rev()
            .find(|(key, _)| *key == k)
            .map(|(_, v)| (*v).to_owned())
    };
    match Env::parse(get) {
        Ok(env) => {
            let _ = env.args.workload_key();
            assert!(!env.ifname.is_empty() || env.command.as_str() != "ADD");
        }
        Err(e) => readable(&e, &[code::INVALID_ENVIRONMENT], "environment"),
    }
    match CniArgs::parse(&text) {
        Ok(a) => {
            let _ = a.workload_key();
        }
        Err(e) => readable(&e, &[code::INVALID_ENVIRONMENT], "CNI_ARGS"),
    }
}
