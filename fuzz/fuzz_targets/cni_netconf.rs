//! The CNI plugin's stdin (the network configuration): a configuration or an error object
//! with a spec code, never a panic (`cni::spec::oracle::netconf`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cni::spec::oracle::netconf(data));
