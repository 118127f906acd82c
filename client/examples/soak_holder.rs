//! Lock holders of the Rust client for scripts/soak-clients.sh: HOLDERS
//! tasks share one `Client`, each with a session at the defaults
//! (`SessionOptions::default()`: ttl 10 s, end-on-disconnect grace 750 ms),
//! takes a lock of its own and holds it for DURATION seconds, looking every
//! 100 ms at `Guard::is_held()` and whether the lease is lost. A poll that
//! finds the lock not held (and not lost) starts a jeopardy episode, the
//! next that finds it held ends it. Prints an event line on stderr as it
//! happens and one RESULT line per holder on stdout at the end (the format
//! the Go, Python and PHP holders print).
//!
//! ```sh
//! cargo run -p raftlock-client --example soak_holder -- ENDPOINTS HOLDERS DURATION [PREFIX]
//! ```

use std::time::{Duration, Instant};

use raftlock_client::{Client, LeaseState, SessionOptions};

const POLL: Duration = Duration::from_millis(100);

fn log(what: &str) {
    eprintln!("{:?} {what}", std::time::SystemTime::now());
}

/// What the polls of one holder saw.
#[derive(Default)]
struct Tally {
    lost: bool,
    episodes: u32,
    total: Duration,
    longest: Duration,
    /// Start of the jeopardy episode under way.
    since: Option<Instant>,
}

impl Tally {
    fn observe(&mut self, name: &str, held: bool, lost: bool) {
        let now = Instant::now();
        if lost {
            if !self.lost {
                self.lost = true;
                self.end(now);
                log(&format!("{name} LOST"));
            }
        } else if !held && self.since.is_none() {
            self.since = Some(now);
            self.episodes += 1;
            log(&format!("{name} jeopardy"));
        } else if held && self.since.is_some() {
            let d = self.end(now);
            log(&format!("{name} held again after {:.3} s", d.as_secs_f64()));
        }
    }

    fn end(&mut self, now: Instant) -> Duration {
        let Some(since) = self.since.take() else {
            return Duration::ZERO;
        };
        let d = now - since;
        self.total += d;
        self.longest = self.longest.max(d);
        d
    }

    fn result(&self, name: &str, held_at_end: bool, error: &str) -> String {
        format!(
            "RESULT client=rust name={name} lost={} on_lost={} jeopardy={} jeopardy_total={:.3} \
             jeopardy_longest={:.3} held_at_end={} error={error:?}",
            u8::from(self.lost),
            u8::from(self.lost),
            self.episodes,
            self.total.as_secs_f64(),
            self.longest.as_secs_f64(),
            u8::from(held_at_end),
        )
    }
}

async fn hold(client: Client, name: String, duration: Duration) -> String {
    let mut t = Tally::default();
    let session = match client.session_with(SessionOptions::default()).await {
        Ok(s) => s,
        Err(e) => return t.result(&name, false, &format!("session: {e}")),
    };
    let guard = match tokio::time::timeout(Duration::from_secs(60), session.lock(&name)).await {
        Ok(Ok(g)) => g,
        Ok(Err(e)) => return t.result(&name, false, &format!("lock: {e}")),
        Err(_) => return t.result(&name, false, "lock: not granted within 60 s"),
    };
    let lost = || {
        matches!(
            *session.lease().borrow(),
            LeaseState::Lost | LeaseState::Closed
        )
    };
    let end = Instant::now() + duration;
    while Instant::now() < end {
        tokio::time::sleep(POLL).await;
        t.observe(&name, guard.is_held(), lost());
    }
    // Held at the end: by the client's count (an episode under way may end
    // within 5 s) and the fence current on the cluster.
    let wait = Instant::now() + Duration::from_secs(5);
    while t.since.is_some() && !t.lost && Instant::now() < wait {
        tokio::time::sleep(POLL).await;
        t.observe(&name, guard.is_held(), lost());
    }
    let (held, is_lost) = (guard.is_held(), lost());
    t.observe(&name, held, is_lost);
    t.end(Instant::now());
    let mut error = String::new();
    let current = match client.check_fence(&name, guard.fence()).await {
        Ok(c) => c,
        Err(e) => {
            error = format!("check fence: {e}");
            false
        }
    };
    if error.is_empty() && !current {
        error = "the cluster says the fence is not current".into();
    }
    if let Err(e) = guard.release().await {
        if error.is_empty() {
            error = format!("release: {e}");
        }
    }
    session.close().await.ok();
    t.result(&name, held && !is_lost && current, &error)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [endpoints, holders, duration, rest @ ..] = args.as_slice() else {
        return Err("usage: soak_holder ENDPOINTS HOLDERS DURATION_SECONDS [PREFIX]".into());
    };
    let prefix = rest.first().map_or("soak/rust/", String::as_str);
    let client = Client::connect(endpoints.split(',').map(str::to_string)).await?;
    let duration = Duration::from_secs(duration.parse()?);
    let tasks: Vec<_> = (0..holders.parse::<usize>()?)
        .map(|i| tokio::spawn(hold(client.clone(), format!("{prefix}{i}"), duration)))
        .collect();
    for task in tasks {
        println!("{}", task.await?);
    }
    Ok(())
}
