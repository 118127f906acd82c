//! The partition variants: which directions a partition of the members
//! cuts.

use rand::rngs::StdRng;
use rand::RngExt;

use crate::proxy::Link;

/// The directions to cut for a partition variant over `members` (shuffled).
pub fn partition_links(variant: &str, members: &[u64], leader: u64, rng: &mut StdRng) -> Vec<Link> {
    let both = |a: &[u64], b: &[u64]| -> Vec<Link> {
        let mut out = Vec::new();
        for &x in a {
            for &y in b {
                if x != y {
                    out.push((x, y));
                    out.push((y, x));
                }
            }
        }
        out
    };
    match variant {
        "halves" => {
            let (a, b) = members.split_at(members.len() / 2);
            both(a, b)
        }
        "isolate-leader" => {
            let rest: Vec<u64> = members.iter().copied().filter(|&m| m != leader).collect();
            both(&[leader], &rest)
        }
        "bridge" => {
            // Two halves that only one node (the bridge) can reach both of.
            let n = members.len();
            let bridge = n / 2;
            let (a, b) = (&members[..bridge], &members[bridge + 1..]);
            both(a, b)
        }
        "ring" => {
            // Each node sees its nearest ring neighbours: with five, itself
            // and one on each side, a majority, but no two the same one.
            let n = members.len();
            let reach = (n / 4).max(1);
            let mut out = Vec::new();
            for i in 0..n {
                for j in 0..n {
                    let d = (i + n - j) % n;
                    let d = d.min(n - d);
                    if i != j && d > reach {
                        out.push((members[i], members[j]));
                    }
                }
            }
            out
        }
        _ => {
            // one-way: the leader can hear but not be heard, or the reverse.
            let rest: Vec<u64> = members.iter().copied().filter(|&m| m != leader).collect();
            if rng.random_bool(0.5) {
                rest.iter().map(|&r| (leader, r)).collect()
            } else {
                rest.iter().map(|&r| (r, leader)).collect()
            }
        }
    }
}
