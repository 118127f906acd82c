//! Events and the read-only views (describe, list, fences, stats, what a new leader re-arms).

use super::*;

// ------------------------------------------------------------------ events

#[test]
fn events_carry_the_right_fields() {
    let mut t = LockTable::new();
    let r = t.apply(10, open_cmd(2_000, 700, 0));
    assert_eq!(
        r.events,
        vec![Event::SessionOpened {
            session: SessionId(10),
            ttl_ms: 2_000,
            end_on_disconnect_ms: 0,
        }]
    );
    let a = SessionId(10);
    t.apply(11, open_cmd(3_000, 0, 0));
    let b = SessionId(11);
    let r = t.apply(12, acq_value(a, 5, "x", X, WAIT, b"leader-a".to_vec()));
    assert_eq!(r.reply, granted_reply(Fence(1), X, 12));
    assert_eq!(
        r.events,
        vec![Event::Granted {
            name: name("x"),
            session: a,
            seq: 5,
            fence: Fence(1),
            mode: X
        }]
    );
    assert_eq!(r.events[0].name(), Some(&name("x")));
    let r = t.apply(13, acq(b, 6, "x", SH, 1_234));
    assert_eq!(
        r.events,
        vec![Event::Queued {
            name: name("x"),
            session: b,
            seq: 6,
            mode: SH,
            timeout_ms: 1_234
        }]
    );
    let r = t.apply(14, acq(b, 7, "y", X, WAIT_FOREVER));
    assert_eq!(r.reply, granted_reply(Fence(2), X, 14));
    let r = t.apply(15, Command::ExpireSession { session: a });
    assert_eq!(
        r.events,
        vec![
            Event::Ended {
                name: name("x"),
                session: a,
                fence: Fence(1),
                mode: X,
                cause: EndCause::SessionExpired
            },
            Event::LockDelayStarted {
                name: name("x"),
                delay_ms: 700,
                since: 15
            },
            Event::SessionEnded {
                session: a,
                expired: true
            },
        ]
    );
    assert_eq!(r.events[2].name(), None);
    let r = t.apply(16, end_delay("x", 15));
    assert_eq!(
        r.events,
        vec![
            Event::LockDelayEnded { name: name("x") },
            Event::Granted {
                name: name("x"),
                session: b,
                seq: 6,
                fence: Fence(3),
                mode: SH
            },
        ]
    );
    // The settled grant carries the index that made it.
    assert_eq!(
        t.apply(17, acq(b, 6, "x", SH, 1_234)).reply,
        granted_reply(Fence(3), SH, 16)
    );
    t.apply(18, open_cmd(2_000, 0, 0));
    let c = SessionId(18);
    let r = t.apply(19, acq(c, 1, "y", X, WAIT_FOREVER));
    assert_eq!(
        r.events,
        vec![Event::Queued {
            name: name("y"),
            session: c,
            seq: 1,
            mode: X,
            timeout_ms: WAIT_FOREVER
        }]
    );
    let r = t.apply(20, rel(b, 8, "y", Fence(2)));
    assert_eq!(
        r.events,
        vec![
            Event::Ended {
                name: name("y"),
                session: b,
                fence: Fence(2),
                mode: X,
                cause: EndCause::Released
            },
            Event::Granted {
                name: name("y"),
                session: c,
                seq: 1,
                fence: Fence(4),
                mode: X
            },
        ]
    );
    let r = t.apply(21, acq(c, 2, "x", X, 50));
    assert_eq!(r.reply, Reply::Acquire(Acquired::Queued));
    let r = t.apply(22, cancel(c, "x", 2));
    assert_eq!(
        r.events,
        vec![Event::Cancelled {
            name: name("x"),
            session: c,
            seq: 2,
            mode: X,
            cause: CancelCause::TimedOut
        }]
    );
    t.check_invariants().unwrap();
}

// ------------------------------------------------------------------- views

#[test]
fn describe_shows_holders_waiters_capacity_and_delay() {
    let mut h = Harness::new();
    let [a, b, c] = [(); 3].map(|_| h.open());
    let seq_a = h.next_seq();
    let fa = fence_of(&h.apply(acq_value(a, seq_a, "x", SH, WAIT, b"va".to_vec())));
    let ia = h.index;
    let seq_b = h.next_seq();
    let fb = fence_of(&h.apply(acq_value(b, seq_b, "x", SH, WAIT, b"vb".to_vec())));
    let ib = h.index;
    let seq_c = h.next_seq();
    h.apply(acq_value(c, seq_c, "x", X, 1_234, b"vc".to_vec()));
    let ic = h.index;
    assert_eq!(
        h.table.describe(&name("x")),
        Some(LockInfo {
            name: name("x"),
            capacity: None,
            holders: vec![
                HolderInfo {
                    session: a,
                    fence: fa,
                    mode: SH,
                    value: b"va".to_vec(),
                    index: ia
                },
                HolderInfo {
                    session: b,
                    fence: fb,
                    mode: SH,
                    value: b"vb".to_vec(),
                    index: ib
                },
            ],
            waiters: vec![WaitInfo {
                session: c,
                name: name("x"),
                seq: seq_c,
                mode: X,
                timeout_ms: 1_234,
                index: ic
            }],
            lock_delayed: false,
        })
    );
    assert_eq!(h.table.describe(&name("nothing")), None);
    h.grant(a, "s", sem(2, 5));
    let info = h.table.describe(&name("s")).unwrap();
    assert_eq!(info.capacity, Some(5));
    assert_eq!(info.holders[0].mode, sem(2, 5));
}

#[test]
fn list_filters_by_prefix_and_pages() {
    let mut h = Harness::new();
    let a = h.open();
    for n in ["b/1", "a/2", "ab", "a/1", "a/3", "a"] {
        h.grant(a, n, X);
    }
    let names = |infos: Vec<LockInfo>| -> Vec<String> {
        infos
            .into_iter()
            .map(|i| i.name.as_str().to_string())
            .collect()
    };
    let t = &h.table;
    assert_eq!(names(t.list("a/", None, 10)), ["a/1", "a/2", "a/3"]);
    assert_eq!(names(t.list("a/", None, 2)), ["a/1", "a/2"]);
    assert_eq!(names(t.list("a/", Some("a/1"), 10)), ["a/2", "a/3"]);
    assert_eq!(names(t.list("a/", Some("a/2"), 1)), ["a/3"]);
    assert_eq!(names(t.list("a/", Some("a/3"), 10)), Vec::<String>::new());
    assert_eq!(names(t.list("a/", Some("a/"), 10)), ["a/1", "a/2", "a/3"]);
    // A cursor before the prefix starts at the prefix; one after it ends.
    assert_eq!(names(t.list("a/", Some("0"), 10)), ["a/1", "a/2", "a/3"]);
    assert_eq!(names(t.list("a/", Some("b"), 10)), Vec::<String>::new());
    assert_eq!(
        names(t.list("a", None, 10)),
        ["a", "a/1", "a/2", "a/3", "ab"]
    );
    assert_eq!(names(t.list("c", None, 10)), Vec::<String>::new());
    assert_eq!(names(t.list("", None, 0)), Vec::<String>::new());
    // Paging through everything visits each name once, in order.
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = names(t.list("", after.as_deref(), 2));
        if page.is_empty() {
            break;
        }
        after = page.last().cloned();
        all.extend(page);
    }
    assert_eq!(all, ["a", "a/1", "a/2", "a/3", "ab", "b/1"]);
    // Entries carry full state.
    assert_eq!(t.list("b/", None, 1)[0], t.describe(&name("b/1")).unwrap());
}

#[test]
fn check_fence_answers_for_current_holders_only() {
    let mut h = Harness::new();
    let [a, b] = [(); 2].map(|_| h.open());
    let fa = h.grant(a, "x", SH);
    let fb = h.grant(b, "x", SH);
    let x = name("x");
    assert_eq!(h.table.check_fence(&x, fa), (true, Some(fb)));
    assert_eq!(h.table.check_fence(&x, fb), (true, Some(fb)));
    assert_eq!(h.table.check_fence(&x, Fence(fb.0 + 1)), (false, Some(fb)));
    h.released(b, "x", fb);
    assert_eq!(h.table.check_fence(&x, fb), (false, Some(fa)));
    assert_eq!(h.table.check_fence(&x, fa), (true, Some(fa)));
    h.released(a, "x", fa);
    assert_eq!(h.table.check_fence(&x, fa), (false, None));
    assert_eq!(h.table.check_fence(&name("never"), Fence(1)), (false, None));
}

#[test]
fn stats_count_everything() {
    let mut h = Harness::new();
    assert_eq!(h.table.stats(), Stats::default());
    let [a, b, c, d] = [(); 4].map(|_| h.open());
    h.grant(a, "x", SH);
    h.grant(b, "x", SH);
    h.queue(c, "x", X);
    h.grant(c, "s", sem(1, 2));
    h.queue(d, "s", sem(2, 2));
    assert_eq!(
        h.table.stats(),
        Stats {
            sessions: 4,
            names: 2,
            grants: 3,
            waiters: 2,
            last_fence: 3
        }
    );
}

#[test]
fn waits_delays_and_sessions_list_what_a_new_leader_must_rearm() {
    let mut h = Harness::new();
    let a = h.open_with(4_000, 0);
    let b = h.open_with(5_000, 300);
    let c = h.open_with(6_000, 0);
    h.grant(a, "x", X);
    h.grant(b, "y", X);
    h.grant(b, "z", X);
    let s1 = h.next_seq();
    h.apply(acq(c, s1, "x", SH, 1_000));
    let i1 = h.index;
    let s2 = h.next_seq();
    h.apply(acq(c, s2, "y", X, WAIT_FOREVER));
    let i2 = h.index;
    let waits: Vec<_> = h.table.waits().collect();
    assert_eq!(
        waits,
        vec![
            WaitInfo {
                session: c,
                name: name("x"),
                seq: s1,
                mode: SH,
                timeout_ms: 1_000,
                index: i1
            },
            WaitInfo {
                session: c,
                name: name("y"),
                seq: s2,
                mode: X,
                timeout_ms: WAIT_FOREVER,
                index: i2
            },
        ]
    );
    let sessions: Vec<_> = h.table.sessions().collect();
    assert_eq!(
        sessions,
        vec![
            SessionInfo {
                session: a,
                ttl_ms: 4_000,
                lock_delay_ms: 0,
                end_on_disconnect_ms: 0,
            },
            SessionInfo {
                session: b,
                ttl_ms: 5_000,
                lock_delay_ms: 300,
                end_on_disconnect_ms: 0,
            },
            SessionInfo {
                session: c,
                ttl_ms: 6_000,
                lock_delay_ms: 0,
                end_on_disconnect_ms: 0,
            },
        ]
    );
    assert_eq!(h.table.delays().count(), 0);
    h.apply(Command::ExpireSession { session: b });
    let since = h.index;
    let delays: Vec<_> = h
        .table
        .delays()
        .map(|(n, s, d)| (n.clone(), s, d))
        .collect();
    assert_eq!(
        delays,
        vec![(name("y"), since, 300), (name("z"), since, 300)]
    );
    let sessions: Vec<_> = h.table.sessions().map(|s| s.session).collect();
    assert_eq!(sessions, vec![a, c]);
    assert_eq!(h.table.session(b), None);
}
