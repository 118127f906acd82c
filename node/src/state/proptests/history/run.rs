//! How the history runs one operation and checks its answer.

use super::*;

impl History {
    pub(super) fn run(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Open { slot, delay, nonce } => {
                let empty = (0..SLOTS)
                    .map(|i| (slot + i) % SLOTS)
                    .find(|&i| self.slots[i].is_none());
                self.open(empty.unwrap_or(slot), delay, nonce)?
            }
            Op::Close { slot } | Op::Expire { slot } | Op::Revoke { slot } => {
                let id = self.session_of(slot);
                let existed = self.slots[slot].is_some();
                let (command, expect) = if matches!(op, Op::Close { .. }) {
                    let seq = self.next_seq();
                    (
                        Command::CloseSession(cmd::CloseSession {
                            session: id,
                            seq,
                            caller: String::new(),
                        }),
                        existed,
                    )
                } else if matches!(op, Op::Revoke { .. }) {
                    (
                        Command::RevokeSession(cmd::RevokeSession {
                            session: id,
                            by: "ops".into(),
                            at_unix_ms: 0,
                        }),
                        existed,
                    )
                } else {
                    (
                        Command::ExpireSession(cmd::ExpireSession { session: id }),
                        existed,
                    )
                };
                if expect {
                    self.slots[slot] = None;
                    self.gone[slot] = id;
                }
                let (before, r) = self.apply(command)?;
                // The session's own grants (ending them may grant another
                // session's pending upgrade, which ends its read).
                let ended = r
                    .events
                    .iter()
                    .filter(|e| matches!(e, Event::Ended { session, .. } if *session == id))
                    .count();
                match r.reply {
                    Reply::Closed { released } => {
                        prop_assert!(expect);
                        prop_assert_eq!(released as usize, ended);
                    }
                    Reply::Expired { existed } => prop_assert_eq!(existed, expect),
                    Reply::Revoked { released } => {
                        prop_assert!(expect);
                        prop_assert_eq!(released as usize, ended);
                    }
                    Reply::Refused(Refusal::SessionNotFound { session }) => {
                        prop_assert!(!expect);
                        prop_assert_eq!(session, id);
                    }
                    ref other => prop_assert!(false, "{:?}", other),
                }
                if expect {
                    let held: usize = Self::infos(&before)
                        .iter()
                        .map(|i| i.holders.iter().filter(|h| h.session == id).count())
                        .sum();
                    prop_assert_eq!(held, ended, "not every grant of {} ended", id);
                }
            }
            Op::Acquire {
                slot,
                target,
                shared,
                weight,
                timeout,
                value,
            } => {
                let session = self.session_of(slot);
                let (n, capacity) = NAMES[target];
                let mode = match capacity {
                    None if shared => SH,
                    None => X,
                    Some(capacity) => Mode::Semaphore {
                        weight: 1 + weight % capacity,
                        capacity,
                    },
                };
                let timeout_ms = TIMEOUTS[timeout];
                let seq = self.next_seq();
                let command = Command::Acquire(cmd::Acquire {
                    session,
                    seq,
                    name: LockName::new(n).expect("valid name"),
                    mode,
                    timeout_ms,
                    value: vec![value; usize::from(value)],
                    caller: String::new(),
                });
                let (before, r) = self.request(command.clone())?;
                self.check_acquire(&before, &r, session, n, mode, timeout_ms)?;
                self.remember(&command, session, seq, &r.reply);
            }
            Op::Release {
                slot,
                target,
                pick,
                n: which,
            } => {
                let session = self.session_of(slot);
                let target = NAMES[target].0;
                let grants: Vec<(&str, Fence, SessionId)> = self
                    .holders
                    .iter()
                    .map(|(f, (n, s, _))| (n.as_str(), *f, *s))
                    .collect();
                let own = grants.iter().filter(|g| g.2 == session);
                let own = own.clone().find(|g| g.0 == target).or(own.clone().next());
                let other = grants.iter().find(|g| g.0 == target && g.2 != session);
                let stale =
                    (!self.fences.is_empty()).then(|| self.fences[which.index(self.fences.len())]);
                let bogus = Fence(self.live.last_fence().0 + 100);
                let (name, fence) = match pick {
                    FencePick::Own => own.map_or((target, bogus), |g| (g.0, g.1)),
                    FencePick::OtherHolders => {
                        (target, other.map(|g| g.1).or(stale).unwrap_or(bogus))
                    }
                    FencePick::Stale => (target, stale.unwrap_or(bogus)),
                    FencePick::Bogus => (target, bogus),
                };
                let name = name.to_string();
                // Owner-checked: only this session's grant with this fence.
                let released = self
                    .holders
                    .get(&fence)
                    .is_some_and(|(n, s, _)| *n == name && *s == session);
                let seq = self.next_seq();
                let command = Command::Release(cmd::Release {
                    session,
                    seq,
                    name: LockName::new(name).expect("valid name"),
                    fence,
                    caller: String::new(),
                });
                let (_, r) = self.request(command.clone())?;
                if self.slots[slot].is_none() {
                    prop_assert_eq!(
                        &r.reply,
                        &Reply::Refused(Refusal::SessionNotFound { session })
                    );
                } else {
                    prop_assert_eq!(&r.reply, &Reply::Released { released });
                    if released {
                        prop_assert!(
                            matches!(&r.events[0], Event::Ended { fence: f, session: s, cause: EndCause::Released, .. }
                            if *f == fence && *s == session),
                            "{:?}",
                            r.events
                        );
                    } else {
                        prop_assert!(r.events.is_empty());
                    }
                }
                self.remember(&command, session, seq, &r.reply);
            }
            Op::Cancel {
                slot,
                target,
                real,
                n,
            } => {
                let waits: Vec<(&str, SessionId, u64)> = self
                    .queues
                    .iter()
                    .flat_map(|(name, q)| q.iter().map(move |&(s, seq)| (name.as_str(), s, seq)))
                    .chain(
                        self.upgrades
                            .iter()
                            .map(|(name, &(s, seq))| (name.as_str(), s, seq)),
                    )
                    .collect();
                let (name, session, seq) = match (real, waits.is_empty()) {
                    (true, false) => waits[n.index(waits.len())],
                    _ => {
                        // The slot's own wait with a wrong seq, or no wait.
                        let session = self.session_of(slot);
                        let name = NAMES[target].0;
                        let wait = self.queues[name].iter().find(|w| w.0 == session);
                        (name, session, wait.map_or(self.seq, |w| w.1 + 1))
                    }
                };
                let cancelled = self.queues[name].contains(&(session, seq))
                    || self.upgrades.get(name) == Some(&(session, seq));
                let name = name.to_string();
                let (_, r) = self.apply(Command::TimeoutWait(cmd::TimeoutWait {
                    session,
                    name: LockName::new(name).expect("valid name"),
                    seq,
                }))?;
                prop_assert_eq!(&r.reply, &Reply::WaitTimedOut { ended: cancelled });
                if cancelled {
                    prop_assert!(
                        matches!(
                            &r.events[0],
                            Event::Cancelled {
                                cause: CancelCause::TimedOut,
                                ..
                            }
                        ),
                        "{:?}",
                        r.events
                    );
                }
            }
            Op::Upgrade {
                slot,
                target,
                real,
                timeout,
            } => {
                let session = self.session_of(slot);
                let n = NAMES[target].0;
                let own = self
                    .holders
                    .iter()
                    .find(|(_, (hn, s, _))| hn == n && *s == session)
                    .map(|(f, (_, _, m))| (*f, *m));
                let fence = match own {
                    Some((f, _)) if real => f,
                    _ => Fence(self.live.last_fence().0 + 100),
                };
                let timeout_ms = TIMEOUTS[timeout];
                let seq = self.next_seq();
                let command = Command::Upgrade(cmd::Upgrade {
                    session,
                    seq,
                    name: lock_name(n),
                    fence,
                    timeout_ms,
                    caller: String::new(),
                });
                let pending = self.upgrades.get(n).copied();
                let (before, r) = self.request(command.clone())?;
                self.check_upgrade(&before, &r, (session, n, fence, timeout_ms), pending)?;
                self.remember(&command, session, seq, &r.reply);
            }
            Op::AcquireAll {
                slot,
                names,
                shared,
                timeout,
            } => {
                let session = self.session_of(slot);
                let locks: Vec<(LockName, Mode)> = NAMES
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| names & (1 << i) != 0)
                    .map(|(i, (n, capacity))| {
                        let mode = match capacity {
                            None if shared => SH,
                            None => X,
                            Some(capacity) => Mode::Semaphore {
                                weight: 1 + (i as u32) % capacity,
                                capacity: *capacity,
                            },
                        };
                        (lock_name(n), mode)
                    })
                    .collect();
                let timeout_ms = TIMEOUTS[timeout];
                let seq = self.next_seq();
                let command = Command::AcquireAll(cmd::AcquireAll {
                    session,
                    seq,
                    locks: locks.clone(),
                    timeout_ms,
                    value: Vec::new(),
                    caller: String::new(),
                });
                let upgrading: Vec<String> = self.upgrades.keys().cloned().collect();
                let (before, r) = self.request(command.clone())?;
                self.check_acquire_all(&before, &r, session, &locks, timeout_ms, &upgrading)?;
                self.remember(&command, session, seq, &r.reply);
            }
            Op::Downgrade { slot, target, real } => {
                let session = self.session_of(slot);
                let n = NAMES[target].0;
                let own = self
                    .holders
                    .iter()
                    .find(|(_, (hn, s, _))| hn == n && *s == session)
                    .map(|(f, (_, _, m))| (*f, *m));
                let fence = match own {
                    Some((f, _)) if real => f,
                    _ => Fence(self.live.last_fence().0 + 100),
                };
                let seq = self.next_seq();
                let command = Command::Downgrade(cmd::Downgrade {
                    session,
                    seq,
                    name: lock_name(n),
                    fence,
                    caller: String::new(),
                });
                let (_, r) = self.request(command.clone())?;
                let expected = if self.slots[slot].is_none() {
                    Reply::Refused(Refusal::SessionNotFound { session })
                } else if own == Some((fence, X)) {
                    Reply::Downgraded
                } else {
                    Reply::Refused(Refusal::NotHeldInMode {
                        session,
                        name: lock_name(n),
                        fence,
                        mode: "exclusive".into(),
                    })
                };
                prop_assert_eq!(&r.reply, &expected);
                self.remember(&command, session, seq, &r.reply);
            }
            Op::EndDelay { target, real, n } => {
                let delays: Vec<(String, u64)> =
                    self.delays.iter().map(|(n, d)| (n.clone(), d.0)).collect();
                let (name, since) = match (real, delays.is_empty()) {
                    (true, false) => delays[n.index(delays.len())].clone(),
                    _ => {
                        // A delay that is over, superseded or never was.
                        let name = NAMES[target].0;
                        let since = self.last_since.get(name).map_or(self.index, |s| s + 1);
                        (name.to_string(), since)
                    }
                };
                let ended = self.delays.get(&name).map(|d| d.0) == Some(since);
                let (_, r) = self.apply(Command::EndLockDelay(cmd::EndLockDelay {
                    name: LockName::new(name).expect("valid name"),
                    since,
                }))?;
                prop_assert_eq!(r.reply, Reply::DelayEnded { ended });
            }
            Op::Replay { n } => {
                if self.history.is_empty() {
                    return Ok(());
                }
                let past = self.history[n.index(self.history.len())].clone();
                let (before, r) = self.apply(past.command.clone())?;
                prop_assert!(r.events.is_empty(), "a replay had events");
                prop_assert!(self.live == before, "a replay changed the table");
                let expected = self.replay_answer(&before, &past);
                prop_assert_eq!(r.reply, expected, "replay of {:?}", past);
            }
            Op::Bad { kind, slot, target } => {
                let session = self.session_of(slot);
                let seq = self.next_seq();
                let (n, capacity) = NAMES[target];
                let (sem, sem_cap) = NAMES[3 + target % 2];
                let exists = |name: &str| self.live.describe(&lock_name(name)).is_some();
                let acquire = |name: &str, mode: Mode, value: usize| {
                    Command::Acquire(cmd::Acquire {
                        session,
                        seq,
                        name: LockName::new(name).expect("valid name"),
                        mode,
                        timeout_ms: 1_000,
                        value: vec![0; value],
                        caller: String::new(),
                    })
                };
                let valid_mode = capacity.map_or(X, |capacity| Mode::Semaphore {
                    weight: 1,
                    capacity,
                });
                let command = match kind {
                    // Names that break the rules cannot be made (nor
                    // decoded): `state/tests/limits.rs` checks that.
                    0 => cmd::OpenSession {
                        ttl_ms: 10_000,
                        lock_delay_ms: 0,
                        nonce: 0,
                        owner: String::new(),
                        end_on_disconnect_ms: MAX_END_ON_DISCONNECT_MS + 1,
                    }
                    .into(),
                    1 => Command::SetTtl(cmd::SetTtl {
                        session,
                        seq,
                        ttl_ms: MAX_SESSION_TTL_MS + 1,
                        caller: String::new(),
                    }),
                    2 => acquire(n, valid_mode, MAX_VALUE_LEN + 1),
                    3 => Command::OpenSessionV0(cmd::OpenSessionV0 {
                        ttl_ms: MIN_SESSION_TTL_MS - 1,
                        lock_delay_ms: 0,
                        nonce: 0,
                        owner: String::new(),
                    }),
                    4 => Command::OpenSessionV0(cmd::OpenSessionV0 {
                        ttl_ms: 10_000,
                        lock_delay_ms: MAX_LOCK_DELAY_MS + 1,
                        nonce: 0,
                        owner: String::new(),
                    }),
                    5 if exists(sem) => {
                        let capacity = sem_cap.unwrap_or(1) + 1;
                        acquire(
                            sem,
                            Mode::Semaphore {
                                weight: 1,
                                capacity,
                            },
                            0,
                        )
                    }
                    6 if exists(n) => {
                        let other = if capacity.is_some() {
                            X
                        } else {
                            Mode::Semaphore {
                                weight: 1,
                                capacity: 2,
                            }
                        };
                        acquire(n, other, 0)
                    }
                    7 => acquire(
                        sem,
                        Mode::Semaphore {
                            weight: 0,
                            capacity: sem_cap.unwrap_or(1),
                        },
                        0,
                    ),
                    8 => {
                        let capacity = sem_cap.unwrap_or(1);
                        acquire(
                            sem,
                            Mode::Semaphore {
                                weight: capacity + 1,
                                capacity,
                            },
                            0,
                        )
                    }
                    9 => acquire(
                        sem,
                        Mode::Semaphore {
                            weight: 1,
                            capacity: 0,
                        },
                        0,
                    ),
                    10 => Command::Lock(cmd::Lock {
                        open: cmd::OpenSession {
                            ttl_ms: 10_000,
                            lock_delay_ms: 0,
                            nonce: 0,
                            owner: "o".repeat(MAX_OWNER_LEN + 1),
                            end_on_disconnect_ms: 0,
                        },
                        name: lock_name(n),
                        mode: valid_mode,
                        timeout_ms: 0,
                        value: Vec::new(),
                    }),
                    11 => Command::Acquire(cmd::Acquire {
                        session: SessionId(u64::MAX),
                        seq,
                        name: LockName::new(n).expect("valid name"),
                        mode: valid_mode,
                        timeout_ms: 0,
                        value: Vec::new(),
                        caller: String::new(),
                    }),
                    _ => return Ok(()),
                };
                let (_, r) = self.apply(command.clone())?;
                prop_assert!(
                    matches!(r.reply, Reply::Refused(_)),
                    "{:?} was not refused",
                    command
                );
            }
        }
        Ok(())
    }

    /// Opens a session in `slot` if it is empty, else retries its open.
    fn open(&mut self, slot: usize, delay: usize, nonce: bool) -> Result<(), TestCaseError> {
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
    fn check_acquire(
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
    fn check_acquire_all(
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
    fn check_upgrade(
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
    fn replay_answer(&self, before: &LockTable, past: &Applied) -> Reply {
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
