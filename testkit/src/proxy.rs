//! The network between nodes: one TCP proxy per ordered pair of nodes.
//!
//! Node `i` dials node `j` at the proxy for link `i→j` (`raftlockd
//! --dial j=ADDR`), so every byte between nodes passes through here. A
//! direction of a link is *cut* by no longer forwarding the bytes that node
//! `from` sends to node `to`, on every connection whichever side opened it:
//! a gRPC connection opened by `i` carries `i`'s requests (direction `i→j`)
//! and `j`'s responses (direction `j→i`). That makes one-way partitions
//! exact.
//!
//! A cut is a black hole, like dropped packets: bytes already read wait in
//! the proxy and the sender's socket buffers fill, new connections are
//! accepted but not connected onward until the direction heals, and when it
//! heals whatever was held back is delivered (as TCP would retransmit it).
//! A cut may also *reset*: every connection crossing a cut direction is
//! closed with a RST at once, as a crashed middlebox or a firewall that
//! rejects would do.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// A direction of a link: bytes sent by node `.0` to node `.1`.
pub type Link = (u64, u64);

/// What the proxies obey.
#[derive(Clone, Debug, Default)]
struct NetState {
    /// Directions that do not deliver.
    cut: BTreeSet<Link>,
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
}

/// All the proxies. Dropping it stops them and closes their connections.
pub struct Net {
    state: watch::Sender<NetState>,
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
    /// No proxies yet, every direction open.
    pub fn new() -> Net {
        Net {
            state: watch::channel(NetState::default()).0,
            tasks: JoinSet::new(),
            addrs: BTreeMap::new(),
        }
    }

    /// Starts the proxy for link `from→to`, forwarding to `target` (node
    /// `to`'s real address); returns the address node `from` must dial.
    pub async fn add_proxy(
        &mut self,
        from: u64,
        to: u64,
        target: String,
    ) -> anyhow::Result<String> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let rx = self.state.subscribe();
        self.tasks
            .spawn(accept_loop(listener, from, to, target, rx));
        self.addrs.insert((from, to), addr.clone());
        Ok(addr)
    }

    /// The proxy address node `from` dials for node `to`.
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
                    *s.resets.entry(l).or_insert(0) += 1;
                }
            }
        });
    }

    /// Restores every direction.
    pub fn heal(&self) {
        self.state.send_modify(|s| s.cut.clear());
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
                conns.spawn(connection(socket, from, to, target.clone(), state.clone()));
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
            // The node is down: close, as a refused connection would.
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
    let was_reset = tokio::select! {
        _ = async {
            tokio::join!(
                pump(&mut cr, &mut sw, up, state.clone()),
                pump(&mut sr, &mut cw, down, state.clone()),
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

/// Copies bytes one way while the direction is open; holds them while it
/// is cut.
async fn pump(
    reader: &mut OwnedReadHalf,
    writer: &mut OwnedWriteHalf,
    link: Link,
    mut state: watch::Receiver<NetState>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if state.wait_for(|s| s.open(link)).await.is_err() {
            break;
        }
        if writer.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = writer.shutdown().await;
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
}
