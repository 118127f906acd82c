//! Repeated log lines, at most one per key per interval, with a count of
//! those held back: a peer that keeps sending what this node refuses must
//! not fill the log (on 6bd3e3c a node of another cluster caused 38,657
//! ERROR lines in about 10 s).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Most keys a [`Throttle`] remembers; past it, it forgets them all (the
/// next line of each is then let through at once).
pub const MAX_KEYS: usize = 1024;

/// Lets a line through once per `every` for each key.
#[derive(Debug)]
pub struct Throttle<K> {
    every: Duration,
    seen: Mutex<BTreeMap<K, (Instant, u64)>>,
}

impl<K: Ord> Throttle<K> {
    /// A throttle that lets one line per key through every `every`.
    pub fn new(every: Duration) -> Self {
        Throttle {
            every,
            seen: Mutex::new(BTreeMap::new()),
        }
    }

    /// `Some(held_back)` if a line for `key` may be logged now (`held_back`
    /// lines for it were not, since the last one that was); `None` if not.
    pub fn pass(&self, key: K) -> Option<u64> {
        self.pass_at(key, Instant::now())
    }

    fn pass_at(&self, key: K, now: Instant) -> Option<u64> {
        let mut seen = self.seen.lock().expect("throttle lock poisoned");
        if seen.len() >= MAX_KEYS && !seen.contains_key(&key) {
            seen.clear();
        }
        match seen.get_mut(&key) {
            Some((at, held)) if now.duration_since(*at) < self.every => {
                *held += 1;
                None
            }
            Some((at, held)) => {
                *at = now;
                Some(std::mem::take(held))
            }
            None => {
                seen.insert(key, (now, 0));
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_key_per_interval_with_the_count_held_back() {
        let t = Throttle::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(t.pass_at("a", t0), Some(0));
        assert_eq!(t.pass_at("a", t0 + Duration::from_secs(1)), None);
        assert_eq!(t.pass_at("a", t0 + Duration::from_secs(9)), None);
        assert_eq!(t.pass_at("b", t0), Some(0), "keys are independent");
        assert_eq!(t.pass_at("a", t0 + Duration::from_secs(10)), Some(2));
        assert_eq!(t.pass_at("a", t0 + Duration::from_secs(11)), None);
    }

    #[test]
    fn the_memory_is_bounded() {
        let t = Throttle::new(Duration::from_secs(10));
        let t0 = Instant::now();
        for k in 0..MAX_KEYS {
            assert_eq!(t.pass_at(k, t0), Some(0));
        }
        assert_eq!(t.pass_at(0, t0), None);
        assert_eq!(t.pass_at(MAX_KEYS, t0), Some(0), "a new key past the cap");
        assert!(t.seen.lock().unwrap().len() <= MAX_KEYS);
        assert_eq!(t.pass_at(0, t0), Some(0), "forgotten, so let through");
    }
}
