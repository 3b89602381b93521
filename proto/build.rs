//! Generates the tonic/prost code for margay's contract. Uses the protoc shipped in the
//! `protoc-bin-vendored` crate, so no system `protoc` is needed.

const PROTOS: &[&str] = &[
    "margay/v1/daemon.proto",
    "margay/v1/pools.proto",
    "margay/v1/nodes.proto",
    "margay/v1/ipam.proto",
    "margay/v1/bgp.proto",
    "margay/v1/dataplane.proto",
    "margay/v1/services.proto",
    "margay/v1/policy.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; prost-build reads PROTOC from the environment.
    unsafe { std::env::set_var("PROTOC", protoc) };
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("margay_descriptor.bin"))
        .compile_protos(PROTOS, &["."])?;
    for p in PROTOS {
        println!("cargo:rerun-if-changed={p}");
    }
    Ok(())
}
