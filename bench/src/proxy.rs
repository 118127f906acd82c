//! `raftlock-bench proxy`: the same delay on every link of a benchmark.
//!
//! These machines' kernels have no `netem`, so `compare.sh --rtt MS` puts
//! this user-space TCP proxy (testkit's [`Net`], timed by its precise
//! clock) in front of every address a client or a peer dials: each chunk
//! read from one side is written to the other `--delay-us` after it was
//! read, in order, in both directions. One process serves every route it
//! is given.

use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use raftlock_testkit::proxy::{Clock, Delay, Net};
use tokio::net::TcpListener;

/// Arguments of `raftlock-bench proxy`.
#[derive(Args)]
pub struct ProxyArgs {
    /// LISTEN=TARGET (host:port each; repeat, or separate with commas):
    /// accept on LISTEN and forward every connection to TARGET.
    #[arg(long = "route", value_delimiter = ',', required = true)]
    routes: Vec<String>,
    /// Added to each direction of every route, in microseconds (half the
    /// round trip added).
    #[arg(long, default_value_t = 0)]
    delay_us: u64,
    /// Runtime threads (1: everything on one thread, no hand-offs
    /// between threads).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

impl ProxyArgs {
    /// The runtime threads asked for, at least 1.
    pub fn threads(&self) -> usize {
        self.threads.max(1)
    }
}

/// One route: where the proxy listens, where it forwards.
#[derive(Debug, PartialEq, Eq)]
struct Route {
    listen: String,
    target: String,
}

fn parse_route(s: &str) -> anyhow::Result<Route> {
    let Some((listen, target)) = s.split_once('=') else {
        bail!("route {s:?}: expected LISTEN=TARGET (host:port each)");
    };
    let (listen, target) = (listen.trim(), target.trim());
    for (what, addr) in [("listen", listen), ("target", target)] {
        match addr.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => {}
            _ => bail!("route {s:?}: {what} address {addr:?} is not host:port"),
        }
    }
    Ok(Route {
        listen: listen.to_string(),
        target: target.to_string(),
    })
}

/// Runs the proxies until the process is stopped.
pub async fn run(args: ProxyArgs) -> anyhow::Result<()> {
    let routes = args
        .routes
        .iter()
        .map(|r| parse_route(r))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut net = Net::with_clock(Clock::Precise);
    let mut links = Vec::new();
    for (k, route) in routes.iter().enumerate() {
        let listener = TcpListener::bind(&route.listen)
            .await
            .with_context(|| format!("listen on {}", route.listen))?;
        // Each route is a link of its own, between end 0 (whoever dials)
        // and end k + 1 (its target).
        let end = k as u64 + 1;
        net.add_proxy_on(listener, 0, end, route.target.clone())?;
        links.extend([(0, end), (end, 0)]);
    }
    if args.delay_us > 0 {
        net.delay(
            &links,
            Delay {
                base: Duration::from_micros(args.delay_us),
                jitter: Duration::ZERO,
            },
        );
    }
    eprintln!(
        "raftlock-bench proxy: {} routes, {} µs added each way",
        routes.len(),
        args.delay_us
    );
    std::future::pending::<()>().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_parse_and_bad_ones_are_named() {
        assert_eq!(
            parse_route("127.0.0.1:1=127.0.0.1:2").unwrap(),
            Route {
                listen: "127.0.0.1:1".into(),
                target: "127.0.0.1:2".into()
            }
        );
        for bad in [
            "127.0.0.1:1",
            "127.0.0.1=127.0.0.1:2",
            "127.0.0.1:1=:2",
            "h:0=h:2",
        ] {
            let e = parse_route(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }
}
