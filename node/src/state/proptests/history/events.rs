//! How the history's model follows the events of each applied command,
//! checking FIFO order, fences and that each event fits the command.

use super::*;

impl History {
    /// Updates the model from the events, checking FIFO order, fences and
    /// that each event fits the command.
    pub(super) fn follow_events(
        &mut self,
        command: &Command,
        before: &LockTable,
        r: &Response,
    ) -> Result<(), TestCaseError> {
        // Atomic requests granted or ended by this step.
        let mut finished = BTreeSet::new();
        for e in &r.events {
            match e {
                Event::SessionOpened { session, .. } => {
                    prop_assert!(
                        matches!(
                            command,
                            Command::OpenSessionV0(_) | Command::OpenSession(_) | Command::Lock(_)
                        ),
                        "opened by {:?}",
                        command
                    );
                    prop_assert_eq!(*session, SessionId(self.index), "id is the log index");
                }
                Event::SessionRevoked { session, .. } => {
                    prop_assert!(
                        matches!(command, Command::RevokeSession(c) if c.session == *session),
                        "revoked by {:?}",
                        command
                    );
                }
                Event::SessionEnded { session, expired } => {
                    let ended = match command {
                        Command::CloseSession(c) => Some((c.session, false)),
                        Command::ExpireSession(c) => Some((c.session, true)),
                        Command::RevokeSession(c) => Some((c.session, false)),
                        _ => None,
                    };
                    prop_assert_eq!(ended, Some((*session, *expired)));
                    self.dead.insert(*session);
                    self.windows.remove(session);
                }
                Event::Granted {
                    name,
                    session,
                    seq,
                    fence,
                    mode,
                } => {
                    prop_assert!(
                        !self.delays.contains_key(name.as_str()),
                        "grant during a delay"
                    );
                    // One cluster-wide counter: larger than every fence before.
                    if let Some(last) = self.fences.last() {
                        prop_assert!(fence > last, "fence {:?} after {:?}", fence, last);
                    }
                    self.fences.push(*fence);
                    let upgrade = (*session, *seq);
                    let upgraded = self.upgrades.get(name.as_str()) == Some(&upgrade)
                        || matches!(command, Command::Upgrade(c) if c.session == *session && c.seq == *seq && c.name == *name);
                    if upgraded {
                        // Its shared grant ended just before (in this
                        // response): it is the lock's only holder now.
                        self.upgrades.remove(name.as_str());
                        prop_assert!(
                            !self.holders.values().any(|(n, _, _)| n == name.as_str()),
                            "upgrade of {:?} granted beside other holders",
                            upgrade
                        );
                        prop_assert_eq!(*mode, X);
                    }
                    prop_assert!(
                        upgraded || !self.upgrades.contains_key(name.as_str()),
                        "{:?} granted past a pending upgrade",
                        upgrade
                    );
                    let queue = self.queues.get_mut(name.as_str()).expect("known name");
                    match queue.iter().position(|&w| w == (*session, *seq)) {
                        _ if upgraded => {}
                        Some(pos) => {
                            prop_assert_eq!(
                                pos,
                                0,
                                "granted {:?} past {:?}",
                                (session, seq),
                                queue
                            );
                            queue.pop_front();
                        }
                        None => {
                            // An immediate grant: only of this very request,
                            // and never past anyone queued.
                            let this = matches!(command, Command::Acquire(cmd::Acquire { session: s, seq: q, name: n, .. })
                                if s == session && q == seq && n == name)
                                || matches!(command, Command::AcquireAll(c)
                                    if c.session == *session && c.seq == *seq && c.locks.iter().any(|(n, _)| n == name));
                            prop_assert!(this, "grant of {:?} out of nowhere", (session, seq));
                            prop_assert!(queue.is_empty(), "{:?} barged past {:?}", session, queue);
                        }
                    }
                    prop_assert!(
                        self.live.session(*session).is_some(),
                        "grant to a gone session"
                    );
                    self.holders
                        .insert(*fence, (name.as_str().to_string(), *session, *mode));
                    if let Some(names) = self.groups.get(&(*session, *seq)) {
                        // Granted all at once: every name in this response.
                        let granted: Vec<(Fence, Mode)> = names
                            .iter()
                            .filter_map(|n| {
                                r.events.iter().find_map(|e| match e {
                                    Event::Granted {
                                        name: gn,
                                        session: gs,
                                        seq: gq,
                                        fence,
                                        mode,
                                    } if gn.as_str() == n && gs == session && gq == seq => {
                                        Some((*fence, *mode))
                                    }
                                    _ => None,
                                })
                            })
                            .collect();
                        prop_assert_eq!(
                            granted.len(),
                            names.len(),
                            "atomic request {:?} granted in part",
                            (session, seq)
                        );
                        self.outcomes.insert(
                            (*session, *seq),
                            Reply::AcquiredAll(AcquiredAll::Granted {
                                grants: granted,
                                index: self.index,
                            }),
                        );
                        finished.insert((*session, *seq));
                    } else {
                        self.outcomes.insert(
                            (*session, *seq),
                            Reply::Acquire(Acquired::Granted {
                                fence: *fence,
                                mode: *mode,
                                index: self.index,
                            }),
                        );
                    }
                }
                Event::Queued {
                    name,
                    session,
                    seq,
                    mode,
                    timeout_ms,
                } => {
                    prop_assert!(*timeout_ms > 0, "a try was queued");
                    let upgrade = matches!(command, Command::Upgrade(c)
                        if c.session == *session && c.seq == *seq && c.name == *name && c.timeout_ms == *timeout_ms);
                    let this = matches!(command, Command::Acquire(cmd::Acquire { session: s, seq: q, name: n, mode: m, timeout_ms: t, .. })
                        if s == session && q == seq && n == name && m == mode && t == timeout_ms);
                    let atomic = match command {
                        Command::AcquireAll(c)
                            if c.session == *session
                                && c.seq == *seq
                                && c.timeout_ms == *timeout_ms
                                && c.locks.contains(&(name.clone(), *mode)) =>
                        {
                            self.groups.entry((*session, *seq)).or_insert_with(|| {
                                c.locks
                                    .iter()
                                    .map(|(n, _)| n.as_str().to_string())
                                    .collect()
                            });
                            true
                        }
                        _ => false,
                    };
                    prop_assert!(
                        this || upgrade || atomic,
                        "queued {:?} by {:?}",
                        (session, seq),
                        command
                    );
                    if upgrade {
                        prop_assert_eq!(*mode, X);
                        let before = self
                            .upgrades
                            .insert(name.as_str().to_string(), (*session, *seq));
                        prop_assert!(before.is_none(), "two upgrades of {}", name);
                    } else {
                        self.queues
                            .get_mut(name.as_str())
                            .expect("known name")
                            .push_back((*session, *seq));
                    }
                    self.queued.insert((*session, *seq));
                }
                Event::Cancelled {
                    name, session, seq, ..
                } => {
                    if self.upgrades.get(name.as_str()) == Some(&(*session, *seq)) {
                        self.upgrades.remove(name.as_str());
                    } else {
                        let queue = self.queues.get_mut(name.as_str()).expect("known name");
                        let pos = queue.iter().position(|&w| w == (*session, *seq));
                        prop_assert!(
                            pos.is_some(),
                            "cancelled {:?}, which was not queued",
                            (session, seq)
                        );
                        queue.remove(pos.unwrap_or_default());
                    }
                    let key = (*session, *seq);
                    let outcome = match self.groups.get(&key) {
                        Some(names) => {
                            // Out of every queue in this response.
                            let all = names.iter().all(|n| {
                                r.events.iter().any(|e| {
                                    matches!(e,
                                    Event::Cancelled { name: cn, session: cs, seq: cq, .. }
                                        if cn.as_str() == n && cs == session && cq == seq)
                                })
                            });
                            prop_assert!(all, "atomic request {:?} cancelled in part", key);
                            finished.insert(key);
                            Reply::AcquiredAll(AcquiredAll::NotAcquired)
                        }
                        None => Reply::Acquire(Acquired::NotAcquired),
                    };
                    self.outcomes.insert(key, outcome);
                }
                Event::Ended {
                    name,
                    session,
                    fence,
                    mode,
                    ..
                } => {
                    let held = self.holders.remove(fence);
                    prop_assert_eq!(held, Some((name.as_str().to_string(), *session, *mode)));
                }
                Event::LockDelayStarted {
                    name,
                    delay_ms,
                    since,
                } => {
                    // As long as the expired (or revoked) session's delay,
                    // and as what is left of a delay already in force.
                    let session = match command {
                        Command::ExpireSession(cmd::ExpireSession { session }) => session,
                        Command::RevokeSession(c) => &c.session,
                        other => {
                            prop_assert!(false, "delay by {:?}", other);
                            unreachable!()
                        }
                    };
                    prop_assert_eq!(*since, self.index);
                    let own = before.session(*session).map_or(0, |s| s.lock_delay_ms);
                    let in_force = self.delays.get(name.as_str()).map_or(0, |d| d.1);
                    prop_assert!(own > 0, "delay started by a session without one");
                    prop_assert_eq!(
                        *delay_ms,
                        own.max(in_force),
                        "length of the delay on {}",
                        name
                    );
                    self.delays
                        .insert(name.as_str().to_string(), (*since, *delay_ms));
                    self.last_since.insert(name.as_str().to_string(), *since);
                }
                Event::LockDelayEnded { name } => {
                    prop_assert!(self.delays.remove(name.as_str()).is_some());
                }
                Event::Downgraded {
                    name,
                    session,
                    fence,
                } => {
                    prop_assert!(
                        matches!(command, Command::Downgrade(c) if c.session == *session && c.fence == *fence),
                        "downgraded by {:?}",
                        command
                    );
                    let held = self.holders.get_mut(fence);
                    prop_assert_eq!(
                        held.as_deref(),
                        Some(&(name.as_str().to_string(), *session, X)),
                        "downgrade of a grant not held exclusively"
                    );
                    if let Some(h) = held {
                        h.2 = SH;
                    }
                }
                Event::SessionTtlChanged { session, .. } => {
                    prop_assert!(
                        matches!(command, Command::SetTtl(c) if c.session == *session),
                        "ttl changed by {:?}",
                        command
                    );
                }
            }
        }
        for key in finished {
            self.groups.remove(&key);
        }
        Ok(())
    }
}
