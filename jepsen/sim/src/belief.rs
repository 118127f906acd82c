//! The belief oracle (docs/concepts/sessions-and-leases.md, "The lease rule"): while a client that
//! follows the duties believes it holds a grant, nobody else holds it.
//!
//! Every client of a run records, for every grant it was given, the span
//! of simulated time during which it believed it held it, counted exactly
//! as the duties say (from the answer that granted it until it sent its
//! release, was told its session was gone, or its lease count ran out).
//! The driver records when each grant was first seen applied on any node
//! (a committed grant). Two checks, both pure:
//!
//! * two beliefs on one name, by different sessions and in modes that
//!   conflict, never overlap;
//! * no belief outlives the moment the cluster granted its name to another
//!   session in a conflicting mode (a later fence first seen applied
//!   before the belief ended), nor, for a read believed again after its
//!   upgrade was withdrawn ([`AFTER_WITHDRAWN_UPGRADE`]), the moment the
//!   cluster granted that upgrade (which ended the read).
//!
//! Times are simulated microseconds since the start of the run.

use std::collections::BTreeMap;

/// How a grant is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Held {
    /// Alone.
    Exclusive,
    /// Beside other shared holders.
    Shared,
}

impl Held {
    fn conflicts(self, other: Held) -> bool {
        self == Held::Exclusive || other == Held::Exclusive
    }
}

/// One span during which a client believed it held a grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Belief {
    /// Who believed (for the report).
    pub client: String,
    /// The path that gave and kept the grant (for the report).
    pub path: String,
    /// The name.
    pub name: String,
    /// The holding session.
    pub session: u64,
    /// The grant's fence.
    pub fence: u64,
    /// The mode believed.
    pub held: Held,
    /// From the answer that granted it...
    pub from: u64,
    /// ... until this moment (exclusive).
    pub until: u64,
}

/// The path of a shared grant believed again after an upgrade of it of
/// unknown outcome was withdrawn (`Cancel`): if that upgrade had been
/// granted, the read ended with it, so its own session's later exclusive
/// grant of the name ends this belief too.
pub const AFTER_WITHDRAWN_UPGRADE: &str = "Rust client, read after a withdrawn upgrade";

/// A grant as the cluster made it: first seen applied on any node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Granted {
    /// The holding session.
    pub session: u64,
    /// How it is held.
    pub held: Held,
    /// When the driver first saw it applied.
    pub seen: u64,
}

/// Every grant the driver saw, by name and fence.
pub type Grants = BTreeMap<(String, u64), Granted>;

/// No two conflicting beliefs of different sessions on one name overlap.
pub fn no_overlap(beliefs: &[Belief]) -> Result<(), String> {
    let mut by_name: BTreeMap<&str, Vec<&Belief>> = BTreeMap::new();
    for b in beliefs.iter().filter(|b| b.from < b.until) {
        by_name.entry(&b.name).or_default().push(b);
    }
    for list in by_name.values_mut() {
        list.sort_by_key(|b| (b.from, b.until));
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                if b.from >= a.until {
                    break;
                }
                if a.session != b.session && a.held.conflicts(b.held) {
                    return Err(format!(
                        "beliefs overlap on {:?}: {} ({}) believed fence {} of session {} over \
                         {}..{} us while {} ({}) believed fence {} of session {} from {} us",
                        a.name,
                        a.client,
                        a.path,
                        a.fence,
                        a.session,
                        a.from,
                        a.until,
                        b.client,
                        b.path,
                        b.fence,
                        b.session,
                        b.from
                    ));
                }
            }
        }
    }
    Ok(())
}

/// No belief runs past the moment the cluster granted its name to another
/// session in a conflicting mode (or, for [`AFTER_WITHDRAWN_UPGRADE`], to
/// any session: its own upgrade ended the read).
pub fn none_past_a_grant(beliefs: &[Belief], grants: &Grants) -> Result<(), String> {
    for b in beliefs.iter().filter(|b| b.from < b.until) {
        let later = grants.range((b.name.clone(), b.fence + 1)..=(b.name.clone(), u64::MAX));
        for ((_, fence), g) in later {
            let other = g.session != b.session || b.path == AFTER_WITHDRAWN_UPGRADE;
            if other && g.held.conflicts(b.held) && g.seen < b.until {
                return Err(format!(
                    "{} ({}) believed fence {} of session {} on {:?} until {} us, but the \
                     cluster had granted it to session {} with fence {} by {} us",
                    b.client, b.path, b.fence, b.session, b.name, b.until, g.session, fence, g.seen
                ));
            }
        }
    }
    Ok(())
}

/// A client's lease count, kept as the duties say: the latest
/// `send + length - margin` over the lease-starting answers.
#[derive(Clone, Debug, Default)]
pub struct Count {
    /// The end of the count (0: nothing counted yet).
    pub until: u64,
}

impl Count {
    /// A lease-starting answer to a request sent at `sent`, for a lease of
    /// `length_us` with `margin` (a fraction) left out.
    pub fn answered(&mut self, sent: u64, length_us: u64, margin: f64) {
        let counted = length_us - (length_us as f64 * margin) as u64;
        self.until = self.until.max(sent + counted);
    }

    /// A `SetSessionTtl` to a shorter ttl sent at `sent`: the count ends
    /// at `sent + length_us` at the latest (docs/concepts/sessions-and-leases.md, "The lease rule").
    pub fn cut(&mut self, sent: u64, length_us: u64) {
        self.until = self.until.min(sent + length_us);
    }

    /// Whether the count still runs at `now`.
    pub fn runs(&self, now: u64) -> bool {
        now < self.until
    }
}

/// The length a client counts for a session with `ttl_ms` that ends with
/// its process after `grace_ms` (0: it does not), in microseconds.
pub fn counted_length_us(ttl_ms: u64, grace_ms: u64) -> u64 {
    let ms = if grace_ms > 0 {
        ttl_ms.min(grace_ms)
    } else {
        ttl_ms
    };
    ms * 1_000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn belief(session: u64, fence: u64, held: Held, from: u64, until: u64) -> Belief {
        Belief {
            client: format!("c{session}"),
            path: "test".into(),
            name: "x".into(),
            session,
            fence,
            held,
            from,
            until,
        }
    }

    #[test]
    fn overlapping_conflicting_beliefs_are_caught() {
        let a = belief(1, 1, Held::Exclusive, 0, 100);
        let b = belief(2, 2, Held::Exclusive, 100, 200);
        assert_eq!(no_overlap(&[a.clone(), b.clone()]), Ok(()));
        let early = belief(2, 2, Held::Exclusive, 99, 200);
        assert!(no_overlap(&[a.clone(), early]).is_err());
        // Shared beside shared is fine; shared beside exclusive is not.
        let s1 = belief(1, 1, Held::Shared, 0, 100);
        let s2 = belief(2, 2, Held::Shared, 50, 150);
        assert_eq!(no_overlap(&[s1.clone(), s2]), Ok(()));
        let x = belief(3, 3, Held::Exclusive, 50, 150);
        assert!(no_overlap(&[s1, x]).is_err());
        // One session's own grants (an upgrade) never conflict.
        let up = belief(1, 5, Held::Exclusive, 50, 150);
        assert_eq!(no_overlap(&[a, up]), Ok(()));
    }

    #[test]
    fn a_belief_past_a_grant_to_another_is_caught() {
        let a = belief(1, 1, Held::Exclusive, 0, 100);
        let mut grants = Grants::new();
        grants.insert(
            ("x".into(), 2),
            Granted {
                session: 2,
                held: Held::Exclusive,
                seen: 100,
            },
        );
        assert_eq!(none_past_a_grant(std::slice::from_ref(&a), &grants), Ok(()));
        grants.insert(
            ("x".into(), 3),
            Granted {
                session: 3,
                held: Held::Exclusive,
                seen: 99,
            },
        );
        assert!(none_past_a_grant(std::slice::from_ref(&a), &grants).is_err());
        // An earlier fence, or the same session's, is not "another's".
        let mut grants = Grants::new();
        grants.insert(
            ("x".into(), 5),
            Granted {
                session: 1,
                held: Held::Exclusive,
                seen: 50,
            },
        );
        assert_eq!(none_past_a_grant(&[a], &grants), Ok(()));
    }

    #[test]
    fn a_read_believed_after_its_granted_upgrade_is_caught() {
        let mut read = belief(1, 4, Held::Shared, 200, 300);
        read.path = AFTER_WITHDRAWN_UPGRADE.into();
        let upgrade = |seen| {
            Grants::from([(
                ("x".into(), 5),
                Granted {
                    session: 1,
                    held: Held::Exclusive,
                    seen,
                },
            )])
        };
        // The upgrade was granted (and then cancelled): the read ended.
        assert!(none_past_a_grant(std::slice::from_ref(&read), &upgrade(150)).is_err());
        // An exclusive grant of the session after the belief is another
        // lock, taken once the read was released.
        assert_eq!(
            none_past_a_grant(std::slice::from_ref(&read), &upgrade(300)),
            Ok(())
        );
        // Other paths' reads run until their upgrade is answered.
        let mut shared = read.clone();
        shared.path = "Rust client, shared".into();
        assert_eq!(none_past_a_grant(&[shared], &upgrade(150)), Ok(()));
    }

    #[test]
    fn counts_take_the_latest_answer_and_the_grace() {
        let mut c = Count::default();
        c.answered(1_000, 10_000, 0.1);
        assert_eq!(c.until, 10_000);
        c.answered(500, 10_000, 0.1);
        assert_eq!(c.until, 10_000, "an earlier send never shortens it");
        assert!(c.runs(9_999) && !c.runs(10_000));
        assert_eq!(counted_length_us(30_000, 1_000), 1_000_000);
        assert_eq!(counted_length_us(2_000, 0), 2_000_000);
    }
}
