//! Compiles `proto/etcd.proto` (our subset of etcd's v3 gRPC API) into prost
//! messages and tonic clients.
//!
//! protoc comes from `protoc-bin-vendored`, as in `vela-wire`: building Vela
//! needs no system protoc. Clients only; no server code, no transport
//! helpers (`EtcdStore` builds its own channel).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTO: &str = "proto/etcd.proto";
    println!("cargo:rerun-if-changed={PROTO}");
    println!("cargo:rerun-if-changed=build.rs");

    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        .compile_with_config(config, &[PROTO], &["proto"])?;
    Ok(())
}
