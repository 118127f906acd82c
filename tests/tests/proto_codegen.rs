//! The client API's .proto (`proto/raftlock/v1/locks.proto`) goes through
//! the code generators other languages use, as a team would run them:
//! Debian's `protoc` with `protoc-gen-go` (package `golang-goprotobuf-dev`,
//! which refused the single .proto of before because of one proto3
//! `optional`), and Python's grpcio-tools from PyPI. The generated code
//! carries the client API only, and Python can build and JSON-print a
//! request with the portable "wait without a timeout".
//!
//! Debian's packages are installed when missing and the test runs as root;
//! elsewhere it skips saying why (and fails instead under CI=true or
//! RAFTLOCK_REQUIRE_SERVERS=1, as `.ci/run` sets).

use std::path::{Path, PathBuf};
use std::process::Command;

use raftlock_testkit::servers::{self, Unavailable};

const PROTO_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../proto");
const CLIENT_PROTO: &str = "raftlock/v1/locks.proto";

fn out_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("output dir");
    dir
}

fn has(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `protoc` and `protoc-gen-go` from Debian.
fn go_tools() -> Result<(), Unavailable> {
    if !(has("protoc") && has("protoc-gen-go")) {
        servers::apt_install(&["protobuf-compiler", "golang-goprotobuf-dev"])?;
    }
    Ok(())
}

fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().expect("runs");
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn debian_protoc_gen_go_compiles_the_client_api() {
    let Some(()) = servers::require("protoc and protoc-gen-go", go_tools()) else {
        return;
    };
    let out = out_dir("codegen-go");
    run(Command::new("protoc")
        .arg("-I")
        .arg(PROTO_DIR)
        .arg(format!("--go_out={}", out.display()))
        .arg("--go_opt=paths=source_relative")
        .arg(CLIENT_PROTO));
    let go = std::fs::read_to_string(out.join("raftlock/v1/locks.pb.go")).expect("generated");
    assert!(go.contains("package raftlockv1"), "go_package is honoured");
    assert!(go.contains("type AcquireRequest struct"));
    assert!(go.contains("Wait "), "AcquireRequest.wait is generated");
    assert!(
        !go.contains("RaftMessage") && !go.contains("RestoreRequest"),
        "the client's code carries neither the internal nor the admin API"
    );
}

#[test]
fn python_grpcio_tools_compiles_the_client_api() {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("codegen-python-venv");
    let requirements = Path::new(PROTO_DIR).join("codegen-requirements.txt");
    let Some(python) = servers::require(
        "Python 3 with grpcio-tools",
        servers::python_venv(&venv, &requirements),
    ) else {
        return;
    };
    let out = out_dir("codegen-python");
    run(Command::new(&python)
        .args(["-m", "grpc_tools.protoc", "-I"])
        .arg(PROTO_DIR)
        .arg(format!("--python_out={}", out.display()))
        .arg(format!("--grpc_python_out={}", out.display()))
        .arg(CLIENT_PROTO));
    // Build a request with the portable wait, print it as proto3 JSON and
    // read it back; list the service's methods.
    let script = r#"
import json
from google.protobuf import json_format
from raftlock.v1 import locks_pb2, locks_pb2_grpc
req = locks_pb2.AcquireRequest(session_id=7, seq=1, name="jobs/nightly", wait=True)
text = json_format.MessageToJson(req, preserving_proto_field_name=True)
assert json.loads(text)["wait"] is True, text
back = json_format.Parse('{"sessionId": "7", "seq": 1, "name": "x", "wait": true}', locks_pb2.AcquireRequest())
assert back.session_id == 7 and back.wait, back
methods = [m.name for m in locks_pb2.DESCRIPTOR.services_by_name["Locks"].methods]
assert "Acquire" in methods and "KeepAlive" in methods, methods
assert "Raft" not in locks_pb2.DESCRIPTOR.services_by_name, "internal service leaked"
assert hasattr(locks_pb2_grpc, "LocksStub")
print("ok")
"#;
    let printed = run(Command::new(&python)
        .args(["-c", script])
        .env("PYTHONPATH", &out));
    assert_eq!(String::from_utf8_lossy(&printed.stdout).trim(), "ok");
}
