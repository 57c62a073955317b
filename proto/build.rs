//! Compiles `proto/tollgate/v1/*.proto` with protox (pure Rust, no system `protoc`) and
//! generates prost messages plus tonic clients and servers.

use std::path::PathBuf;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let files = ["receipt", "authority", "supervisor", "gateway"]
        .map(|name| root.join(format!("tollgate/v1/{name}.proto")));
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let descriptors = protox::compile(files, [&root])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    // Kept for the gRPC reflection service.
    std::fs::write(
        out_dir.join("tollgate_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
