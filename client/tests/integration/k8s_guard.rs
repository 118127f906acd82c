//! The StatefulSet's start script (deploy/kubernetes/statefulset.yaml)
//! against real clusters with TLS and access control on.
//!
//! As raftlock-0 on an empty volume (issue 31, item 9): it bootstraps
//! (`--init`, a cluster of itself alone) only when every other pod answers
//! that it belongs to no cluster; beside a cluster it starts empty and
//! joins (`--join`), and any failure to find out (TLS, credentials,
//! network) stops the pod without starting raftlockd. There the script's
//! final `exec raftlockd ...` runs a stand-in that writes its arguments
//! down (those tests are about what the script decides).
//!
//! All three pods at once, for real (issue 45, item 4): a new StatefulSet
//! forms with nothing started in advance, and a pod that lost its volume
//! rejoins only once its old id is removed.

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

/// This build's raftlockd (built if need be).
fn raftlockd() -> PathBuf {
    raftlock_testkit::bins::workspace_bin(
        "raftlock-node",
        "raftlockd",
        Path::new(env!("CARGO_BIN_EXE_raftlock")),
        "RAFTLOCK_JEPSEN_RAFTLOCKD",
        true,
    )
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
        // Records how `run` is exec'd; `data-state` is the real one.
        let stand_in = format!(
            "#!/bin/sh\n[ \"$1\" != data-state ] || exec '{}' \"$@\"\nprintf '%s ' \"$@\" > '{}'\n",
            raftlockd().display(),
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
    // A cluster of itself alone: the other pods join it.
    let me = "raftlock-0.raftlock.test.svc.cluster.invalid";
    assert!(
        exec.contains(&format!("--peers 1={me}:7101/{me}:7201 --init")),
        "{o:#?}"
    );

    // A first start cut short (raftlockd killed before it bootstrapped:
    // its files exist, with no vote and no log) is still an empty volume.
    let cut_short = Pod::new(&ca.pem(), TOKEN);
    let data = cut_short.path("data");
    let mut first = std::process::Command::new(raftlockd())
        .args(["run", "--id", "1", "--insecure-peers", "--listen"])
        .arg(format!(
            "127.0.0.1:{}",
            raftlock_testkit::ports::free_port()
        ))
        .arg("--data-dir")
        .arg(&data)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("raftlockd");
    raftlock_testkit::eventually(
        "raftlockd to create its files",
        Duration::from_secs(60),
        || {
            let sled = data.join("sled");
            async move { sled.join("conf").exists().then_some(()) }
        },
    )
    .await;
    first.kill().expect("kill");
    first.wait().expect("reaped");
    let o = cut_short.start(&fresh).await;
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

/// An admin client of the nodes at `endpoints`.
fn admin_client(endpoints: Vec<String>, ca: &Ca) -> raftlock_client::Client {
    client_with(endpoints, ca, TOKEN)
}

/// A client of the nodes at `endpoints` with bearer token `token`.
fn client_with(endpoints: Vec<String>, ca: &Ca, token: &str) -> raftlock_client::Client {
    raftlock_client::Client::with_options(
        endpoints,
        raftlock_client::ClientOptions {
            token: Some(token.into()),
            tls: Some(raftlock_client::ClientTls {
                ca_pem: ca.pem(),
                identity: None,
            }),
            ..Default::default()
        },
    )
    .expect("client")
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

    // Node 1 is still a member: raftlockd starts empty to join, without
    // --init (raftlockd itself refuses to take part as node 1 while the
    // cluster counts node 1 a voter: node/tests/lost_voter.rs and the
    // StatefulSet test below); the log names what to do.
    let o = pod_again(&ca).start(&others).await;
    let exec = o.exec.as_deref().unwrap_or_else(|| panic!("{o:#?}"));
    assert!(o.success && !exec.contains("--init"), "{o:#?}");
    assert!(exec.contains("--join"), "{o:#?}");
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
    let admin = admin_client(cluster.addrs(), &ca);
    admin.remove_node(1).await.expect("remove node 1");
    let o = pod_again(&ca).start(&others).await;
    assert!(o.success, "{o:#?}");
    let exec = o.exec.as_deref().unwrap_or_else(|| panic!("{o:#?}"));
    assert!(
        !exec.contains("--init") && exec.contains("--join"),
        "{o:#?}"
    );
    assert!(o.stderr.contains("joining it as a new member"), "{o:#?}");
    cluster.shutdown().await;
}

/// The StatefulSet's three pods, for real: each runs the start script as
/// written, with this build's `raftlockd` and `raftlock`, restarted as the
/// kubelet restarts a container that exits. Only the names differ: the
/// pods' DNS names and `0.0.0.0` ports, which cannot all be bound on one
/// machine, are mapped to loopback ports by shims first on the PATH,
/// which rewrite the arguments and exec the real binaries.
struct StatefulSet {
    /// The pods' files, removed with the set.
    _dir: tempfile::TempDir,
    /// Each pod's client address on loopback, by ordinal.
    client: Vec<String>,
    pods: Vec<RealPod>,
}

struct RealPod {
    /// While set, the pod's container is not restarted.
    held: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The process group of the container running now.
    group: std::sync::Arc<std::sync::Mutex<Option<u32>>>,
    kubelet: tokio::task::JoinHandle<()>,
    log: PathBuf,
    data: PathBuf,
}

const PODS: usize = 3;

impl StatefulSet {
    fn new(ca: &Ca) -> StatefulSet {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("dir");
        let port = || format!("127.0.0.1:{}", raftlock_testkit::ports::free_port());
        let client: Vec<String> = (0..PODS).map(|_| port()).collect();
        let peer: Vec<String> = (0..PODS).map(|_| port()).collect();
        let leaf = ca.issue("raftlock pod", &["127.0.0.1", "localhost"]);
        let raftlockd = raftlockd();
        let mut pods = Vec::new();
        for ordinal in 0..PODS {
            let pod = dir.path().join(format!("raftlock-{ordinal}"));
            for d in ["bin", "tls", "acl", "data"] {
                std::fs::create_dir_all(pod.join(d)).expect("pod dirs");
            }
            std::fs::write(pod.join("tls/tls.crt"), &leaf.cert_pem).expect("cert");
            std::fs::write(pod.join("tls/tls.key"), &leaf.key_pem).expect("key");
            std::fs::write(pod.join("tls/ca.crt"), ca.pem()).expect("ca");
            std::fs::write(pod.join("acl/acl.toml"), acl()).expect("acl");
            std::fs::write(pod.join("acl/token"), format!("{TOKEN}\n")).expect("token");
            // The names every pod derives, and this pod's own ports.
            let mut sed = String::new();
            for (i, (c, p)) in client.iter().zip(&peer).enumerate() {
                let name = format!("raftlock-{i}\\.raftlock\\.test\\.svc\\.cluster\\.invalid");
                sed += &format!("s|{name}:7101|{c}|g\ns|{name}:7201|{p}|g\n");
            }
            sed += &format!(
                "s|0\\.0\\.0\\.0:7101|{}|g\ns|0\\.0\\.0\\.0:7201|{}|g\ns|0\\.0\\.0\\.0:9101|{}|g\n",
                client[ordinal],
                peer[ordinal],
                port()
            );
            std::fs::write(pod.join("names.sed"), sed).expect("sed");
            for (name, real) in [
                ("raftlockd", raftlockd.clone()),
                ("raftlock", PathBuf::from(env!("CARGO_BIN_EXE_raftlock"))),
            ] {
                let shim = format!(
                    "#!/bin/sh\nn=$#\nfor a; do\n  set -- \"$@\" \"$(printf '%s\\n' \"$a\" | sed -f '{}')\"\ndone\nshift \"$n\"\nexec '{}' \"$@\"\n",
                    pod.join("names.sed").display(),
                    real.display()
                );
                let path = pod.join("bin").join(name);
                std::fs::write(&path, shim).expect("shim");
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                    .expect("chmod");
            }
            let env: Vec<(String, String)> = [
                ("POD_NAME", format!("raftlock-{ordinal}")),
                ("POD_NAMESPACE", "test".into()),
                ("HEADLESS_SERVICE", "raftlock".into()),
                ("CLUSTER_DOMAIN", "cluster.invalid".into()),
                ("INITIAL_MEMBERS", PODS.to_string()),
                ("RAFTLOCK_DATA_DIR", pod.join("data").display().to_string()),
                (
                    "RAFTLOCK_TLS_CERT",
                    pod.join("tls/tls.crt").display().to_string(),
                ),
                (
                    "RAFTLOCK_TLS_KEY",
                    pod.join("tls/tls.key").display().to_string(),
                ),
                (
                    "RAFTLOCK_TLS_CA",
                    pod.join("tls/ca.crt").display().to_string(),
                ),
                (
                    "RAFTLOCK_ACL_FILE",
                    pod.join("acl/acl.toml").display().to_string(),
                ),
                ("RUST_LOG", "info,openraft=error,sled=warn".into()),
                ("RAFTLOCK_ENDPOINTS", client[ordinal].clone()),
                ("RAFTLOCK_CA", pod.join("tls/ca.crt").display().to_string()),
                (
                    "RAFTLOCK_TOKEN_FILE",
                    pod.join("acl/token").display().to_string(),
                ),
                // The pause before a refused start exits (30 s by default).
                ("RAFTLOCK_BOOTSTRAP_CHECK_PAUSE", "1".into()),
                (
                    "PATH",
                    format!(
                        "{}:{}",
                        pod.join("bin").display(),
                        std::env::var("PATH").unwrap_or_default()
                    ),
                ),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
            // What `kubectl exec` into the pod runs with.
            let exports: String = env
                .iter()
                .map(|(k, v)| format!("export {k}='{v}'\n"))
                .collect();
            std::fs::write(pod.join("env.sh"), exports).expect("env.sh");
            pods.push(RealPod::start(env, pod.join("log"), pod.join("data")));
        }
        StatefulSet {
            _dir: dir,
            client,
            pods,
        }
    }

    /// Runs the guide's block `name` as written under `sh -eu`, with a
    /// `kubectl` that does to these pods what the block asks of the
    /// cluster: `exec` into a pod (with its environment), `delete pvc`
    /// (the pod's next start gets an empty volume) and `delete pod` (its
    /// container is killed; the kubelet starts it again).
    async fn run_guide(&self, name: &str) -> std::process::Output {
        use std::os::unix::fs::PermissionsExt as _;
        let set = self._dir.path();
        let bin = set.join("kubectl-bin");
        std::fs::create_dir_all(&bin).expect("bin");
        let shim = format!(
            r#"#!/bin/sh
set -eu
set_dir='{}'
[ "$1 $2" = "-n raftlock" ] || {{ echo "kubectl stand-in: unexpected: $*" >&2; exit 2; }}
shift 2
case "$1 $2" in
  "exec raftlock-"*)
    pod=$2; shift 2; [ "$1" = -- ] && shift
    . "$set_dir/$pod/env.sh"
    exec "$@" ;;
  "delete pvc") touch "$set_dir/${{3#data-}}/pvc-deleted" ;;
  "delete pod") env kill -KILL -- "-$(cat "$set_dir/$3/pgid")" ;;
  *) echo "kubectl stand-in: unexpected: $*" >&2; exit 2 ;;
esac
"#,
            set.display()
        );
        std::fs::write(bin.join("kubectl"), shim).expect("kubectl");
        std::fs::set_permissions(bin.join("kubectl"), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let script = raftlock_testkit::guide::block(name);
        let out = tokio::process::Command::new("sh")
            .arg("-euc")
            .arg(&script)
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    bin.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .output()
            .await
            .expect("sh runs");
        assert!(
            out.status.success(),
            "the guide's {name} block failed:\n{script}\n{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        out
    }

    fn admin(&self, ca: &Ca) -> raftlock_client::Client {
        admin_client(self.client.clone(), ca)
    }

    /// Waits until the membership is nodes 1..=3, all voters, and `also`
    /// holds, failing with every pod's log after `within`.
    async fn wait_formed(
        &self,
        admin: &raftlock_client::Client,
        within: Duration,
        what: &str,
        also: impl Fn(&Self) -> bool,
    ) {
        let deadline = std::time::Instant::now() + within;
        loop {
            if admin.members().await.is_ok_and(|m| formed(&m)) && also(self) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "not yet after {within:?}: {what}:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn log(&self, ordinal: usize) -> String {
        std::fs::read_to_string(&self.pods[ordinal].log).unwrap_or_default()
    }

    /// Every pod's log, for a failure's message.
    fn logs(&self) -> String {
        (0..PODS)
            .map(|i| {
                let log = self.log(i);
                let tail = &log[log.len().saturating_sub(4000)..];
                format!("--- raftlock-{i}:\n{tail}\n")
            })
            .collect()
    }
}

impl Drop for StatefulSet {
    fn drop(&mut self) {
        for pod in &self.pods {
            pod.held.store(true, std::sync::atomic::Ordering::SeqCst);
            pod.kubelet.abort();
            pod.kill();
        }
    }
}

impl RealPod {
    /// Runs the start script with `env` until the pod is dropped,
    /// starting it again a second after it exits.
    fn start(env: Vec<(String, String)>, log: PathBuf, data: PathBuf) -> RealPod {
        let held = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let group = std::sync::Arc::new(std::sync::Mutex::new(None));
        let kubelet = tokio::spawn({
            let (held, group, log, data) = (held.clone(), group.clone(), log.clone(), data.clone());
            async move {
                loop {
                    if !held.load(std::sync::atomic::Ordering::SeqCst) {
                        // A deleted PVC: the pod comes back on a new, empty
                        // volume.
                        if std::fs::remove_file(data.with_file_name("pvc-deleted")).is_ok() {
                            std::fs::remove_dir_all(&data).expect("old volume");
                            std::fs::create_dir_all(&data).expect("new volume");
                        }
                        let stderr = std::fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(&log)
                            .expect("log");
                        let mut child = tokio::process::Command::new("sh")
                            .arg("-c")
                            .arg(start_script())
                            .env_clear()
                            .envs(env.iter().map(|(k, v)| (k, v)))
                            .stdin(std::process::Stdio::null())
                            .stdout(std::process::Stdio::null())
                            .stderr(stderr)
                            .process_group(0)
                            .kill_on_drop(true)
                            .spawn()
                            .expect("sh runs");
                        *group.lock().unwrap() = child.id();
                        if let Some(id) = child.id() {
                            std::fs::write(data.with_file_name("pgid"), id.to_string())
                                .expect("pgid");
                        }
                        let _ = child.wait().await;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        });
        RealPod {
            held,
            group,
            kubelet,
            log,
            data,
        }
    }

    /// Kills the container running now (its whole process group).
    fn kill(&self) {
        if let Some(group) = self.group.lock().unwrap().take() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{group}")])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }

    /// The pod's volume is lost: its container is killed, its data
    /// directory emptied, and it starts again.
    async fn lose_volume(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        self.held.store(true, SeqCst);
        self.kill();
        // Past the kubelet's pause, so no container runs meanwhile.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        self.kill();
        std::fs::remove_dir_all(&self.data).expect("wipe");
        std::fs::create_dir_all(&self.data).expect("empty volume");
        self.held.store(false, SeqCst);
    }
}

/// Whether `members` are exactly nodes 1..=3, all voters.
fn formed(members: &[raftlock_client::Member]) -> bool {
    let mut ids: Vec<(u64, bool)> = members.iter().map(|m| (m.id, m.voter)).collect();
    ids.sort();
    ids == [(1, true), (2, true), (3, true)]
}

/// Issue 45, item 4: a new StatefulSet forms with nothing started in
/// advance (raftlock-0 bootstraps alone once the other pods answer that
/// they are fresh; they join by themselves), and a pod whose volume is
/// lost stays out while the cluster counts it a voter, then joins again
/// by itself once its id is removed. Before 2026-12-01 such a pod rejoined
/// at once under its old id, having forgotten its votes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_statefulset_forms_and_a_pod_that_lost_its_volume_rejoins_only_when_removed() {
    let ca = Ca::new("k8s CA");
    let set = StatefulSet::new(&ca);
    let admin = set.admin(&ca);
    let within = Duration::from_secs(120);
    set.wait_formed(&admin, within, "a cluster of three voters", |_| true)
        .await;
    assert!(
        set.log(0).contains("bootstrapping one of this node alone"),
        "{}",
        set.logs()
    );
    for i in 1..PODS {
        assert!(!set.log(i).contains("--init"), "{}", set.logs());
    }
    // The peer token, with which the pods added themselves on the peer
    // port, does nothing on the client port (the NetworkPolicy opens it to
    // clients).
    let as_peer = client_with(set.client.clone(), &ca, PEER_TOKEN);
    for refused in [
        as_peer
            .members()
            .await
            .map(drop)
            .expect_err("no membership"),
        as_peer
            .remove_node(2)
            .await
            .map(drop)
            .expect_err("no removal"),
    ] {
        assert!(
            refused.to_string().contains("unknown bearer token"),
            "{refused}"
        );
    }

    // raftlock-2 (node 3) loses its volume.
    set.pods[2].lose_volume().await;
    let deadline = std::time::Instant::now() + within;
    while !set.log(2).contains("raftlock members remove 3") {
        assert!(
            std::time::Instant::now() < deadline,
            "raftlock-2 did not refuse to rejoin as node 3 within {within:?}:\n{}",
            set.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Node 3 is still counted a voter (nothing else changed).
    let deadline = std::time::Instant::now() + within;
    loop {
        match admin.members().await {
            Ok(m) => {
                assert!(formed(&m), "{m:?}");
                break;
            }
            Err(e) => assert!(
                std::time::Instant::now() < deadline,
                "no membership within {within:?} ({e}):\n{}",
                set.logs()
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The guide's replacement, as written: remove node 3, delete the
    // pod's volume and the pod; it comes back empty and adds itself. The
    // pod says its join is done once it sees itself a voter, which can be
    // a moment after the membership that counts it is committed.
    let before = set.log(2).len();
    set.run_guide("k8s-replace").await;
    set.wait_formed(&admin, within, "raftlock-2 joined again", |set| {
        let log = &set.log(2)[before..];
        log.contains("--join: asking to be added") && log.contains("--join is done")
    })
    .await;
}
