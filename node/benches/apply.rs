//! Apply throughput of the pure lock table (one core, no I/O).
//!
//! `cargo bench -p raftlock-node --bench apply`. Each benchmark reports
//! commands applied per second; the target is ≥ 1,000,000/s on one core.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput};
use raftlock_node::state::{
    cmd, Acquired, Command, Fence, LockName, LockTable, Mode, Reply, SessionId,
};

const NAMES: usize = 10_000;
const SESSIONS: u64 = 100;
const BATCH: usize = 10_000;

/// A table with `SESSIONS` open sessions (ids 1..=SESSIONS) and the next
/// free log index.
fn table_with_sessions() -> (LockTable, u64) {
    let mut table = LockTable::new();
    for i in 1..=SESSIONS {
        table.apply(
            i,
            Command::OpenSessionV0(cmd::OpenSessionV0 {
                ttl_ms: 10_000,
                lock_delay_ms: 0,
                nonce: 0,
                owner: String::new(),
            }),
        );
    }
    (table, SESSIONS + 1)
}

fn acquire(session: u64, seq: u64, name: String, mode: Mode, timeout_ms: u64) -> Command {
    Command::Acquire(cmd::Acquire {
        session: SessionId(session),
        seq,
        name: LockName::new(name).expect("valid name"),
        mode,
        timeout_ms,
        value: Vec::new(),
        caller: String::new(),
    })
}

fn fence_of(reply: &Reply) -> Option<Fence> {
    match reply {
        Reply::Acquire(Acquired::Granted { fence, .. }) => Some(*fence),
        _ => None,
    }
}

fn uncontended(c: &mut Criterion) {
    let names: Vec<String> = (0..NAMES).map(|i| format!("jobs/{i:05}")).collect();
    let mut group = c.benchmark_group("apply");
    group.throughput(Throughput::Elements(2 * BATCH as u64));
    group.bench_function("uncontended acquire+release, 10k names", |b| {
        b.iter_batched_ref(
            table_with_sessions,
            |(table, index)| {
                for i in 0..BATCH {
                    let session = 1 + (i as u64 % SESSIONS);
                    let seq = *index;
                    let name = &names[i % NAMES];
                    let r = table.apply(
                        *index,
                        acquire(session, seq, name.clone(), Mode::Exclusive, 0),
                    );
                    *index += 1;
                    let fence = fence_of(&r.reply).expect("uncontended acquire is granted");
                    let r = table.apply(
                        *index,
                        Command::Release(cmd::Release {
                            session: SessionId(session),
                            seq: seq + 1,
                            name: LockName::new(name.clone()).expect("valid name"),
                            fence,
                            caller: String::new(),
                        }),
                    );
                    *index += 1;
                    black_box(r);
                }
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

/// All sessions queue on one name; each release hands it to the next.
fn contended(c: &mut Criterion) {
    let mut group = c.benchmark_group("apply");
    group.throughput(Throughput::Elements(2 * BATCH as u64));
    group.bench_function("contended hand-off, 1 name, 100 sessions", |b| {
        b.iter_batched_ref(
            || {
                let (mut table, mut index) = table_with_sessions();
                let mut holder = None;
                for s in 1..=SESSIONS {
                    let r = table.apply(
                        index,
                        acquire(s, index, "hot".into(), Mode::Exclusive, u64::MAX),
                    );
                    if let Some(f) = fence_of(&r.reply) {
                        holder = Some((s, f));
                    }
                    index += 1;
                }
                (table, index, holder.expect("first acquire granted"))
            },
            |(table, index, holder)| {
                for _ in 0..BATCH {
                    let (s, fence) = *holder;
                    let r = table.apply(
                        *index,
                        Command::Release(cmd::Release {
                            session: SessionId(s),
                            seq: *index,
                            name: LockName::new("hot").expect("valid name"),
                            fence,
                            caller: String::new(),
                        }),
                    );
                    *index += 1;
                    // The next in line got it; the releaser queues again.
                    let next = r
                        .events
                        .iter()
                        .find_map(|e| match e {
                            raftlock_node::state::Event::Granted { session, fence, .. } => {
                                Some((session.0, *fence))
                            }
                            _ => None,
                        })
                        .expect("hand-off grants the next waiter");
                    let r = table.apply(
                        *index,
                        acquire(s, *index, "hot".into(), Mode::Exclusive, u64::MAX),
                    );
                    *index += 1;
                    black_box(r);
                    *holder = next;
                }
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

/// Weights 1..=4 on a semaphore of capacity 8, sessions taking and giving
/// back permits round-robin, so some requests queue.
fn semaphore(c: &mut Criterion) {
    let mut group = c.benchmark_group("apply");
    group.throughput(Throughput::Elements(2 * BATCH as u64));
    group.bench_function("semaphore permits, capacity 8", |b| {
        b.iter_batched_ref(
            table_with_sessions,
            |(table, index)| {
                let mut held: std::collections::VecDeque<(u64, Fence)> = Default::default();
                for i in 0..BATCH {
                    let s = 1 + (i as u64 % SESSIONS);
                    let weight = 1 + (i as u32 % 4);
                    let mode = Mode::Semaphore {
                        weight,
                        capacity: 8,
                    };
                    let r = table.apply(*index, acquire(s, *index, "pool".into(), mode, 0));
                    *index += 1;
                    if let Some(f) = fence_of(&r.reply) {
                        held.push_back((s, f));
                    }
                    if held.len() > 2 || fence_of(&r.reply).is_none() {
                        if let Some((s, fence)) = held.pop_front() {
                            let r = table.apply(
                                *index,
                                Command::Release(cmd::Release {
                                    session: SessionId(s),
                                    seq: *index,
                                    name: LockName::new("pool").expect("valid name"),
                                    fence,
                                    caller: String::new(),
                                }),
                            );
                            *index += 1;
                            black_box(r);
                        }
                    }
                }
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    uncontended(&mut c);
    contended(&mut c);
    semaphore(&mut c);
    c.final_summary();
}
