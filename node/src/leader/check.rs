//! Leadership confirmations (ReadIndex rounds) shared by the callers that
//! arrive while one is due.

use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::apply::Raft;
use crate::error::Error;

/// Leadership confirmations in shared rounds: a caller joins the next round
/// that starts after it arrives, never one already under way (that round
/// could have collected its acknowledgements before the caller's request
/// existed).
#[derive(Default)]
pub(super) struct LeaderCheck {
    state: Arc<Mutex<CheckState>>,
}

#[derive(Default)]
struct CheckState {
    running: bool,
    pending: Vec<oneshot::Sender<Result<(), Error>>>,
}

impl LeaderCheck {
    pub(super) async fn confirm(&self, raft: &Raft) -> Result<(), Error> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut s = self.state.lock().expect("leader check lock poisoned");
            s.pending.push(tx);
            !std::mem::replace(&mut s.running, true)
        };
        if start {
            let state = self.state.clone();
            let raft = raft.clone();
            tokio::spawn(async move {
                loop {
                    let batch = {
                        let mut s = state.lock().expect("leader check lock poisoned");
                        if s.pending.is_empty() {
                            s.running = false;
                            return;
                        }
                        std::mem::take(&mut s.pending)
                    };
                    let result = raft
                        .ensure_linearizable(openraft::ReadPolicy::ReadIndex)
                        .await
                        .map(|_| ())
                        .map_err(Error::from);
                    for tx in batch {
                        let _ = tx.send(result.clone());
                    }
                }
            });
        }
        rx.await
            .map_err(|_| Error::Unavailable("node shutting down".into()))?
    }
}
