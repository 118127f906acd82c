//! `raftlockd run` configuration: flags, `RAFTLOCK_*` environment variables
//! and an optional TOML file, in that order of precedence, then
//! [`Config::validate`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::node::{NodeOptions, RaftTiming};
use crate::raft::{valid_addr, NodeAddrs, NodeId};

/// A node's settings, declared once: each field is a `raftlockd run` flag
/// (`--heartbeat-ms`), an environment variable (`RAFTLOCK_HEARTBEAT_MS`) and
/// a key of the TOML file (`heartbeat_ms`). Flags and environment variables
/// override the file ([`Config::or`]).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// This node's id: a non-zero integer, unique in the cluster and never
    /// reused for another machine.
    #[arg(long, env = "RAFTLOCK_ID")]
    pub id: Option<NodeId>,
    /// Address to listen on for clients (and for peers, without a separate
    /// peer listener), e.g. 127.0.0.1:7101.
    #[arg(long, env = "RAFTLOCK_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Address clients (and peers, without a separate peer listener) reach
    /// this node at, if not the listen address (e.g. a DNS name behind NAT
    /// or in Kubernetes).
    #[arg(long, env = "RAFTLOCK_ADVERTISE")]
    pub advertise: Option<String>,
    /// Serve the internal Raft service on this separate address (like
    /// etcd's peer port 2380), so it can be firewalled off from clients;
    /// the client address then answers UNIMPLEMENTED to Raft calls.
    #[arg(long, env = "RAFTLOCK_PEER_LISTEN")]
    pub peer_listen: Option<SocketAddr>,
    /// Address peers reach the peer listener at, if not its listen address.
    /// Only with a peer listener.
    #[arg(long, env = "RAFTLOCK_PEER_ADVERTISE")]
    pub peer_advertise: Option<String>,
    /// Directory for the Raft log, votes and snapshots.
    #[arg(long, env = "RAFTLOCK_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Initial cluster members, used with init: 1=HOST:PORT,2=HOST:PORT,...
    /// as a flag, a table `id = "host:port"` in the file;
    /// HOST:PORT/HOST:PEER_PORT for a member with a separate peer listener.
    #[arg(long, env = "RAFTLOCK_PEERS", value_parser = parse_peers)]
    pub peers: Option<BTreeMap<NodeId, String>>,
    /// Bootstrap a new cluster from the peers if this node has no data yet.
    /// Give it to exactly one node of a new cluster.
    #[arg(long, env = "RAFTLOCK_INIT", num_args = 0, default_missing_value = "true",
          value_parser = clap::builder::FalseyValueParser::new())]
    pub init: Option<bool>,
    /// Join the cluster whose nodes answer at these peer addresses
    /// (HOST:PORT,...: their --peer-advertise, or their client address if
    /// they have no separate peer listener) as a new member, by itself:
    /// while it is not a voter, this node asks them to add it (a learner,
    /// then a voter once caught up), with the credentials it uses towards
    /// its peers (the ACL's peer_token, its TLS certificate). Only a
    /// node that started with an empty data directory, or that is a learner
    /// of the cluster (a join that was cut short), is added; one the
    /// cluster removed while it kept its data is not added again.
    #[arg(long, env = "RAFTLOCK_JOIN", value_delimiter = ',')]
    pub join: Option<Vec<String>>,
    /// Leader heartbeat interval in milliseconds (default 100).
    #[arg(long, env = "RAFTLOCK_HEARTBEAT_MS")]
    pub heartbeat_ms: Option<u64>,
    /// Lower bound of the election timeout in milliseconds (default 300).
    #[arg(long, env = "RAFTLOCK_ELECTION_TIMEOUT_MIN_MS")]
    pub election_timeout_min_ms: Option<u64>,
    /// Upper bound of the election timeout in milliseconds (default 500).
    #[arg(long, env = "RAFTLOCK_ELECTION_TIMEOUT_MAX_MS")]
    pub election_timeout_max_ms: Option<u64>,
    /// Build a snapshot every this many applied entries (default 10000).
    #[arg(long, env = "RAFTLOCK_SNAPSHOT_EVERY")]
    pub snapshot_every: Option<u64>,
    /// Dial peers at these addresses instead of their advertised ones
    /// (fault-injection proxies): 2=HOST:PORT,... as a flag, a table in the
    /// file.
    #[arg(long, env = "RAFTLOCK_DIAL", value_parser = parse_peers)]
    pub dial: Option<BTreeMap<NodeId, String>>,
    /// PEM certificate chain of this node (TLS for clients and peers; needs
    /// the key and the CA too).
    #[arg(long, env = "RAFTLOCK_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the node's certificate.
    #[arg(long, env = "RAFTLOCK_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate that signs the nodes' (and clients') certificates.
    #[arg(long, env = "RAFTLOCK_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Require client certificates signed by the CA from every client and
    /// peer (mTLS).
    #[arg(long, env = "RAFTLOCK_TLS_CLIENT_AUTH", num_args = 0, default_missing_value = "true",
          value_parser = clap::builder::FalseyValueParser::new())]
    pub tls_client_auth: Option<bool>,
    /// Serve Prometheus metrics (GET /metrics) on this address.
    #[arg(long, env = "RAFTLOCK_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// How many `/`-separated segments of a lock name the `prefix` label
    /// of the lock wait and hold histograms keeps (default 1; 0: one label
    /// for every name).
    #[arg(long, env = "RAFTLOCK_METRICS_PREFIX_DEPTH")]
    pub metrics_prefix_depth: Option<usize>,
    /// The most distinct `prefix` labels (1..=1000, default 100); names
    /// past it are counted under `prefix="_other"`.
    #[arg(long, env = "RAFTLOCK_METRICS_PREFIX_LABELS")]
    pub metrics_prefix_labels: Option<usize>,
    /// Turn access control on with this ACL file (tokens, rules, peer
    /// token; see docs/operations/tls-and-acl.md). SIGHUP reloads it.
    #[arg(long, env = "RAFTLOCK_ACL_FILE")]
    pub acl_file: Option<PathBuf>,
    /// Run a node of a multi-member cluster without peer authentication
    /// (no ACL file with a peer_token, no mutual TLS): anyone who can reach
    /// its Raft port can then rewrite the replicated log. Without this
    /// setting such a node refuses to start.
    #[arg(long, env = "RAFTLOCK_INSECURE_PEERS", num_args = 0, default_missing_value = "true",
          value_parser = clap::builder::FalseyValueParser::new())]
    pub insecure_peers: Option<bool>,
}

/// A setting that cannot be used; names the setting.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid setting `{setting}`: {reason}")]
pub struct ConfigError {
    /// The setting's name as in the TOML file (flags use dashes).
    pub setting: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

fn err(setting: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        setting,
        reason: reason.into(),
    }
}

/// Parses `1=127.0.0.1:7101,2=127.0.0.1:7102` (an address may be
/// `CLIENT/PEER`, see [`NodeAddrs::parse`]).
pub fn parse_peers(s: &str) -> Result<BTreeMap<NodeId, String>, ConfigError> {
    let mut peers = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .ok_or_else(|| err("peers", format!("expected ID=HOST:PORT, got {part:?}")))?;
        let id: NodeId = id
            .trim()
            .parse()
            .map_err(|_| err("peers", format!("node id {id:?} is not a number")))?;
        if peers.insert(id, addr.trim().to_string()).is_some() {
            return Err(err("peers", format!("node {id} listed twice")));
        }
    }
    Ok(peers)
}

impl Config {
    /// Reads a TOML file.
    pub fn from_toml_file(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| err("config", format!("cannot read {}: {e}", path.display())))?;
        toml::from_str(&text).map_err(|e| err("config", format!("{}: {e}", path.display())))
    }

    /// `self` with unset fields taken from `lower`.
    pub fn or(self, lower: Config) -> Config {
        Config {
            id: self.id.or(lower.id),
            listen: self.listen.or(lower.listen),
            advertise: self.advertise.or(lower.advertise),
            peer_listen: self.peer_listen.or(lower.peer_listen),
            peer_advertise: self.peer_advertise.or(lower.peer_advertise),
            data_dir: self.data_dir.or(lower.data_dir),
            peers: self.peers.or(lower.peers),
            init: self.init.or(lower.init),
            join: self.join.or(lower.join),
            heartbeat_ms: self.heartbeat_ms.or(lower.heartbeat_ms),
            election_timeout_min_ms: self
                .election_timeout_min_ms
                .or(lower.election_timeout_min_ms),
            election_timeout_max_ms: self
                .election_timeout_max_ms
                .or(lower.election_timeout_max_ms),
            snapshot_every: self.snapshot_every.or(lower.snapshot_every),
            dial: self.dial.or(lower.dial),
            tls_cert: self.tls_cert.or(lower.tls_cert),
            tls_key: self.tls_key.or(lower.tls_key),
            tls_ca: self.tls_ca.or(lower.tls_ca),
            tls_client_auth: self.tls_client_auth.or(lower.tls_client_auth),
            metrics_listen: self.metrics_listen.or(lower.metrics_listen),
            metrics_prefix_depth: self.metrics_prefix_depth.or(lower.metrics_prefix_depth),
            metrics_prefix_labels: self.metrics_prefix_labels.or(lower.metrics_prefix_labels),
            acl_file: self.acl_file.or(lower.acl_file),
            insecure_peers: self.insecure_peers.or(lower.insecure_peers),
        }
    }

    /// The TLS settings: all of cert, key and CA, or none of them; the
    /// files are read now (`SIGHUP` reads them again to reload).
    pub fn tls(&self) -> Result<Option<crate::tls::TlsOptions>, ConfigError> {
        let client_auth = self.tls_client_auth.unwrap_or(false);
        let (cert, key, ca) = match (&self.tls_cert, &self.tls_key, &self.tls_ca) {
            (None, None, None) if !client_auth => return Ok(None),
            (None, None, None) => {
                return Err(err(
                    "tls_cert",
                    "tls_client_auth needs tls_cert, tls_key and tls_ca",
                ))
            }
            (Some(c), Some(k), Some(a)) => (c, k, a),
            (None, _, _) => return Err(err("tls_cert", "TLS is half set up: tls_cert is missing")),
            (_, None, _) => return Err(err("tls_key", "TLS is half set up: tls_key is missing")),
            (_, _, None) => return Err(err("tls_ca", "TLS is half set up: tls_ca is missing")),
        };
        let read = |setting: &'static str, path: &PathBuf| {
            let pem = std::fs::read(path)
                .map_err(|e| err(setting, format!("cannot read {}: {e}", path.display())))?;
            if !String::from_utf8_lossy(&pem).contains("-----BEGIN ") {
                return Err(err(
                    setting,
                    format!("{} is not a PEM file", path.display()),
                ));
            }
            Ok(pem)
        };
        Ok(Some(crate::tls::TlsOptions {
            cert_pem: read("tls_cert", cert)?,
            key_pem: read("tls_key", key)?,
            ca_pem: read("tls_ca", ca)?,
            client_auth,
        }))
    }

    /// Checks every setting and produces the node's options and listen
    /// address.
    pub fn validate(&self) -> Result<(NodeOptions, Listen), ConfigError> {
        let id = self.id.ok_or_else(|| err("id", "required"))?;
        if id == 0 {
            return Err(err("id", "must be non-zero"));
        }
        let listen = self
            .listen
            .ok_or_else(|| err("listen", "required (e.g. 127.0.0.1:7101)"))?;
        if listen.port() == 0 {
            return Err(err("listen", "needs a fixed port"));
        }
        let advertise = self.advertise.clone().unwrap_or_else(|| listen.to_string());
        if !valid_addr(&advertise) {
            return Err(err(
                "advertise",
                format!("must be host:port, got {advertise:?}"),
            ));
        }
        let peer_advertise = match (self.peer_listen, &self.peer_advertise) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(err(
                    "peer_advertise",
                    "only with peer_listen (without it, peers use `advertise`)",
                ))
            }
            (Some(pl), _) if pl.port() == 0 => {
                return Err(err("peer_listen", "needs a fixed port"));
            }
            (Some(pl), _) if pl == listen => {
                return Err(err(
                    "peer_listen",
                    "must differ from listen (leave it out to serve peers on listen)",
                ));
            }
            (Some(pl), pa) => {
                let pa = pa.clone().unwrap_or_else(|| pl.to_string());
                if !valid_addr(&pa) {
                    return Err(err(
                        "peer_advertise",
                        format!("must be host:port, got {pa:?}"),
                    ));
                }
                Some(pa)
            }
        };
        let own = NodeAddrs::new(
            advertise.clone(),
            peer_advertise.clone().unwrap_or_else(|| advertise.clone()),
        );
        let data_dir = self
            .data_dir
            .clone()
            .ok_or_else(|| err("data_dir", "required"))?;
        if data_dir.as_os_str().is_empty() {
            return Err(err("data_dir", "must not be empty"));
        }
        let mut peers = BTreeMap::new();
        for (pid, addr) in self.peers.iter().flatten() {
            if *pid == 0 {
                return Err(err("peers", "node ids must be non-zero"));
            }
            let Some(addrs) = NodeAddrs::parse(addr) else {
                return Err(err(
                    "peers",
                    format!(
                        "address of node {pid} must be host:port or host:port/host:peer_port, \
                         got {addr:?}"
                    ),
                ));
            };
            peers.insert(*pid, addrs);
        }
        let dial = self.dial.clone().unwrap_or_default();
        for (pid, addr) in &dial {
            if !valid_addr(addr) {
                return Err(err(
                    "dial",
                    format!("address of node {pid} must be host:port, got {addr:?}"),
                ));
            }
        }
        let join = self.join.clone().unwrap_or_default();
        if let Some(bad) = join.iter().find(|a| !valid_addr(a)) {
            return Err(err(
                "join",
                format!("addresses must be host:port, got {bad:?}"),
            ));
        }
        let tls = self.tls()?;
        let acl = match &self.acl_file {
            None => None,
            Some(path) => {
                Some(crate::auth::Acl::load(path).map_err(|e| err("acl_file", e.to_string()))?)
            }
        };
        let init = self.init.unwrap_or(false);
        if init {
            match peers.get(&id) {
                None if peers.is_empty() => {
                    peers.insert(id, own.clone());
                }
                None => {
                    return Err(err(
                        "peers",
                        format!("must include this node ({id}) when init is set"),
                    ))
                }
                Some(_) => {}
            }
        }
        // Secure by default: a node that will have peers authenticates
        // them, or the operator says in so many words that it need not. A
        // single-node cluster (init with itself alone) has no peers.
        let single = init && peers.keys().all(|p| *p == id) && join.is_empty();
        let peers_authenticated = acl.is_some() || tls.as_ref().is_some_and(|t| t.client_auth);
        if !single && !peers_authenticated && !self.insecure_peers.unwrap_or(false) {
            return Err(err(
                "insecure_peers",
                "this node's peers would not be authenticated, so anyone who can reach its \
                 Raft port could rewrite the replicated log or stop the node: set acl_file \
                 (with a peer_token) on every node, or mutual TLS (tls_cert, tls_key, tls_ca \
                 and tls_client_auth); or pass --insecure-peers (RAFTLOCK_INSECURE_PEERS=true) \
                 to run without, on a network only the cluster's nodes can reach",
            ));
        }
        let defaults = RaftTiming::default();
        let ms = |v: Option<u64>, d: Duration| v.map(Duration::from_millis).unwrap_or(d);
        let heartbeat = ms(self.heartbeat_ms, defaults.heartbeat);
        let emin = ms(self.election_timeout_min_ms, defaults.election_timeout.0);
        let emax = ms(self.election_timeout_max_ms, defaults.election_timeout.1);
        if heartbeat.is_zero() {
            return Err(err("heartbeat_ms", "must be positive"));
        }
        if emin <= heartbeat {
            return Err(err(
                "election_timeout_min_ms",
                "must be larger than heartbeat_ms",
            ));
        }
        if emax <= emin {
            return Err(err(
                "election_timeout_max_ms",
                "must be larger than election_timeout_min_ms",
            ));
        }
        let snapshot_every = self.snapshot_every.unwrap_or(defaults.snapshot_every);
        if snapshot_every == 0 {
            return Err(err("snapshot_every", "must be at least 1"));
        }
        let prefix_labels = crate::metrics::PrefixLabels {
            depth: self
                .metrics_prefix_depth
                .unwrap_or(crate::metrics::DEFAULT_PREFIX_DEPTH),
            max: self
                .metrics_prefix_labels
                .unwrap_or(crate::metrics::DEFAULT_MAX_PREFIX_LABELS),
        };
        if !(1..=crate::metrics::MAX_PREFIX_LABELS).contains(&prefix_labels.max) {
            return Err(err(
                "metrics_prefix_labels",
                format!("must be 1..={}", crate::metrics::MAX_PREFIX_LABELS),
            ));
        }
        Ok((
            NodeOptions {
                id,
                advertise,
                peer_advertise,
                data_dir,
                peers,
                init,
                timing: RaftTiming {
                    heartbeat,
                    election_timeout: (emin, emax),
                    snapshot_every,
                    ..RaftTiming::default()
                },
                dial,
                tls,
                auth: std::sync::Arc::new(crate::auth::Auth::new(acl)),
                storage_faults: Default::default(),
                prefix_labels,
                connector: None,
                storage: Default::default(),
                join,
            },
            Listen {
                client: listen,
                peer: self.peer_listen,
            },
        ))
    }
}

/// The addresses a node listens on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listen {
    /// For clients (and peers, without `peer`).
    pub client: SocketAddr,
    /// For peers, if separate.
    pub peer: Option<SocketAddr>,
}

#[cfg(test)]
mod tests;
