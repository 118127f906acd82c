//! deploy/kubernetes (issue 31, item 9): every manifest the kustomization
//! lists passes `kubernetes-validate --strict` (PyPI; it carries the
//! Kubernetes JSON schemas) for the oldest and newest Kubernetes it knows,
//! and the manifests say what the guide promises: required anti-affinity,
//! a PodDisruptionBudget of one, RollingUpdate held by a partition, TLS
//! and the ACL from Secrets (and Services that declare their ports TLS),
//! the Raft port on its own listener and open to the raftlock pods only.
//!
//! Installs the validator into a virtual environment under the target
//! directory (`pip` from PyPI); skips saying why where that cannot be done,
//! and fails instead under CI=true or RAFTLOCK_REQUIRE_SERVERS=1.

use std::path::{Path, PathBuf};
use std::process::Command;

use raftlock_testkit::servers;

const K8S: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubernetes");

/// The Kubernetes versions checked against (the validator's oldest and
/// newest schemas).
const VERSIONS: [&str; 2] = ["1.25.0", "1.37.0"];

fn python() -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("k8s-validate-venv");
    let requirements = Path::new(env!("CARGO_MANIFEST_DIR")).join("k8s-validate-requirements.txt");
    servers::require(
        "Python 3 with kubernetes-validate",
        servers::python_venv(&venv, &requirements),
    )
}

/// The resources the kustomization lists.
fn manifests() -> Vec<PathBuf> {
    let k = std::fs::read_to_string(Path::new(K8S).join("kustomization.yaml")).expect("read");
    let mut in_resources = false;
    let mut files = Vec::new();
    for line in k.lines() {
        if line.starts_with("resources:") {
            in_resources = true;
        } else if in_resources {
            match line.trim().strip_prefix("- ") {
                Some(file) if line.starts_with("  ") => files.push(Path::new(K8S).join(file)),
                _ => in_resources = false,
            }
        }
    }
    assert!(files.len() >= 5, "{files:?}");
    files
}

/// `kubernetes-validate --strict` on `files` for `version`: success and
/// what it said.
fn validate(python: &Path, version: &str, files: &[PathBuf]) -> (bool, String) {
    let out = Command::new(python)
        .args(["-m", "kubernetes_validate", "--strict", "-k", version])
        .args(files)
        .output()
        .expect("the validator runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

#[test]
fn the_manifests_pass_the_kubernetes_schemas() {
    let Some(python) = python() else {
        return;
    };
    let files = manifests();
    for version in VERSIONS {
        let (ok, said) = validate(&python, version, &files);
        assert!(ok, "Kubernetes {version}:\n{said}");
        for file in &files {
            let name = file.file_name().expect("name").to_string_lossy();
            assert!(
                said.lines()
                    .any(|l| l.contains(&*name) && l.contains("passed")),
                "{name} was not checked against {version}:\n{said}"
            );
        }
    }
    // The checker catches a mistake: a misspelt field, a wrong type.
    let dir = tempfile::tempdir().expect("dir");
    let sts = std::fs::read_to_string(Path::new(K8S).join("statefulset.yaml")).expect("read");
    for (what, broken) in [
        (
            "misspelt",
            sts.replace("requiredDuringScheduling", "requiredDuringSchedulling"),
        ),
        (
            "wrong type",
            sts.replace("partition: 3", "partition: three"),
        ),
    ] {
        assert_ne!(broken, sts, "{what}: the mistake was made");
        let path = dir.path().join("statefulset.yaml");
        std::fs::write(&path, broken).expect("write");
        let (ok, said) = validate(&python, VERSIONS[1], &[path]);
        assert!(!ok, "{what}: not caught:\n{said}");
    }
}

/// What the guide says about the manifests, read with PyYAML (installed
/// with the validator).
#[test]
fn the_manifests_say_what_the_guide_promises() {
    let Some(python) = python() else {
        return;
    };
    let check = r#"
import sys, yaml
docs = {}
for path in sys.argv[1:]:
    for d in yaml.safe_load_all(open(path)):
        if d:
            docs[d["kind"]] = d
sts = docs["StatefulSet"]
spec = sts["spec"]
pod = spec["template"]["spec"]
labels = spec["selector"]["matchLabels"]

anti = pod["affinity"]["podAntiAffinity"]
assert "preferredDuringSchedulingIgnoredDuringExecution" not in anti, anti
(term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
assert term["topologyKey"] == "kubernetes.io/hostname", term
assert term["labelSelector"]["matchLabels"] == labels, term

pdb = docs["PodDisruptionBudget"]["spec"]
assert pdb == {"maxUnavailable": 1, "selector": {"matchLabels": labels}}, pdb

update = spec["updateStrategy"]
assert update["type"] == "RollingUpdate", update
assert update["rollingUpdate"]["partition"] == spec["replicas"], update

(c,) = pod["containers"]
env = {e["name"]: e for e in c["env"]}
assert "RAFTLOCK_INSECURE_PEERS" not in env, "peers must authenticate"
mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
assert secrets == {"tls": "raftlock-tls", "acl": "raftlock-acl"}, secrets
for var, volume in [("RAFTLOCK_TLS_CERT", "tls"), ("RAFTLOCK_TLS_KEY", "tls"),
                    ("RAFTLOCK_TLS_CA", "tls"), ("RAFTLOCK_ACL_FILE", "acl"),
                    ("RAFTLOCK_CA", "tls"), ("RAFTLOCK_TOKEN_FILE", "acl")]:
    assert env[var]["value"].startswith(mounts[volume] + "/"), (var, env[var], mounts)
for v in pod["volumes"]:
    if "secret" in v:
        assert v["secret"]["defaultMode"] & 0o007 == 0, v

script = c["args"][0]
assert "--peer-listen 0.0.0.0:7201" in script and "--peer-advertise" in script, script
ports = {p["name"]: p["containerPort"] for p in c["ports"]}
assert ports["peer"] == 7201 and ports["grpc"] == 7101, ports
headless = [d for p in sys.argv[1:] for d in yaml.safe_load_all(open(p))
            if d and d["kind"] == "Service" and d["spec"].get("clusterIP") == "None"]
(headless,) = headless
assert 7201 in [p["port"] for p in headless["spec"]["ports"]], headless
# With TLS on, the Services say so: the gRPC and Raft ports are TLS
# (`https`), never cleartext HTTP/2 (`kubernetes.io/h2c`, as they said
# before 2026-12-01); metrics and probes stay plain HTTP.
assert "RAFTLOCK_TLS_CERT" in env
services = [d for p in sys.argv[1:] for d in yaml.safe_load_all(open(p))
            if d and d["kind"] == "Service"]
assert len(services) == 2, services
for svc in services:
    for p in svc["spec"]["ports"]:
        want = "http" if p["targetPort"] == "metrics" else "https"
        assert p.get("appProtocol", want) == want, (svc["metadata"]["name"], p)
        assert p["targetPort"] == "metrics" or "appProtocol" in p, (svc["metadata"]["name"], p)

np = docs["NetworkPolicy"]["spec"]
assert np["podSelector"]["matchLabels"] == labels, np
assert np["policyTypes"] == ["Ingress"], np
for rule in np["ingress"]:
    opened = [p["port"] for p in rule["ports"]]
    if 7201 in opened:
        assert rule.get("from") == [{"podSelector": {"matchLabels": labels}}], rule
        assert opened == [7201], rule
print("ok")
"#;
    let out = Command::new(&python)
        .arg("-c")
        .arg(check)
        .args(manifests())
        .output()
        .expect("python runs");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
