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
}
