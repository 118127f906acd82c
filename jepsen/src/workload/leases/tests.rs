//! Unit tests of the lease paths and the belief count.

use super::holding::Holding;
use super::{LeasePath, ALL_PATHS};
use crate::beliefs::Held;

#[test]
fn paths_parse_and_all_means_every_one() {
    assert_eq!(
        LeasePath::parse_list("all").expect("parses"),
        ALL_PATHS.to_vec()
    );
    assert_eq!(
        LeasePath::parse_list("retry, ttl-end,retry").expect("parses"),
        vec![LeasePath::TtlEnd, LeasePath::Retry]
    );
    assert!(LeasePath::parse_list("retries").is_err());
    assert!(LeasePath::parse_list("").is_err());
}

fn holding(sent: u64, len: u64, now: u64) -> Option<Holding> {
    Holding::new("t", "x", Held::Exclusive, 1, 2, 0, sent, len, now)
}

#[test]
fn a_count_runs_from_the_send_and_is_restored_from_the_answer() {
    assert!(
        holding(0, 100, 100).is_none(),
        "answered as the count ran out"
    );
    let mut h = holding(0, 100, 10).expect("counted");
    assert_eq!((h.since, h.until), (10, 100));
    // A renewal sent earlier than the last never shortens the count.
    h.answered(50, 100, 60);
    h.answered(20, 100, 70);
    assert_eq!(h.until, 150);
    // Answered after the count ran out: restored from its arrival.
    h.answered(140, 100, 160);
    assert_eq!(h.lapsed, vec![(10, 150)]);
    assert_eq!((h.since, h.until), (160, 240));
    // An answer whose count had run out when it came restores nothing.
    h.answered(100, 100, 250);
    assert_eq!((h.since, h.until), (160, 240));
}
