//! The CNI plugin's environment (CNI_COMMAND, CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME,
//! CNI_ARGS, CNI_PATH) as `KEY=VALUE` lines: parsed, or refused as invalid environment
//! (`cni::spec::oracle::environment`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cni::spec::oracle::environment(data));
