//! The `client-link` nemesis: faults between the client workers (and the
//! keep-alive probers) and the nodes, on their client-link proxies
//! ([`crate::clientlink`]).
//!
//! What: `stall` (both directions hold their bytes and deliver them on
//! heal, as TCP does after a partition), `stall-reset` (existing
//! connections are reset, then both directions hold), `stall-answers`
//! (only what the nodes send is held: requests arrive and are applied,
//! their answers come late, after the client may have given up — the
//! shape of a late keep-alive answer credited to the wrong ask),
//! `drop-requests` / `drop-answers` (one direction's bytes are thrown
//! away; its connections are reset on heal), `delay` (50-500 ms plus up to
//! 300 ms of jitter each way). Where: every worker to the `leader`, `one`
//! worker to every node, one worker to the leader (`worker-leader`), or a
//! random half of all the links (`some`).
//!
//! With `--net netns` a third of these faults are instead `blackhole`:
//! every packet between the clients and the leader (or one node) is
//! dropped ([`crate::netns`]), so no proxy closes or resets anything and
//! the clients' own timeouts and HTTP/2 keep-alives must notice.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::RngExt;
use serde_json::json;

use super::{Active, NemesisOptions, Started};
use crate::proxy::{Delay, Link};

pub(super) async fn client_link(
    cluster: &std::sync::Arc<tokio::sync::Mutex<crate::cluster::Cluster>>,
    opts: &NemesisOptions,
    members: &[u64],
    leader: Option<u64>,
    rng: &mut StdRng,
) -> anyhow::Result<Started> {
    {
        let c = cluster.lock().await;
        if c.in_netns() && rng.random_bool(1.0 / 3.0) {
            let (scope, node) = match leader {
                Some(l) if rng.random_bool(0.5) => ("leader", l),
                _ => ("one", *members.choose(rng).expect("members")),
            };
            c.cut_clients(&[node])?;
            return Ok((
                format!("blackhole-{scope}"),
                vec![node],
                json!({"dropped": "every packet between the clients and the node"}),
                Active::Cut,
            ));
        }
    }
    let links = opts
        .links
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("the run has no client links"))?;
    let mut ends = links.ends().await;
    anyhow::ensure!(!ends.is_empty(), "no worker has client links yet");
    ends.shuffle(rng);
    let leader = leader.unwrap_or(members[0]);
    let how = *[
        "stall",
        "stall-reset",
        "stall-answers",
        "drop-requests",
        "drop-answers",
        "delay",
    ]
    .choose(rng)
    .expect("non-empty");
    let scope = *["leader", "one", "worker-leader", "some"]
        .choose(rng)
        .expect("non-empty");
    // Pairs (worker end, node).
    let pairs: Vec<(u64, u64)> = match scope {
        "leader" => ends.iter().map(|&w| (w, leader)).collect(),
        "one" => members.iter().map(|&n| (ends[0], n)).collect(),
        "worker-leader" => vec![(ends[0], leader)],
        _ => {
            let mut all: Vec<(u64, u64)> = ends
                .iter()
                .flat_map(|&w| members.iter().map(move |&n| (w, n)))
                .collect();
            all.shuffle(rng);
            all.truncate(all.len().div_ceil(2));
            all
        }
    };
    let requests: Vec<Link> = pairs.iter().map(|&(w, n)| (w, n)).collect();
    let answers: Vec<Link> = pairs.iter().map(|&(w, n)| (n, w)).collect();
    let both: Vec<Link> = requests.iter().chain(answers.iter()).copied().collect();
    let mut detail = json!({"links": pairs});
    match how {
        "stall" => links.cut(&both, false).await,
        "stall-reset" => links.cut(&both, true).await,
        "stall-answers" => links.cut(&answers, false).await,
        "drop-requests" => links.drop_bytes(&requests).await,
        "drop-answers" => links.drop_bytes(&answers).await,
        _ => {
            let delay = Delay {
                base: Duration::from_millis(rng.random_range(50..=500)),
                jitter: Duration::from_millis(rng.random_range(0..=300)),
            };
            detail["delay_ms"] = json!(delay.base.as_millis() as u64);
            detail["jitter_ms"] = json!(delay.jitter.as_millis() as u64);
            links.delay(&both, delay).await;
        }
    }
    let mut nodes: Vec<u64> = pairs.iter().map(|p| p.1).collect();
    nodes.sort_unstable();
    nodes.dedup();
    Ok((format!("{how}-{scope}"), nodes, detail, Active::ClientLinks))
}
