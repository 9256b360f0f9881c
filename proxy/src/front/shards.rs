//! Session threads: each runs a single-threaded runtime with its own event loop, and a Postgres
//! session lives on one of them from accept to close.
//!
//! A session's hot path is two sockets and one task. On a shared work-stealing runtime, the
//! thread that sees a socket become ready is often not the one that then runs the task, and an
//! idle worker is woken to look for work on every burst; both cost a futex and a context
//! switch per round trip. Here the thread whose event loop saw the bytes runs the relay that
//! moves them, with nothing handed across threads. Connections are dealt out in turn, Postgres
//! and HTTP alike; everything else (admin, Kubernetes watches, the accept loops, the pool
//! reapers) stays on the main runtime.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use tokio::net::TcpStream;
use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;
use tracing::warn;

/// The session threads, stopped when dropped (tasks still on them are dropped too).
pub struct Shards {
    handles: Vec<Handle>,
    next: AtomicUsize,
    stops: Vec<oneshot::Sender<()>>,
    threads: Vec<JoinHandle<()>>,
}

impl Shards {
    /// Starts `count` session threads (0: one per CPU the process may use).
    pub fn start(count: usize) -> io::Result<Shards> {
        let count = match count {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let mut shards = Shards {
            handles: Vec::with_capacity(count),
            next: AtomicUsize::new(0),
            stops: Vec::with_capacity(count),
            threads: Vec::with_capacity(count),
        };
        for i in 0..count {
            let runtime = Builder::new_current_thread().enable_all().build()?;
            shards.handles.push(runtime.handle().clone());
            let (stop, stopped) = oneshot::channel::<()>();
            shards.stops.push(stop);
            let thread = std::thread::Builder::new()
                .name(format!("pgwake-session-{i}"))
                .spawn(move || {
                    let _ = runtime.block_on(stopped);
                })?;
            shards.threads.push(thread);
        }
        Ok(shards)
    }

    /// How many session threads there are.
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Always false: there is at least one session thread.
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// Runs `session` with `tcp` on the next session thread, tracked by `tasks`. The socket
    /// moves to that thread's event loop first; if it cannot, the connection is closed.
    pub fn spawn<F, Fut>(&self, tasks: &TaskTracker, tcp: TcpStream, session: F)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let std = match tcp.into_std() {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "could not hand a connection to a session thread");
                return;
            }
        };
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len();
        let run = tasks.track_future(async move {
            match TcpStream::from_std(std) {
                Ok(tcp) => session(tcp).await,
                Err(e) => warn!(error = %e, "could not register a connection on a session thread"),
            }
        });
        self.handles[i].spawn(run);
    }
}

impl Drop for Shards {
    fn drop(&mut self) {
        for stop in self.stops.drain(..) {
            let _ = stop.send(());
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn sessions_run_in_turn_on_their_threads_and_keep_their_sockets() {
        let shards = Shards::start(2).unwrap();
        assert_eq!(shards.len(), 2);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tasks = TaskTracker::new();
        let (seen, mut names) = tokio::sync::mpsc::unbounded_channel();
        for _ in 0..4 {
            let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (tcp, _) = listener.accept().await.unwrap();
            let seen = seen.clone();
            shards.spawn(&tasks, tcp, move |tcp| async move {
                // The socket works on the session thread's own event loop.
                let _ = tcp.peer_addr().unwrap();
                tcp.readable().await.unwrap();
                let name = std::thread::current().name().map(str::to_owned);
                seen.send(name).unwrap();
            });
        }
        tasks.close();
        tokio::time::timeout(std::time::Duration::from_secs(10), tasks.wait())
            .await
            .expect("every session ends once its client goes");
        let mut got = Vec::new();
        while let Ok(n) = names.try_recv() {
            got.push(n.unwrap_or_default());
        }
        got.sort();
        assert_eq!(
            got,
            [
                "pgwake-session-0",
                "pgwake-session-0",
                "pgwake-session-1",
                "pgwake-session-1"
            ]
        );
    }
}
