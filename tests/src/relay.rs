//! A TCP relay a test can cut: a network partition between two daemons on one host. While
//! cut, nothing passes either way and nothing is closed — bytes are read and dropped, as a
//! link that went silent drops them — so the peers notice only by their own timeouts.
//! Connections open during a cut stay dead after it heals; new ones pass again.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// A relay from a local port to `target`.
pub struct Relay {
    addr: SocketAddr,
    target: Arc<std::sync::Mutex<SocketAddr>>,
    cut: Arc<AtomicBool>,
    /// Bumped at every cut: a connection passes bytes only in the generation it began in.
    generation: Arc<AtomicU64>,
    accept: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Listens on `127.0.0.1:0` and relays each connection to `target`.
    pub async fn start(target: &str) -> Self {
        let target = Arc::new(std::sync::Mutex::new(
            target.parse::<SocketAddr>().expect("a host:port target"),
        ));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().expect("relay address");
        let cut = Arc::new(AtomicBool::new(false));
        let generation = Arc::new(AtomicU64::new(0));
        let accept = tokio::spawn({
            let (cut, generation, target) = (cut.clone(), generation.clone(), target.clone());
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let (cut, generation) = (cut.clone(), generation.clone());
                    let target = *target.lock().unwrap();
                    tokio::spawn(async move {
                        let born = generation.load(Ordering::SeqCst);
                        let alive = move || {
                            !cut.load(Ordering::SeqCst) && generation.load(Ordering::SeqCst) == born
                        };
                        if !alive() {
                            // Taken during a cut: held silent, never relayed.
                            hold(client).await;
                            return;
                        }
                        let Ok(upstream) = TcpStream::connect(target).await else {
                            return;
                        };
                        let (client_read, client_write) = client.into_split();
                        let (upstream_read, upstream_write) = upstream.into_split();
                        tokio::join!(
                            pipe(client_read, upstream_write, alive.clone()),
                            pipe(upstream_read, client_write, alive),
                        );
                    });
                }
            }
        });
        Self {
            addr,
            target,
            cut,
            generation,
            accept,
        }
    }

    /// `host:port` to give the client instead of the target's.
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// Cuts the link: from now on nothing passes, on open connections or new ones.
    pub fn cut(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.cut.store(true, Ordering::SeqCst);
    }

    /// Sends new connections to `target` from now on (a daemon restarted on another port).
    pub fn retarget(&self, target: &str) {
        *self.target.lock().unwrap() = target.parse().expect("a host:port target");
    }

    /// Heals it: new connections pass again.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Reads and drops what `stream` sends until it closes.
async fn hold(mut stream: TcpStream) {
    let mut buffer = vec![0u8; 16 << 10];
    while let Ok(n) = stream.read(&mut buffer).await {
        if n == 0 {
            return;
        }
    }
}

/// Copies `from` to `to` while `alive`; drops what comes after.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    alive: impl Fn() -> bool,
) {
    let mut buffer = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if alive() && to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}
