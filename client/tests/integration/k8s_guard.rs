//! The StatefulSet's start script (deploy/kubernetes/statefulset.yaml), as
//! raftlock-0 on an empty volume, against real clusters with TLS and
//! access control on (issue 31, item 9): it bootstraps (`--init`) only
//! when every other pod answers that it belongs to no cluster; a cluster
//! that still has node 1 is refused, one without it is joined empty, and
//! any failure to find out (TLS, credentials, network) stops the pod
//! without `--init`.
//!
//! The script runs under `sh` with the `raftlock` just built; its final
//! `exec raftlockd ...` runs a stand-in that writes its arguments down (the
//! test is about what the script decides, not about the node).

use std::path::{Path, PathBuf};
use std::time::Duration;

use raftlock_testkit::certs::Ca;
use raftlock_testkit::TestCluster;

const PEER_TOKEN: &str = "k8s-peer-token-0123456789";
const TOKEN: &str = "tok-guard";

fn acl() -> String {
    format!(
        "peer_token = \"{PEER_TOKEN}\"\n\
         [[token]]\nidentity = \"ops\"\ntoken = \"{TOKEN}\"\n\
         [[rule]]\nidentity = \"ops\"\nallow = \"admin\"\n"
    )
}

/// The start script: the block under `args: - |` of the raftlockd
/// container.
fn start_script() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes/statefulset.yaml");
    let yaml = std::fs::read_to_string(path).expect("the StatefulSet");
    let mut lines = yaml.lines().skip_while(|l| l.trim() != "args:");
    lines.next().expect("args:");
    let first = lines.next().expect("the script");
    assert_eq!(first.trim(), "- |", "args is a block scalar");
    let indent = first.len() - first.trim_start().len() + 2;
    lines
        .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() >= indent)
        .map(|l| l.get(indent..).unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// What the script did.
#[derive(Debug)]
struct Outcome {
    /// The arguments it exec'd raftlockd with, if it did.
    exec: Option<String>,
    success: bool,
    stderr: String,
}

struct Pod {
    dir: tempfile::TempDir,
}

impl Pod {
    /// raftlock-0's container: an empty data volume, the CA and the token
    /// as the Secrets would mount them.
    fn new(ca_pem: &[u8], token: &str) -> Pod {
        let dir = tempfile::tempdir().expect("dir");
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).expect("bin");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_raftlock"), bin.join("raftlock"))
            .expect("raftlock on PATH");
        let stand_in = format!(
            "#!/bin/sh\nprintf '%s ' \"$@\" > '{}'\n",
            dir.path().join("exec").display()
        );
        std::fs::write(bin.join("raftlockd"), stand_in).expect("stand-in");
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(
            bin.join("raftlockd"),
            std::fs::Permissions::from_mode(0o755),
        )
        .expect("chmod");
        std::fs::create_dir_all(dir.path().join("tls")).expect("tls");
        std::fs::write(dir.path().join("tls/ca.crt"), ca_pem).expect("ca");
        std::fs::create_dir_all(dir.path().join("acl")).expect("acl");
        std::fs::write(dir.path().join("acl/token"), format!("{token}\n")).expect("token");
        std::fs::create_dir_all(dir.path().join("data")).expect("data");
        Pod { dir }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// Runs the start script as raftlock-0, asking `others` (the other
    /// pods' client addresses).
    async fn start(&self, others: &[String]) -> Outcome {
        let path = format!(
            "{}:{}",
            self.path("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let run = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(start_script())
            .env_clear()
            .env("PATH", path)
            .env("POD_NAME", "raftlock-0")
            .env("POD_NAMESPACE", "test")
            .env("HEADLESS_SERVICE", "raftlock")
            .env("CLUSTER_DOMAIN", "cluster.invalid")
            .env("INITIAL_MEMBERS", "3")
            .env("RAFTLOCK_DATA_DIR", self.path("data"))
            .env("RAFTLOCK_CA", self.path("tls/ca.crt"))
            .env("RAFTLOCK_TOKEN_FILE", self.path("acl/token"))
            .env("RAFTLOCK_BOOTSTRAP_CHECK_ENDPOINTS", others.join(","))
            .env("RAFTLOCK_BOOTSTRAP_CHECK_PAUSE", "0")
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .expect("the script ends")
            .expect("sh runs");
        Outcome {
            exec: std::fs::read_to_string(self.path("exec")).ok(),
            success: out.status.success(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

fn refused_without_init(o: &Outcome, why: &str) {
    assert!(
        !o.success && o.exec.is_none(),
        "{why}: the script must stop the pod without starting raftlockd: {o:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_guard_bootstraps_only_when_every_other_pod_is_fresh() {
    let ca = Ca::new("k8s CA");
    // Node 1 alone, and two fresh nodes that belong to no cluster yet (a
    // new StatefulSet's raftlock-1 and raftlock-2).
    let mut cluster = TestCluster::start_acl(
        1,
        &acl(),
        Some(ca.node_tls(&["127.0.0.1", "localhost"], false)),
    )
    .await;
    let fresh = vec![
        cluster.spawn_new_node().await.1,
        cluster.spawn_new_node().await.1,
    ];
    let pod = Pod::new(&ca.pem(), TOKEN);
    let o = pod.start(&fresh).await;
    let exec = o.exec.as_deref().unwrap_or_else(|| panic!("{o:#?}"));
    assert!(exec.contains("--init"), "{o:#?}");

    // Any failure to find out is no licence to bootstrap.
    let other_ca = Ca::new("another CA");
    let wrong_ca = Pod::new(&other_ca.pem(), TOKEN);
    refused_without_init(&wrong_ca.start(&fresh).await, "a CA the pods do not use");
    let wrong_token = Pod::new(&ca.pem(), "tok-unknown");
    refused_without_init(&wrong_token.start(&fresh).await, "an unknown token");
    let unreachable = raftlock_testkit::RefusingAddr::new().expect("a refusing port");
    let one_down = vec![fresh[0].clone(), unreachable.addr()];
    refused_without_init(
        &pod_again(&ca).start(&one_down).await,
        "a pod that does not answer",
    );
    cluster.shutdown().await;
}

fn pod_again(ca: &Ca) -> Pod {
    Pod::new(&ca.pem(), TOKEN)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_guard_never_bootstraps_beside_a_running_cluster() {
    let ca = Ca::new("k8s CA");
    let cluster = TestCluster::start_acl(
        3,
        &acl(),
        Some(ca.node_tls(&["127.0.0.1", "localhost"], false)),
    )
    .await;
    let others = vec![cluster.addr(2), cluster.addr(3)];

    // Node 1 is still a member: refused, naming what to do.
    let o = pod_again(&ca).start(&others).await;
    refused_without_init(&o, "node 1 is still a member");
    assert!(o.stderr.contains("raftlock members remove 1"), "{o:#?}");

    // TLS or credentials that do not work: refused, the CLI's error shown.
    let other_ca = Ca::new("another CA");
    let o = Pod::new(&other_ca.pem(), TOKEN).start(&others).await;
    refused_without_init(&o, "a CA the pods do not use");
    assert!(o.stderr.contains("TLS"), "the reason is shown: {o:#?}");
    let o = Pod::new(&ca.pem(), "tok-unknown").start(&others).await;
    refused_without_init(&o, "an unknown token");
    assert!(
        o.stderr.contains("unauthenticated") || o.stderr.contains("token"),
        "{o:#?}"
    );

    // Node 1 removed: raftlock-0 starts empty, to be added again.
    let admin = raftlock_client::Client::with_options(
        cluster.addrs(),
        raftlock_client::ClientOptions {
            token: Some(TOKEN.into()),
            tls: Some(raftlock_client::ClientTls {
                ca_pem: ca.pem(),
                identity: None,
            }),
            ..Default::default()
        },
    )
    .expect("client");
    admin.remove_node(1).await.expect("remove node 1");
    let o = pod_again(&ca).start(&others).await;
    assert!(o.success, "{o:#?}");
    let exec = o.exec.as_deref().unwrap_or_else(|| panic!("{o:#?}"));
    assert!(!exec.contains("--init"), "{o:#?}");
    assert!(o.stderr.contains("raftlock members add 1"), "{o:#?}");
    cluster.shutdown().await;
}
