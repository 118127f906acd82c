//! The one source of this crate's random choices (ids, nonces, jitter).
//!
//! By default every draw comes from the thread's OS-seeded generator, as
//! `rand::random` does. A deterministic simulator calls [`seed`] on the
//! thread it runs the whole cluster on: from then on every draw on that
//! thread comes, in order, from one generator seeded with that value, so
//! a run is decided by its seed. (Per thread, so that tests running side
//! by side never draw from each other's sequence.)

use std::cell::RefCell;

use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng as _};

thread_local! {
    /// This thread's seeded generator, once [`seed`] was called on it.
    static SEEDED: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// Makes every later draw on this thread come from a generator seeded
/// with `seed` (for simulators; production never calls it).
pub fn seed(seed: u64) {
    SEEDED.with(|s| *s.borrow_mut() = Some(StdRng::seed_from_u64(seed)));
}

/// Back to the OS-seeded generator on this thread.
pub fn unseed() {
    SEEDED.with(|s| *s.borrow_mut() = None);
}

/// A uniformly random `u64`.
pub fn next_u64() -> u64 {
    SEEDED.with(|s| match s.borrow_mut().as_mut() {
        Some(rng) => rng.random(),
        None => rand::random(),
    })
}

/// A uniformly random float in `low..high` (`low < high`).
pub fn in_range(low: f64, high: f64) -> f64 {
    SEEDED.with(|s| match s.borrow_mut().as_mut() {
        Some(rng) => rng.random_range(low..high),
        None => rand::rng().random_range(low..high),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After `seed`, the draws are a function of the seed alone; the range
    /// is kept; `unseed` goes back to OS randomness.
    #[test]
    fn seeded_draws_repeat() {
        seed(7);
        let a: Vec<u64> = (0..4).map(|_| next_u64()).collect();
        let x = in_range(0.5, 1.5);
        seed(7);
        let b: Vec<u64> = (0..4).map(|_| next_u64()).collect();
        assert_eq!(a, b);
        assert_eq!(x, in_range(0.5, 1.5));
        assert!((0.5..1.5).contains(&x));
        seed(8);
        assert_ne!(a[0], next_u64(), "another seed, other draws");
        unseed();
        seed(7);
        let _ = next_u64();
        unseed();
        assert_ne!(next_u64(), a[1], "unseeded: not the seeded sequence");
    }
}
