//! The network between nodes: one TCP proxy per ordered pair of nodes.
//!
//! Node `i` dials node `j` at the proxy for link `i→j` (`raftlockd
//! --dial j=ADDR`), so every byte between nodes passes through here. A
//! direction of a link is *cut* by no longer forwarding the bytes that node
//! `from` sends to node `to`, on every connection whichever side opened it:
//! a gRPC connection opened by `i` carries `i`'s requests (direction `i→j`)
//! and `j`'s responses (direction `j→i`). That makes one-way partitions
//! exact. The ends of a link need not be nodes: the jepsen harness also
//! puts one proxy between every client worker and every node, with the
//! worker as `from`.
//!
//! A direction can be faulted four ways:
//!
//! * **cut** (a black hole, like dropped packets that TCP keeps
//!   retransmitting): bytes already read wait in the proxy and the
//!   sender's socket buffers fill, new connections are accepted but not
//!   connected onward until the direction heals, and when it heals
//!   whatever was held back is delivered (as TCP would retransmit it);
//! * **reset**: every connection crossing the direction is closed with a
//!   RST at once, as a crashed middlebox or a firewall that rejects would
//!   do (given with a cut, or alone with [`Net::reset`]);
//! * **drop**: bytes are read and thrown away, so the other side never
//!   sees them; when the direction heals, every connection crossing it is
//!   reset (a stream that lost bytes has a hole no real TCP connection
//!   would have, so it cannot go on);
//! * **delay**: each chunk is delivered a fixed time plus a random jitter
//!   after it was read, in order (a slow or congested path).
//!
//! A delay is timed by tokio's timer by default, which follows a paused
//! test runtime but rounds every wait up to a whole millisecond. A
//! benchmark that puts a datacenter's round trip (a fraction of a
//! millisecond) on every link builds its [`Net`] with [`Clock::Precise`]
//! instead (`raftlock-bench proxy` does).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// A direction of a link: bytes sent by `.0` to `.1`.
pub type Link = (u64, u64);

/// A delay on a direction: each chunk waits `base` plus a uniformly random
/// part of `jitter`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Delay {
    /// The fixed part.
    pub base: Duration,
    /// The random part's upper bound.
    pub jitter: Duration,
}

/// What times a delayed chunk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Clock {
    /// tokio's timer: it follows a paused runtime, and rounds every wait up
    /// to the next millisecond (fine for the harness's delays of
    /// milliseconds, far too coarse for a delay of 100 µs).
    #[default]
    Tokio,
    /// A Linux timerfd per writer on the OS's monotonic clock, which the
    /// kernel fires without timer slack: a chunk is held back at least its
    /// delay and then only as long as the machine takes to run the writer.
    /// It ignores a paused tokio clock.
    Precise,
}

/// What the proxies obey.
#[derive(Clone, Debug, Default)]
struct NetState {
    /// Directions that hold their bytes.
    cut: BTreeSet<Link>,
    /// Directions that throw their bytes away.
    dropped: BTreeSet<Link>,
    /// Directions that deliver late.
    delays: BTreeMap<Link, Delay>,
    /// Bumped for a direction when its connections must be reset.
    resets: BTreeMap<Link, u64>,
}

impl NetState {
    fn open(&self, l: Link) -> bool {
        !self.cut.contains(&l)
    }

    fn reset_gen(&self, l: Link) -> u64 {
        self.resets.get(&l).copied().unwrap_or(0)
    }

    fn bump_reset(&mut self, l: Link) {
        *self.resets.entry(l).or_insert(0) += 1;
    }
}

/// All the proxies. Dropping it stops them and closes their connections.
pub struct Net {
    state: watch::Sender<NetState>,
    /// What times delayed chunks, for every proxy of this `Net`.
    clock: Clock,
    tasks: JoinSet<()>,
    /// The proxy address for each link.
    addrs: BTreeMap<Link, String>,
}

impl Default for Net {
    fn default() -> Self {
        Self::new()
    }
}

impl Net {
    /// No proxies yet, every direction open; delays timed by tokio.
    pub fn new() -> Net {
        Net::with_clock(Clock::Tokio)
    }

    /// Like [`new`](Self::new), with delays timed by `clock`.
    pub fn with_clock(clock: Clock) -> Net {
        Net {
            state: watch::channel(NetState::default()).0,
            clock,
            tasks: JoinSet::new(),
            addrs: BTreeMap::new(),
        }
    }

    /// Starts the proxy for link `from→to`, forwarding to `target` (node
    /// `to`'s real address); returns the address `from` must dial.
    pub async fn add_proxy(
        &mut self,
        from: u64,
        to: u64,
        target: String,
    ) -> anyhow::Result<String> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        self.add_proxy_on(listener, from, to, target)
    }

    /// Like [`add_proxy`](Self::add_proxy), on a listener the caller bound
    /// (another address, another network namespace).
    pub fn add_proxy_on(
        &mut self,
        listener: TcpListener,
        from: u64,
        to: u64,
        target: String,
    ) -> anyhow::Result<String> {
        let addr = listener.local_addr()?.to_string();
        let rx = self.state.subscribe();
        self.tasks
            .spawn(accept_loop(listener, from, to, target, rx, self.clock));
        self.addrs.insert((from, to), addr.clone());
        Ok(addr)
    }

    /// The proxy address `from` dials for `to`.
    pub fn proxy_addr(&self, from: u64, to: u64) -> Option<&str> {
        self.addrs.get(&(from, to)).map(String::as_str)
    }

    /// Cuts these directions (in addition to those already cut); with
    /// `reset`, connections crossing them are reset too.
    pub fn cut(&self, links: &[Link], reset: bool) {
        self.state.send_modify(|s| {
            for &l in links {
                s.cut.insert(l);
                if reset {
                    s.bump_reset(l);
                }
            }
        });
    }

    /// Resets every connection crossing these directions now, without
    /// cutting them (new connections go through).
    pub fn reset(&self, links: &[Link]) {
        self.state.send_modify(|s| {
            for &l in links {
                s.bump_reset(l);
            }
        });
    }

    /// Throws away the bytes sent in these directions until they heal.
    pub fn drop_bytes(&self, links: &[Link]) {
        self.state
            .send_modify(|s| s.dropped.extend(links.iter().copied()));
    }

    /// Delays the bytes sent in these directions until they heal.
    pub fn delay(&self, links: &[Link], delay: Delay) {
        self.state.send_modify(|s| {
            for &l in links {
                s.delays.insert(l, delay);
            }
        });
    }

    /// Restores every direction: held bytes are delivered, connections
    /// that crossed a dropping direction are reset, delays end.
    pub fn heal(&self) {
        self.state.send_modify(|s| {
            s.cut.clear();
            for l in std::mem::take(&mut s.dropped) {
                s.bump_reset(l);
            }
            s.delays.clear();
        });
    }

    /// The directions cut now.
    pub fn cut_links(&self) -> Vec<Link> {
        self.state.borrow().cut.iter().copied().collect()
    }

    /// Stops every proxy and drops their connections.
    pub fn shutdown(&mut self) {
        self.tasks.abort_all();
    }
}

async fn accept_loop(
    listener: TcpListener,
    from: u64,
    to: u64,
    target: String,
    state: watch::Receiver<NetState>,
    clock: Clock,
) {
    // Connections live in this set, so stopping the accept loop closes them.
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((socket, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                conns.spawn(connection(socket, from, to, target.clone(), state.clone(), clock));
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn connection(
    client: TcpStream,
    from: u64,
    to: u64,
    target: String,
    mut state: watch::Receiver<NetState>,
    clock: Clock,
) {
    let up: Link = (from, to);
    let down: Link = (to, from);
    // A new connection across a cut direction is held, not refused: the
    // dialler sees a black hole.
    if state.wait_for(|s| s.open(up)).await.is_err() {
        return;
    }
    let server =
        match tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(&target)).await {
            Ok(Ok(s)) => s,
            // The target is down: close, as a refused connection would.
            _ => return,
        };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (gen_up, gen_down) = {
        let s = state.borrow();
        (s.reset_gen(up), s.reset_gen(down))
    };
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let reset = {
        let mut st = state.clone();
        async move {
            let _ = st
                .wait_for(|s| s.reset_gen(up) != gen_up || s.reset_gen(down) != gen_down)
                .await;
        }
    };
    let seed = (from << 32) ^ to ^ 0x9e37_79b9_7f4a_7c15;
    let was_reset = tokio::select! {
        _ = async {
            tokio::join!(
                pump(&mut cr, &mut sw, up, state.clone(), seed, clock),
                pump(&mut sr, &mut cw, down, state.clone(), !seed, clock),
            )
        } => false,
        _ = reset => true,
    };
    if was_reset {
        // SO_LINGER 0: closing sends a RST instead of a FIN.
        let _ = cr.as_ref().set_zero_linger();
        let _ = sr.as_ref().set_zero_linger();
    }
}

/// A small xorshift: jitter needs no quality, and the proxy no dependency.
struct Jitter(u64);

impl Jitter {
    fn below(&mut self, max: Duration) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let nanos = max.as_nanos() as u64;
        if nanos == 0 {
            Duration::ZERO
        } else {
            Duration::from_nanos(self.0 % nanos)
        }
    }
}

/// Copies bytes one way while the direction is open: holds them while it
/// is cut, throws them away while it drops, and delivers them late while
/// it is delayed (in order: a writer delivers what the reader queued, one
/// chunk after the other, so a chunk due early never overtakes one read
/// before it). The reader's end of stream becomes the writer's, after the
/// chunks queued before it.
async fn pump(
    reader: &mut OwnedReadHalf,
    writer: &mut OwnedWriteHalf,
    link: Link,
    mut state: watch::Receiver<NetState>,
    seed: u64,
    clock: Clock,
) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(tokio::time::Instant, Vec<u8>)>(256);
    let read = async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut jitter = Jitter(seed | 1);
        loop {
            let n = match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let (dropped, delay) = match state
                .wait_for(|s| s.open(link) || s.dropped.contains(&link))
                .await
            {
                Ok(s) => (
                    s.dropped.contains(&link),
                    s.delays.get(&link).copied().unwrap_or_default(),
                ),
                Err(_) => break,
            };
            if dropped {
                continue;
            }
            let now = match clock {
                Clock::Tokio => tokio::time::Instant::now(),
                Clock::Precise => tokio::time::Instant::from_std(std::time::Instant::now()),
            };
            let at = now + delay.base + jitter.below(delay.jitter);
            if tx.send((at, buf[..n].to_vec())).await.is_err() {
                break;
            }
        }
    };
    let write = async move {
        // Made on the first delayed chunk; if the OS gives no timerfd (out
        // of descriptors), tokio's timer stands in.
        let mut timer: Option<std::io::Result<precise::Timer>> = None;
        while let Some((at, bytes)) = rx.recv().await {
            match clock {
                Clock::Tokio => tokio::time::sleep_until(at).await,
                Clock::Precise if at <= tokio::time::Instant::now() => {}
                Clock::Precise => {
                    let slept = match timer.get_or_insert_with(precise::Timer::new) {
                        Ok(t) => t.sleep_until(at.into_std()).await,
                        Err(_) => Err(std::io::ErrorKind::Unsupported.into()),
                    };
                    if slept.is_err() {
                        tokio::time::sleep_until(at).await;
                    }
                }
            }
            if writer.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = writer.shutdown().await;
    };
    tokio::join!(read, write);
}

/// [`Clock::Precise`]: a Linux timerfd per writer. It expires on the
/// kernel's high-resolution timer with no slack and wakes the tokio worker
/// straight from its `epoll_wait`, so the writer runs as soon as the
/// machine lets it: no timer wheel rounding, no extra thread to hop
/// through.
mod precise {
    use std::io;
    use std::os::fd::{AsFd, AsRawFd, RawFd};
    use std::time::Instant;

    use nix::sys::time::TimeSpec;
    use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
    use tokio::io::unix::AsyncFd;

    /// A timerfd, as tokio's `AsyncFd` wants it.
    struct Fd(TimerFd);

    impl AsRawFd for Fd {
        fn as_raw_fd(&self) -> RawFd {
            self.0.as_fd().as_raw_fd()
        }
    }

    /// One writer's timer.
    pub(super) struct Timer(AsyncFd<Fd>);

    impl Timer {
        pub(super) fn new() -> io::Result<Timer> {
            let fd = TimerFd::new(
                ClockId::CLOCK_MONOTONIC,
                TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
            )?;
            // SAFETY: `Fd` owns the timerfd (an `OwnedFd` inside
            // `TimerFd`) and never replaces it, and the `AsyncFd` owns the
            // `Fd`: the descriptor stays open and the same until the
            // `AsyncFd` is dropped, which deregisters it before closing it.
            #[allow(unsafe_code)]
            let registered =
                unsafe { AsyncFd::register_with_interest(Fd(fd), tokio::io::Interest::READABLE) };
            Ok(Timer(registered?))
        }

        /// Returns once the OS's monotonic clock (std's `Instant`) has
        /// reached `at`.
        pub(super) async fn sleep_until(&mut self, at: Instant) -> io::Result<()> {
            let now = Instant::now();
            if at <= now {
                return Ok(());
            }
            // A relative expiry: std's Instant does not show its raw
            // timespec. Never zero here (zero would disarm the timer).
            let after = TimeSpec::from_duration(at - now);
            self.0
                .get_ref()
                .0
                .set(Expiration::OneShot(after), TimerSetTimeFlags::empty())?;
            loop {
                let mut ready = self.0.readable().await?;
                // Reading the expiry count re-arms readiness; a wake-up
                // before the expiry reads EAGAIN (WouldBlock) and waits on.
                match ready.try_io(|fd| fd.get_ref().0.wait().map_err(io::Error::from)) {
                    Ok(result) => return result,
                    Err(_would_block) => continue,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> String {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if s.write_all(&buf[..n]).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        addr
    }

    async fn roundtrip(s: &mut TcpStream, within: Duration) -> bool {
        if s.write_all(b"ping").await.is_err() {
            return false;
        }
        let mut buf = [0u8; 4];
        matches!(
            tokio::time::timeout(within, s.read_exact(&mut buf)).await,
            Ok(Ok(_))
        )
    }

    #[tokio::test]
    async fn cut_directions_hold_bytes_and_heal_delivers_them() {
        let target = echo_server().await;
        let mut net = Net::new();
        let addr = net.add_proxy(1, 2, target).await.unwrap();
        let mut s = TcpStream::connect(&addr).await.unwrap();
        assert!(roundtrip(&mut s, Duration::from_secs(2)).await);

        // Cutting only the reply direction (2→1) stalls the round trip.
        net.cut(&[(2, 1)], false);
        assert!(!roundtrip(&mut s, Duration::from_millis(200)).await);
        net.heal();
        // The held reply arrives after healing.
        let mut buf = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(2), s.read_exact(&mut buf))
            .await
            .expect("held bytes delivered")
            .unwrap();
        assert!(roundtrip(&mut s, Duration::from_secs(2)).await);
        net.shutdown();
    }

    #[tokio::test]
    async fn reset_cuts_close_connections() {
        let target = echo_server().await;
        let mut net = Net::new();
        let addr = net.add_proxy(1, 2, target).await.unwrap();
        let mut s = TcpStream::connect(&addr).await.unwrap();
        assert!(roundtrip(&mut s, Duration::from_secs(2)).await);
        net.cut(&[(1, 2)], true);
        let mut buf = [0u8; 4];
        let r = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf))
            .await
            .expect("closed promptly");
        assert!(matches!(r, Ok(0) | Err(_)));
        net.heal();
        net.shutdown();
    }

    #[tokio::test]
    async fn a_dropping_direction_loses_bytes_and_heal_resets_its_connections() {
        let target = echo_server().await;
        let mut net = Net::new();
        let addr = net.add_proxy(1, 2, target).await.unwrap();
        let mut s = TcpStream::connect(&addr).await.unwrap();
        assert!(roundtrip(&mut s, Duration::from_secs(2)).await);
        // The replies (2→1) are thrown away: the request arrives, no answer.
        net.drop_bytes(&[(2, 1)]);
        assert!(!roundtrip(&mut s, Duration::from_millis(300)).await);
        net.heal();
        // Nothing held is delivered: the connection is reset instead.
        let mut buf = [0u8; 4];
        let r = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf))
            .await
            .expect("reset promptly");
        assert!(matches!(r, Ok(0) | Err(_)), "got {r:?}");
        // A new connection works again.
        let mut s = TcpStream::connect(&addr).await.unwrap();
        assert!(roundtrip(&mut s, Duration::from_secs(2)).await);
        net.shutdown();
    }

    #[tokio::test]
    async fn a_delayed_direction_delivers_late_and_in_order() {
        let target = echo_server().await;
        let mut net = Net::new();
        let addr = net.add_proxy(1, 2, target).await.unwrap();
        let mut s = TcpStream::connect(&addr).await.unwrap();
        assert!(roundtrip(&mut s, Duration::from_secs(2)).await);
        net.delay(
            &[(1, 2)],
            Delay {
                base: Duration::from_millis(300),
                jitter: Duration::from_millis(100),
            },
        );
        let started = tokio::time::Instant::now();
        s.write_all(b"abcd").await.unwrap();
        s.write_all(b"efgh").await.unwrap();
        let mut buf = [0u8; 8];
        tokio::time::timeout(Duration::from_secs(3), s.read_exact(&mut buf))
            .await
            .expect("delivered")
            .unwrap();
        assert_eq!(&buf, b"abcdefgh", "in order");
        assert!(started.elapsed() >= Duration::from_millis(300));
        net.heal();
        assert!(roundtrip(&mut s, Duration::from_millis(250)).await);
        net.shutdown();
    }

    #[tokio::test]
    async fn a_reset_alone_closes_connections_and_lets_new_ones_in() {
        let target = echo_server().await;
        let mut net = Net::new();
        let addr = net.add_proxy(1, 2, target).await.unwrap();
        let mut s = TcpStream::connect(&addr).await.unwrap();
        assert!(roundtrip(&mut s, Duration::from_secs(2)).await);
        net.reset(&[(1, 2)]);
        let mut buf = [0u8; 4];
        let r = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf))
            .await
            .expect("closed promptly");
        assert!(matches!(r, Ok(0) | Err(_)));
        let mut s = TcpStream::connect(&addr).await.unwrap();
        assert!(roundtrip(&mut s, Duration::from_secs(2)).await);
        net.shutdown();
    }

    /// A server that reads until the client's end of stream, answers with
    /// the number of bytes it read and closes.
    async fn counting_server() -> String {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    if s.read_to_end(&mut got).await.is_ok() {
                        let _ = s.write_all(got.len().to_string().as_bytes()).await;
                    }
                });
            }
        });
        addr
    }

    fn fixed(base: Duration) -> Delay {
        Delay {
            base,
            jitter: Duration::ZERO,
        }
    }

    #[tokio::test]
    async fn many_chunks_keep_their_order_under_a_delay() {
        // With the jitter, chunks read later are often due earlier: only
        // the one writer per direction keeps them from overtaking.
        let cases = [
            (Clock::Precise, fixed(Duration::from_micros(200))),
            (
                Clock::Tokio,
                Delay {
                    base: Duration::from_millis(1),
                    jitter: Duration::from_millis(5),
                },
            ),
        ];
        for (clock, delay) in cases {
            let target = echo_server().await;
            let mut net = Net::with_clock(clock);
            let addr = net.add_proxy(1, 2, target).await.unwrap();
            net.delay(&[(1, 2), (2, 1)], delay);
            let (mut r, mut w) = TcpStream::connect(&addr).await.unwrap().into_split();
            const N: u32 = 3_000;
            let writer = tokio::spawn(async move {
                for i in 0..N {
                    w.write_all(&i.to_be_bytes()).await.unwrap();
                    if i % 8 == 0 {
                        // Let the proxy read what is there: many chunks.
                        tokio::task::yield_now().await;
                    }
                }
                w
            });
            let mut buf = vec![0u8; N as usize * 4];
            tokio::time::timeout(Duration::from_secs(30), r.read_exact(&mut buf))
                .await
                .expect("everything echoed")
                .unwrap();
            for (i, word) in buf.chunks(4).enumerate() {
                let got = u32::from_be_bytes(word.try_into().unwrap());
                assert_eq!(got, i as u32, "{clock:?}: word {i} out of order");
            }
            writer.await.unwrap();
            net.shutdown();
        }
    }

    #[tokio::test]
    async fn a_precise_delay_holds_each_direction_at_least_its_time() {
        let target = echo_server().await;
        let mut net = Net::with_clock(Clock::Precise);
        let addr = net.add_proxy(1, 2, target).await.unwrap();
        let mut s = TcpStream::connect(&addr).await.unwrap();
        assert!(roundtrip(&mut s, Duration::from_secs(5)).await);
        async fn timed(s: &mut TcpStream) -> Duration {
            let started = std::time::Instant::now();
            assert!(roundtrip(s, Duration::from_secs(5)).await);
            started.elapsed()
        }
        // One direction delayed: a round trip takes at least its delay.
        net.delay(&[(1, 2)], fixed(Duration::from_millis(3)));
        for _ in 0..5 {
            let took = timed(&mut s).await;
            assert!(took >= Duration::from_millis(3), "{took:?}");
        }
        // Both: at least twice, also below tokio's millisecond.
        for each_way in [Duration::from_millis(3), Duration::from_micros(150)] {
            net.delay(&[(1, 2), (2, 1)], fixed(each_way));
            for _ in 0..5 {
                let took = timed(&mut s).await;
                assert!(took >= 2 * each_way, "{each_way:?} each way: {took:?}");
            }
        }
        net.shutdown();
    }

    #[tokio::test]
    async fn an_end_of_stream_passes_through_after_the_delayed_bytes() {
        for clock in [Clock::Precise, Clock::Tokio] {
            let target = counting_server().await;
            let mut net = Net::with_clock(clock);
            let addr = net.add_proxy(1, 2, target).await.unwrap();
            net.delay(&[(1, 2), (2, 1)], fixed(Duration::from_millis(2)));
            let mut s = TcpStream::connect(&addr).await.unwrap();
            s.write_all(&[7u8; 100_000]).await.unwrap();
            // Half-close: the server sees the end of stream only after every
            // byte, and can still answer on the other direction; then its
            // close reaches us as our end of stream.
            s.shutdown().await.unwrap();
            let mut reply = String::new();
            tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut reply))
                .await
                .expect("the server's answer and end of stream")
                .unwrap();
            assert_eq!(reply, "100000", "{clock:?}");
            net.shutdown();
        }
    }

    #[tokio::test]
    async fn a_refused_upstream_closes_the_client_side() {
        let gone = crate::RefusingAddr::new().unwrap();
        let target = gone.addr();
        for clock in [Clock::Precise, Clock::Tokio] {
            let mut net = Net::with_clock(clock);
            net.delay(&[(1, 2), (2, 1)], fixed(Duration::from_millis(1)));
            let addr = net.add_proxy(1, 2, target.clone()).await.unwrap();
            let mut s = TcpStream::connect(&addr).await.unwrap();
            let _ = s.write_all(b"hello").await;
            let mut buf = [0u8; 8];
            let r = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
                .await
                .expect("closed, not held open");
            assert!(matches!(r, Ok(0) | Err(_)), "{clock:?}: {r:?}");
            net.shutdown();
        }
    }
}
