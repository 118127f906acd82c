//! The checks of one operation's answer against the history's model:
//! opens, acquires (one name or several), upgrades and replayed requests.

use super::*;

impl History {
    /// Opens a session in `slot` if it is empty, else retries its open.
    pub(super) fn open(
        &mut self,
        slot: usize,
        delay: usize,
        nonce: bool,
    ) -> Result<(), TestCaseError> {
        match self.slots[slot] {
            None => {
                let nonce = if nonce { 1_000_000 + self.index } else { 0 };
                let lock_delay_ms = DELAYS[delay];
                // The id is the log index; the slot holds it before the
                // step's checks compare open sessions with the slots.
                let id = SessionId(self.index + 1);
                self.slots[slot] = Some(Slot { id, nonce });
                let (_, r) = self.apply(Command::OpenSessionV0(cmd::OpenSessionV0 {
                    ttl_ms: 10_000,
                    lock_delay_ms,
                    nonce,
                    owner: String::new(),
                }))?;
                prop_assert_eq!(
                    r.reply,
                    Reply::Opened {
                        session: id,
                        ttl_ms: 10_000,
                        lock_delay_ms
                    }
                );
            }
            Some(Slot { id, nonce }) if nonce != 0 => {
                let (before, r) = self.apply(Command::OpenSessionV0(cmd::OpenSessionV0 {
                    ttl_ms: 20_000,
                    lock_delay_ms: 0,
                    nonce,
                    owner: String::new(),
                }))?;
                prop_assert!(
                    matches!(r.reply, Reply::Opened { session, .. } if session == id),
                    "{:?}",
                    r.reply
                );
                prop_assert!(self.live == before, "a retried open changed the table");
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// What a fresh acquire must answer, given the table before it.
    pub(super) fn check_acquire(
        &self,
        before: &LockTable,
        r: &Response,
        session: SessionId,
        n: &str,
        mode: Mode,
        timeout_ms: u64,
    ) -> Result<(), TestCaseError> {
        if before.session(session).is_none() {
            prop_assert_eq!(
                &r.reply,
                &Reply::Refused(Refusal::SessionNotFound { session })
            );
            return Ok(());
        }
        let info = before.describe(&lock_name(n));
        let held = info
            .iter()
            .flat_map(|i| &i.holders)
            .find(|h| h.session == session);
        let waiting = info
            .iter()
            .flat_map(|i| &i.waiters)
            .find(|w| w.session == session);
        let other_mode = Reply::Refused(Refusal::OtherMode {
            session,
            name: lock_name(n),
        });
        match (held, waiting) {
            // Asking again (a new seq) for what it holds or waits for:
            // refused, naming the grant or wait, or OtherMode.
            (Some(h), _) if h.mode == mode => prop_assert_eq!(
                &r.reply,
                &Reply::Refused(Refusal::AlreadyHeld {
                    session,
                    name: lock_name(n),
                    fence: h.fence
                })
            ),
            // Holding it (and maybe waiting to upgrade it): what it holds
            // decides.
            (Some(_), _) => prop_assert_eq!(&r.reply, &other_mode),
            (_, Some(w)) if w.mode == mode => prop_assert_eq!(
                &r.reply,
                &Reply::Refused(Refusal::AlreadyWaiting {
                    session,
                    name: lock_name(n),
                    seq: w.seq
                })
            ),
            (_, Some(_)) => prop_assert_eq!(&r.reply, &other_mode),
            (None, None) if grantable_now(info.as_ref(), mode) => {
                let fence = Fence(before.last_fence().0 + 1);
                prop_assert_eq!(
                    &r.reply,
                    &Reply::Acquire(Acquired::Granted {
                        fence,
                        mode,
                        index: self.index - 1
                    })
                );
            }
            (None, None) if timeout_ms == 0 => {
                prop_assert_eq!(&r.reply, &Reply::Acquire(Acquired::NotAcquired))
            }
            (None, None) => prop_assert!(
                matches!(
                    r.reply,
                    Reply::Acquire(Acquired::Queued) | Reply::Refused(Refusal::Deadlock { .. })
                ),
                "busy wait answered {:?}",
                r.reply
            ),
        }
        Ok(())
    }

    /// The reply an atomic request must get, given the table before it
    /// (`upgrading`: the names with an upgrade pending before it).
    pub(super) fn check_acquire_all(
        &self,
        before: &LockTable,
        r: &Response,
        session: SessionId,
        locks: &[(LockName, Mode)],
        timeout_ms: u64,
        upgrading: &[String],
    ) -> Result<(), TestCaseError> {
        if before.session(session).is_none() {
            prop_assert_eq!(
                &r.reply,
                &Reply::Refused(Refusal::SessionNotFound { session })
            );
            return Ok(());
        }
        // A name it holds or waits for: refused, the first such name says
        // how (as for one acquire).
        for (name, mode) in locks {
            let info = before.describe(name);
            let held = info
                .iter()
                .flat_map(|i| &i.holders)
                .find(|h| h.session == session);
            let waiting = info
                .iter()
                .flat_map(|i| &i.waiters)
                .find(|w| w.session == session);
            let expected = match (held, waiting) {
                (Some(h), _) if h.mode == *mode => Refusal::AlreadyHeld {
                    session,
                    name: name.clone(),
                    fence: h.fence,
                },
                (Some(_), _) => Refusal::OtherMode {
                    session,
                    name: name.clone(),
                },
                (_, Some(w)) if w.mode == *mode => Refusal::AlreadyWaiting {
                    session,
                    name: name.clone(),
                    seq: w.seq,
                },
                (_, Some(_)) => Refusal::OtherMode {
                    session,
                    name: name.clone(),
                },
                (None, None) => continue,
            };
            prop_assert_eq!(&r.reply, &Reply::Refused(expected));
            return Ok(());
        }
        let free = locks.iter().all(|(name, mode)| {
            !upgrading.iter().any(|u| u == name.as_str())
                && grantable_now(before.describe(name).as_ref(), *mode)
        });
        if free {
            let first = before.last_fence().0 + 1;
            let grants: Vec<(Fence, Mode)> = locks
                .iter()
                .enumerate()
                .map(|(i, (_, mode))| (Fence(first + i as u64), *mode))
                .collect();
            prop_assert_eq!(
                &r.reply,
                &Reply::AcquiredAll(AcquiredAll::Granted {
                    grants,
                    index: self.index - 1
                })
            );
        } else if timeout_ms == 0 {
            prop_assert_eq!(&r.reply, &Reply::AcquiredAll(AcquiredAll::NotAcquired));
        } else {
            prop_assert!(
                matches!(
                    r.reply,
                    Reply::AcquiredAll(AcquiredAll::Queued)
                        | Reply::Refused(Refusal::Deadlock { .. })
                ),
                "a busy atomic request answered {:?}",
                r.reply
            );
        }
        Ok(())
    }

    /// The reply an upgrade must get, given the table before it.
    /// `pending`: the upgrade of `n` pending before it, in the model.
    pub(super) fn check_upgrade(
        &self,
        before: &LockTable,
        r: &Response,
        (session, n, fence, timeout_ms): (SessionId, &str, Fence, u64),
        pending: Option<(SessionId, u64)>,
    ) -> Result<(), TestCaseError> {
        if before.session(session).is_none() {
            prop_assert_eq!(
                &r.reply,
                &Reply::Refused(Refusal::SessionNotFound { session })
            );
            return Ok(());
        }
        let info = before.describe(&lock_name(n));
        let holders: Vec<&HolderInfo> = info.iter().flat_map(|i| &i.holders).collect();
        let shared = holders
            .iter()
            .any(|h| h.fence == fence && h.session == session && h.mode == SH);
        if !shared {
            prop_assert_eq!(
                &r.reply,
                &Reply::Refused(Refusal::NotHeldInMode {
                    session,
                    name: lock_name(n),
                    fence,
                    mode: "shared".into(),
                })
            );
            return Ok(());
        }
        let alone = holders.len() == 1 && !info.as_ref().is_some_and(|i| i.lock_delayed);
        match pending {
            Some((s, seq)) if s == session => prop_assert_eq!(
                &r.reply,
                &Reply::Refused(Refusal::AlreadyWaiting {
                    session,
                    name: lock_name(n),
                    seq
                })
            ),
            Some(_) => prop_assert!(
                matches!(&r.reply, Reply::Refused(Refusal::Deadlock { cycle }) if cycle.len() == 2),
                "second upgrade answered {:?}",
                r.reply
            ),
            // Granted, unless it would close a cycle (an atomic request
            // queued on the name that did not need it would then).
            None if alone => prop_assert!(
                r.reply
                    == Reply::Acquire(Acquired::Granted {
                        fence: Fence(before.last_fence().0 + 1),
                        mode: X,
                        index: self.index - 1
                    })
                    || matches!(r.reply, Reply::Refused(Refusal::Deadlock { .. })),
                "a lone upgrade answered {:?}",
                r.reply
            ),
            None if timeout_ms == 0 => {
                prop_assert_eq!(&r.reply, &Reply::Acquire(Acquired::NotAcquired))
            }
            None => prop_assert!(
                matches!(
                    r.reply,
                    Reply::Acquire(Acquired::Queued) | Reply::Refused(Refusal::Deadlock { .. })
                ),
                "a busy upgrade answered {:?}",
                r.reply
            ),
        }
        Ok(())
    }

    /// What a replayed request must answer now.
    pub(super) fn replay_answer(&self, before: &LockTable, past: &Applied) -> Reply {
        let (session, seq) = (past.session, past.seq);
        if before.session(session).is_none() {
            return Reply::Refused(Refusal::SessionNotFound { session });
        }
        let window = &self.windows[&session];
        if !window.seqs.contains(&seq) {
            let floor = window.floor.expect("forgotten, so a floor");
            return Reply::Refused(Refusal::SequenceTooOld {
                session,
                seq,
                floor,
            });
        }
        let queued = [
            Reply::Acquire(Acquired::Queued),
            Reply::AcquiredAll(AcquiredAll::Queued),
        ];
        if !queued.contains(&past.reply) {
            return past.reply.clone();
        }
        if self.queued.contains(&(session, seq)) {
            // The wait's outcome, once decided.
            return self
                .outcomes
                .get(&(session, seq))
                .cloned()
                .unwrap_or_else(|| past.reply.clone());
        }
        // A repeated acquire of a wait in progress: where the session stands.
        let Command::Acquire(cmd::Acquire { name, .. }) = &past.command else {
            unreachable!("only acquires are queued")
        };
        let info = before.describe(&lock_name(name.as_str()));
        if let Some(h) = info
            .iter()
            .flat_map(|i| &i.holders)
            .find(|h| h.session == session)
        {
            return Reply::Acquire(Acquired::Granted {
                fence: h.fence,
                mode: h.mode,
                index: h.index,
            });
        }
        if info
            .iter()
            .flat_map(|i| &i.waiters)
            .any(|w| w.session == session)
        {
            return Reply::Acquire(Acquired::Queued);
        }
        Reply::Acquire(Acquired::NotAcquired)
    }
}
