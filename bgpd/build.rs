//! Release link settings of the `bgpd` binary that keep its resident memory small.
//!
//! An idle bgpd's resident memory was mostly its own code pages: the kernel maps code in
//! 64 KiB windows (fault-around, more with large page-cache folios), so a start-up that
//! executes functions spread over the 8 MB `.text` kept nearly all of it resident.
//! - `code-order.txt` lists the functions a node runs (recorded by `scripts/code-order`),
//!   and the linker puts them first, together; those a running node runs after start-up
//!   come first of all, for they are what is mapped again once `bgpd::resident` has
//!   released start-up's pages, then those its sessions run as the mesh forms (released
//!   once more five seconds after start-up), then start-up's own. Names missing from the
//!   binary (the list is older than a dependency or toolchain update) are skipped: the
//!   order only changes where code lies, never what it does. `scripts/code-order check`
//!   says how current it is.
//! - Relative relocations are packed (DT_RELR, glibc ≥ 2.36): start-up (the static-pie
//!   self-relocation, see `.cargo/config.toml`) reads a few KiB instead of 270 KiB of
//!   `.rela.dyn`.
//!
//! Only for release builds on x86_64 Linux, where rustc links with its own lld.
//! `MARGAY_CODE_ORDER=0` turns both off.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=code-order.txt");
    println!("cargo:rerun-if-env-changed=MARGAY_CODE_ORDER");
    let release = std::env::var("PROFILE").as_deref() == Ok("release");
    let lld = std::env::var("TARGET").as_deref() == Ok("x86_64-unknown-linux-gnu");
    let wanted = std::env::var("MARGAY_CODE_ORDER").as_deref() != Ok("0");
    if !(release && lld && wanted) {
        return;
    }
    println!("cargo:rustc-link-arg-bin=bgpd=-Wl,-z,pack-relative-relocs");
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let list = Path::new(&dir).join("code-order.txt");
    if list.exists() {
        println!(
            "cargo:rustc-link-arg-bin=bgpd=-Wl,--symbol-ordering-file={}",
            list.display()
        );
        println!("cargo:rustc-link-arg-bin=bgpd=-Wl,--no-warn-symbol-ordering");
    }
}
