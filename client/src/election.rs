//! Leader election on top of locks with holder values.
//!
//! The leader is whoever holds the exclusive lock `name`; its value (an
//! address, an id) is what followers read. Candidates queue FIFO, so
//! leadership passes in campaign order.

use futures::{Stream, StreamExt};

use crate::error::Result;
use crate::guard::{Guard, Mode};
use crate::session::Session;
use crate::types::Fence;

/// One candidate's participation in an election.
pub struct Election {
    session: Session,
    name: String,
    guard: Option<Guard>,
}

impl Election {
    /// An election on lock `name` through `session`.
    pub fn new(session: Session, name: &str) -> Self {
        Election {
            session,
            name: name.to_string(),
            guard: None,
        }
    }

    /// Waits until this candidate leads, announcing `value`. Returns the
    /// leadership's fence (use it to fence the leader's writes).
    pub async fn campaign(&mut self, value: impl Into<Vec<u8>>) -> Result<Fence> {
        let guard = self
            .session
            .acquire(&self.name, Mode::Exclusive, None, value.into())
            .await?;
        let fence = guard.fence();
        self.guard = Some(guard);
        Ok(fence)
    }

    /// Gives up leadership (or the queue place). Safe to call when not
    /// leading. A campaign whose future was dropped while queued withdraws
    /// itself; `resign` returns once that withdrawal is done.
    pub async fn resign(&mut self) -> Result<()> {
        if let Some(g) = self.guard.take() {
            g.release().await?;
        }
        self.session.settle(&self.name).await;
        Ok(())
    }

    /// True while this candidate holds leadership and its lease is valid.
    pub fn is_leader(&self) -> bool {
        self.guard.as_ref().is_some_and(Guard::is_held)
    }

    /// The current leader's value and fence, if there is a leader.
    pub async fn leader(&self) -> Result<Option<(Vec<u8>, Fence)>> {
        leader(&self.session, &self.name).await
    }

    /// A stream of leader changes: the leader's value and fence after each
    /// grant or release on the election's lock (`None` while leaderless).
    pub async fn observe(&self) -> Result<impl Stream<Item = Result<Option<(Vec<u8>, Fence)>>>> {
        let events = self.session.client().watch(&self.name, false).await?;
        let session = self.session.clone();
        let name = self.name.clone();
        let first = leader(&session, &name).await?;
        let updates = events.then(move |e| {
            let session = session.clone();
            let name = name.clone();
            async move {
                match e {
                    Ok(_) => leader(&session, &name).await,
                    Err(e) => Err(e),
                }
            }
        });
        Ok(futures::stream::once(async move { Ok(first) }).chain(updates))
    }
}

async fn leader(session: &Session, name: &str) -> Result<Option<(Vec<u8>, Fence)>> {
    let info = session.client().describe(name).await?;
    Ok(info
        .and_then(|i| i.holders.into_iter().next())
        .map(|h| (h.value, h.fence)))
}
