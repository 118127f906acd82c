//! The StatefulSet's start script (deploy/kubernetes/statefulset.yaml)
//! against real clusters with TLS and access control on (issue 31, item 9;
//! issue 45, item 4 for the other pods): raftlock-0 on an empty volume
//! bootstraps (`--init`, a cluster of itself alone) only when every other
//! pod answers that it belongs to no cluster; every pod on an empty volume
//! refuses to start while the cluster counts its id, and starts empty and
//! joins (`raftlock members add`) once it does not; any failure to find
//! out (TLS, credentials, network, a member that does not answer) stops
//! the pod without starting raftlockd.
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
    /// The pod's name (`raftlock-N`: node id N + 1).
    name: String,
    /// The process group of the last start (the script's background
    /// join outlives it), killed on drop.
    group: std::sync::Mutex<Option<u32>>,
}

impl Drop for Pod {
    fn drop(&mut self) {
        if let Some(group) = self.group.lock().unwrap().take() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{group}")])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

impl Pod {
    /// raftlock-0's container: an empty data volume, the CA and the token
    /// as the Secrets would mount them.
    fn new(ca_pem: &[u8], token: &str) -> Pod {
        Pod::named("raftlock-0", ca_pem, token)
    }

    /// Pod `name`'s container (`raftlock-N`).
    fn named(name: &str, ca_pem: &[u8], token: &str) -> Pod {
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
        Pod {
            dir,
            name: name.to_string(),
            group: std::sync::Mutex::new(None),
        }
    }

    /// What the script and its background join have logged so far.
    fn log(&self) -> String {
        std::fs::read_to_string(self.path("stderr")).unwrap_or_default()
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// Runs the start script as this pod, asking `others` (the other
    /// pods' client addresses), until it execs raftlockd or exits; a join
    /// it starts in the background goes on until the pod is dropped.
    async fn start(&self, others: &[String]) -> Outcome {
        let path = format!(
            "{}:{}",
            self.path("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let stderr = std::fs::File::create(self.path("stderr")).expect("stderr file");
        let mut child = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(start_script())
            .env_clear()
            .env("PATH", path)
            .env("POD_NAME", &self.name)
            .env("POD_NAMESPACE", "test")
            .env("HEADLESS_SERVICE", "raftlock")
            .env("CLUSTER_DOMAIN", "cluster.invalid")
            .env("INITIAL_MEMBERS", "3")
            .env("RAFTLOCK_DATA_DIR", self.path("data"))
            .env("RAFTLOCK_CA", self.path("tls/ca.crt"))
            .env("RAFTLOCK_TOKEN_FILE", self.path("acl/token"))
            .env("RAFTLOCK_BOOTSTRAP_CHECK_ENDPOINTS", others.join(","))
            .env("RAFTLOCK_BOOTSTRAP_CHECK_PAUSE", "0")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .expect("sh runs");
        if let Some(old) = self.group.lock().unwrap().replace(child.id().expect("pid")) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{old}")])
                .stderr(std::process::Stdio::null())
                .status();
        }
        let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
            .await
            .expect("the script ends")
            .expect("sh runs");
        Outcome {
            exec: std::fs::read_to_string(self.path("exec")).ok(),
            success: status.success(),
            stderr: self.log(),
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
    // A cluster of itself alone: the other pods join it.
    let me = "raftlock-0.raftlock.test.svc.cluster.invalid";
    assert!(
        exec.contains(&format!("--peers 1={me}:7101/{me}:7201 --init")),
        "{o:#?}"
    );

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

    // Node 1 removed: raftlock-0 starts empty and adds itself again.
    admin_client(cluster.addrs(), &ca)
        .remove_node(1)
        .await
        .expect("remove node 1");
    // Asked of the members left (the removed node may still call itself
    // leader for a moment).
    let admin = admin_client(others.clone(), &ca);
    let pod = pod_again(&ca);
    let o = pod.start(&others).await;
    assert!(o.success, "{o:#?}");
    let exec = o.exec.as_deref().unwrap_or_else(|| panic!("{o:#?}"));
    assert!(!exec.contains("--init"), "{o:#?}");
    assert!(o.stderr.contains("raftlock members add 1"), "{o:#?}");
    assert!(
        member_appears(
            &admin,
            1,
            "raftlock-0.raftlock.test.svc.cluster.invalid:7101"
        )
        .await,
        "raftlock-0 did not add itself: {}",
        pod.log()
    );
    drop(pod);
    cluster.shutdown().await;
}

/// An admin client of the nodes at `endpoints`.
fn admin_client(endpoints: Vec<String>, ca: &Ca) -> raftlock_client::Client {
    raftlock_client::Client::with_options(
        endpoints,
        raftlock_client::ClientOptions {
            token: Some(TOKEN.into()),
            tls: Some(raftlock_client::ClientTls {
                ca_pem: ca.pem(),
                identity: None,
            }),
            ..Default::default()
        },
    )
    .expect("client")
}

/// Polls the cluster's membership (up to a minute) for node `id` at
/// `addr`; whether it appeared.
async fn member_appears(admin: &raftlock_client::Client, id: u64, addr: &str) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        if let Ok(members) = admin.members().await {
            if members.iter().any(|m| m.id == id && m.addr == addr) {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Polls the pod's log (up to a minute) for `text`.
async fn logs(pod: &Pod, text: &str) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        if pod.log().contains(text) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Issue 45, item 4: raftlock-1 (node 2) on an empty volume. In a new
/// StatefulSet it starts empty without --init; beside a cluster that still
/// counts node 2 it refuses to start (before 2026-12-01 it started as an
/// empty node 2, having forgotten its votes); once node 2 is removed it
/// starts empty and joins by itself (`members add 2`); a member the pods
/// name that does not answer stops it. With data it starts at once, and
/// does not join a cluster that removed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_other_pod_refuses_its_old_id_and_joins_as_a_new_member() {
    let ca = Ca::new("k8s CA");
    let tls = || Some(ca.node_tls(&["127.0.0.1", "localhost"], false));
    let self_addr = "raftlock-1.raftlock.test.svc.cluster.invalid:7101";

    // A new StatefulSet: raftlock-0 and raftlock-2 belong to no cluster.
    let mut lone = TestCluster::start_acl(1, &acl(), tls()).await;
    let fresh = vec![lone.spawn_new_node().await.1, lone.spawn_new_node().await.1];
    let pod = Pod::named("raftlock-1", &ca.pem(), TOKEN);
    let o = pod.start(&fresh).await;
    let exec = o.exec.as_deref().unwrap_or_else(|| panic!("{o:#?}"));
    assert!(o.success && !exec.contains("--init"), "{o:#?}");
    assert!(o.stderr.contains("no cluster yet"), "{o:#?}");
    drop(pod);
    lone.shutdown().await;

    let cluster = TestCluster::start_acl(3, &acl(), tls()).await;
    let admin = admin_client(cluster.addrs(), &ca);
    let others = vec![cluster.addr(1), cluster.addr(3)];

    // Node 2 is a member: refused, naming what to do.
    let o = Pod::named("raftlock-1", &ca.pem(), TOKEN)
        .start(&others)
        .await;
    refused_without_init(&o, "node 2 is still a member");
    assert!(o.stderr.contains("raftlock members remove 2"), "{o:#?}");

    // Node 2 removed: it starts empty and adds itself.
    admin.remove_node(2).await.expect("remove node 2");
    let admin = admin_client(others.clone(), &ca);
    let pod = Pod::named("raftlock-1", &ca.pem(), TOKEN);
    let o = pod.start(&others).await;
    let exec = o.exec.as_deref().unwrap_or_else(|| panic!("{o:#?}"));
    assert!(o.success && !exec.contains("--init"), "{o:#?}");
    assert!(
        member_appears(&admin, 2, self_addr).await,
        "raftlock-1 did not add itself: {}",
        pod.log()
    );
    drop(pod);
    admin.remove_node(2).await.expect("remove node 2 again");

    // With data it starts at once, and stays out of a cluster that
    // removed it.
    let pod = Pod::named("raftlock-1", &ca.pem(), TOKEN);
    std::fs::create_dir_all(pod.path("data/sled")).expect("data");
    let o = pod.start(&others).await;
    assert!(o.success && o.exec.is_some(), "{o:#?}");
    assert!(
        logs(
            &pod,
            "is not a member of the cluster (removed?): not joining it"
        )
        .await,
        "{}",
        pod.log()
    );
    drop(pod);

    // Only raftlock-0 named (as if the other pods were gone): the members
    // it names are asked too, and one that does not answer stops the pod.
    let mut cluster = cluster;
    cluster.kill(3).await;
    let o = Pod::named("raftlock-1", &ca.pem(), TOKEN)
        .start(&[cluster.addr(1)])
        .await;
    refused_without_init(&o, "a member that does not answer");
    assert!(o.stderr.contains(&cluster.addr(3)), "{o:#?}");
    cluster.shutdown().await;
}
