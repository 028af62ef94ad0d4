//! Compiles `switchyard/v1/*.proto` with tonic-prost-build, using the protoc
//! binary and well-known-type includes shipped by `protoc-bin-vendored`, and
//! writes the encoded file descriptor set that the server's reflection
//! service publishes.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "switchyard/v1/placement.proto",
    "switchyard/v1/capability.proto",
    "switchyard/v1/task.proto",
    "switchyard/v1/agent.proto",
    "switchyard/v1/agent_service.proto",
    "switchyard/v1/task_service.proto",
    "switchyard/v1/agent_admin_service.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let wkt_include = protoc_bin_vendored::include_path()?;

    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc);
    // `prost::Name` on every message: the CLI finds a message's descriptor
    // by its full name to print it as proto3 JSON.
    config.enable_type_names();

    let includes = [PathBuf::from("."), wkt_include];
    let protos: Vec<PathBuf> = PROTOS.iter().map(PathBuf::from).collect();
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("switchyard_descriptor.bin"))
        .generate_default_stubs(true)
        // The agent session RPC is named `Connect`; the transport helper would
        // add a clashing `connect` constructor to every client. Clients are
        // built with `new(channel)` instead.
        .build_transport(false)
        // prost's codec with small per-call buffers (see `src/codec.rs`).
        .codec_path("crate::codec::CompactCodec")
        .compile_with_config(config, &protos, &includes)?;
    println!("cargo:rerun-if-changed=switchyard");
    Ok(())
}
