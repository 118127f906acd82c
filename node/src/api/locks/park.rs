//! A queued acquire parked until its grant or cancellation is applied.

use std::time::Duration;

use super::WAIT_GRACE;
use crate::api::Api;
use crate::error::Error;
use crate::metrics::stages::Stage;
use crate::state::limits::WAIT_FOREVER;
use crate::state::{Acquired, LockName, SessionId};

impl Api {
    /// Waits for a queued acquire's grant or cancellation.
    pub(in crate::api) async fn park(
        &self,
        session: SessionId,
        name: LockName,
        timeout_ms: u64,
    ) -> Result<Acquired, Error> {
        // Registered under the read lock, so the grant cannot be applied
        // between the look and the registration.
        let rx = self
            .0
            .shared
            .read(|applied| match applied.table.standing(session, &name) {
                Acquired::Queued => Ok(self.0.shared.waiters.register(session, name)),
                settled => Err(settled),
            });
        let rx = match rx {
            Ok(rx) => rx,
            Err(settled) => return Ok(settled),
        };
        // The registration is dropped without an outcome when this node stops
        // leading or shuts down (it may never apply the outcome then). The
        // acquire is in the log, queued: the answer must not read as "not
        // the leader" (which clients take as "never sent"). The client
        // retries with the same seq at the leader and keeps its place, or
        // cancels it.
        let closed = || {
            Error::Unavailable(
                "leadership changed while the acquire was queued; its outcome is unknown \
                 (it may still be queued): retry with the same session_id and seq, or cancel it"
                    .into(),
            )
        };
        let woken = |(outcome, at): (Acquired, tokio::time::Instant)| {
            let stages = &self.0.shared.metrics.stages;
            stages.record(Stage::WaiterWake, at.elapsed(), 1);
            outcome
        };
        if timeout_ms == WAIT_FOREVER {
            return rx.await.map(woken).map_err(|_| closed());
        }
        let timeout = Duration::from_millis(timeout_ms);
        let limit = timeout + timeout.max(WAIT_GRACE);
        match tokio::time::timeout(limit, rx).await {
            Ok(outcome) => outcome.map(woken).map_err(|_| closed()),
            Err(_) => Err(Error::Timeout(format!(
                "no grant or cancellation applied on this node within {} ms; \
                 the outcome is unknown: retry with the same session_id and seq",
                limit.as_millis()
            ))),
        }
    }
}
