//! Compiles the .proto files with `protox`, a protobuf compiler written in
//! Rust, so a fresh machine needs no system `protoc`.

/// The files, under `proto/`: the client API, the operators' API, the
/// nodes' internal service (one package, `raftlock.v1`).
const PROTOS: [&str; 3] = [
    "raftlock/v1/locks.proto",
    "raftlock/v1/cluster.proto",
    "raftlock/v1/raft.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    println!("cargo:rerun-if-changed=raftlock.proto");
    // The umbrella file that imports the three must compile too.
    protox::compile(["raftlock.proto"], ["."])?;
    let fds = protox::compile(PROTOS, ["."])?;
    // The descriptor set itself, for gRPC server reflection.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("raftlock_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
