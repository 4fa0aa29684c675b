//! A userspace TCP fault proxy between a client and a server (a relay and its database,
//! broker or webhook receiver). It passes bytes through both ways until it is told to
//! misbehave; see [`Net`].
//!
//! ```no_run
//! # async fn run() {
//! use outbox_test_support::proxy::{self, Net};
//!
//! let mut url = "redis://127.0.0.1:6379/".to_owned();
//! let proxy = proxy::in_front(&mut url).await; // url now names the proxy
//! proxy.set(Net::Silence); // connections that carry data from now on fall silent for good
//! # }
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does with the bytes that arrive while it is in that mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Net {
    /// Passes them through.
    Pass = 0,
    /// Holds each chunk 300 ms before passing it on.
    Slow = 1,
    /// Passes requests to the server, but drops the server's reply and resets the
    /// client's connection: the request took effect, and the client never hears so (a
    /// lost acknowledgement).
    LoseReplies = 2,
    /// Holds every chunk until the mode changes, then passes it on: a network partition
    /// that heals (TCP delivers what was sent once it does). Clients see silence, their
    /// timeouts fire, and the requests they gave up on may still arrive.
    Partition = 3,
    /// Stops passing anything on the connections that carry a chunk meanwhile, for good,
    /// without closing them: peers that vanished without a reset (a crashed host, a
    /// NAT or firewall that forgot the flow). Only the client's own timeouts can notice.
    Silence = 4,
}

/// A running proxy; see the module docs. It runs until the runtime ends.
#[derive(Debug)]
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    mode: Arc<AtomicU8>,
}

impl Proxy {
    /// Starts a proxy on a free loopback port, forwarding to `upstream`.
    ///
    /// # Panics
    ///
    /// If no loopback port can be bound.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("the proxy's address");
        let mode = Arc::new(AtomicU8::new(Net::Pass as u8));
        let shared = mode.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let mode = shared.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        relay_bytes(client, server, &mode).await;
                    }
                });
            }
        });
        Self { addr, mode }
    }

    /// Treats the bytes that arrive from now on as `net` says.
    pub fn set(&self, net: Net) {
        self.mode.store(net as u8, Ordering::SeqCst);
    }
}

/// Copies bytes both ways between `client` and `server` as the mode says, until either
/// side closes.
async fn relay_bytes(mut client: TcpStream, mut server: TcpStream, mode: &AtomicU8) {
    let (mut up, mut down) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    loop {
        tokio::select! {
            read = client.read(&mut up) => {
                let Ok(n @ 1..) = read else { return };
                hold(mode).await;
                if server.write_all(&up[..n]).await.is_err() {
                    return;
                }
            }
            read = server.read(&mut down) => {
                let Ok(n @ 1..) = read else { return };
                if mode.load(Ordering::SeqCst) == Net::LoseReplies as u8 {
                    // SO_LINGER 0: closing sends a reset instead of a FIN.
                    let _ = client.set_zero_linger();
                    return;
                }
                hold(mode).await;
                if client.write_all(&down[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Waits as the mode says before a chunk is passed on: not at all, 300 ms, until the
/// partition heals, or forever (the connection falls silent).
async fn hold(mode: &AtomicU8) {
    match mode.load(Ordering::SeqCst) {
        m if m == Net::Slow as u8 => tokio::time::sleep(Duration::from_millis(300)).await,
        m if m == Net::Silence as u8 => std::future::pending::<()>().await,
        _ => {
            while mode.load(Ordering::SeqCst) == Net::Partition as u8 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// The first `127.0.0.1:<port>` in `text` (a URL, or TOML holding one): where it is,
/// and the address.
fn loopback(text: &str) -> Option<(std::ops::Range<usize>, SocketAddr)> {
    const HOST: &str = "127.0.0.1:";
    let start = text.find(HOST)?;
    let port = &text[start + HOST.len()..];
    let end = start
        + HOST.len()
        + port
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(port.len());
    Some((start..end, text[start..end].parse().ok()?))
}

/// A proxy in front of the server `text` names (its first `127.0.0.1:<port>`), with
/// `text` changed to name the proxy instead.
///
/// # Panics
///
/// If `text` names no `127.0.0.1:<port>`.
pub async fn in_front(text: &mut String) -> Proxy {
    let (at, upstream) =
        loopback(text).unwrap_or_else(|| panic!("no 127.0.0.1:<port> to put a proxy in front of"));
    let proxy = Proxy::start(upstream).await;
    text.replace_range(at, &proxy.addr.to_string());
    proxy
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_first_loopback_address() {
        let route = "url = \"amqp://u:p@127.0.0.1:5672/vhost\"\nx = \"127.0.0.1:9\"";
        let (at, addr) = loopback(route).unwrap();
        assert_eq!(&route[at], "127.0.0.1:5672");
        assert_eq!(addr.port(), 5672);
        assert_eq!(loopback("redis://127.0.0.1:6379").unwrap().1.port(), 6379);
        assert!(loopback("redis://localhost:6379/").is_none());
    }
}
