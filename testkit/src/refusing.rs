//! A loopback address that refuses every connection for as long as the
//! test keeps it.
//!
//! Binding a listener to port 0 and dropping it leaves a port nothing
//! listens on *for the moment*: a node another test starts in the same
//! process can be given that port a moment later, and a test that meant
//! "nothing answers here" then talks to a live node (CI, 2026-11-30:
//! `raftlock status` against two such ports exited 0). A socket bound
//! without `SO_REUSEADDR` and never listened on keeps the port to itself
//! (no other socket can bind it, not even one asking the kernel for any
//! free port), and the kernel answers a connection to it with a reset,
//! so the dialler sees "connection refused".

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::OwnedFd;

use nix::sys::socket::{bind, getsockname, socket, AddressFamily, SockFlag, SockType, SockaddrIn};

/// A loopback port held closed: connections to [`addr`](Self::addr) are
/// refused until this is dropped, and nothing else can bind the port.
#[derive(Debug)]
pub struct RefusingAddr {
    _socket: OwnedFd,
    addr: SocketAddr,
}

impl RefusingAddr {
    /// Holds a port on 127.0.0.1 the kernel picks.
    pub fn new() -> std::io::Result<Self> {
        let socket = socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        use std::os::fd::AsRawFd;
        bind(
            socket.as_raw_fd(),
            &SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)),
        )?;
        let bound: SockaddrIn = getsockname(socket.as_raw_fd())?;
        let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, bound.port()));
        Ok(Self {
            _socket: socket,
            addr,
        })
    }

    /// The address, `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_refused_and_the_port_stays_taken() {
        let held = RefusingAddr::new().expect("hold a port");
        let err = std::net::TcpStream::connect(held.addr()).expect_err("refused");
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
        // A listener (std sets SO_REUSEADDR) cannot take the port either.
        let err = std::net::TcpListener::bind(held.addr()).expect_err("taken");
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
        // Nor is it handed out to a listener asking for any port.
        for _ in 0..2000 {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            assert_ne!(l.local_addr().expect("addr").to_string(), held.addr());
        }
    }
}
