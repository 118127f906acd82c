//! Compiles `raftlock.proto` with `protox`, a protobuf compiler written in
//! Rust, so a fresh machine needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "raftlock.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["."])?;
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
