//! The requests a relay run waits for besides its two streams: the gateway's shutdown, the
//! end of idle sessions, and its caller's park and migrate requests.
//!
//! They come rarely, but a relay turns once or twice per round trip. Polling their futures at
//! every turn cost about 700 instructions per round trip: a cancellation token's future locks
//! the token's mutex and then its `Notify`'s, and those two tokens are shared by every session
//! of the gateway, on every session thread. So the futures are polled with a waker of their
//! own, which marks that one of them woke the task; a turn polls them only then, and otherwise
//! reads one flag.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};

/// Which requests have come, once each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Asked {
    /// The gateway is shutting down: end the session at the next message boundary.
    pub terminate: bool,
    /// Idle sessions are to end: end this one once it is at rest.
    pub idle: bool,
    /// Hand the session back to be parked once it is at rest.
    pub park: bool,
    /// Hand the session back to be moved once it is at rest.
    pub migrate: bool,
}

/// The requests' futures, polled only after one of them woke the task.
pub(super) struct Requests<T, P, M> {
    terminate: Pin<Box<T>>,
    idle: Pin<Box<T>>,
    park: Pin<Box<P>>,
    migrate: Pin<Box<M>>,
    asked: Asked,
    flag: Arc<WakeFlag>,
    /// Wakes through `flag`; the futures hold clones of it.
    flagged: Waker,
    /// The task's waker that `flag` forwards to, as last given to it.
    task: Option<Waker>,
}

impl<T, P, M> Requests<T, P, M>
where
    T: Future<Output = ()>,
    P: Future<Output = ()>,
    M: Future<Output = ()>,
{
    /// Waits for `terminate`, `idle`, `park` and `migrate` (futures that complete once their
    /// request comes).
    pub(super) fn new(terminate: T, idle: T, park: P, migrate: M) -> Self {
        let flag = Arc::new(WakeFlag {
            // The first turn polls every future, which registers them.
            woken: AtomicBool::new(true),
            task: Mutex::new(None),
        });
        Requests {
            terminate: Box::pin(terminate),
            idle: Box::pin(idle),
            park: Box::pin(park),
            migrate: Box::pin(migrate),
            asked: Asked::default(),
            flagged: Waker::from(flag.clone()),
            flag,
            task: None,
        }
    }

    /// The requests that have come so far; a request that comes later wakes `cx`'s task.
    pub(super) fn poll(&mut self, cx: &mut Context<'_>) -> Asked {
        if !self.task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
            self.task = Some(cx.waker().clone());
            *self.flag.task.lock().unwrap_or_else(|e| e.into_inner()) = self.task.clone();
        }
        // Cleared before the polls: a wake during them sets it again for the next turn.
        if self.flag.woken.load(Ordering::Acquire) && self.flag.woken.swap(false, Ordering::AcqRel)
        {
            let mut own = Context::from_waker(&self.flagged);
            let asked = &mut self.asked;
            // A future that completed is not polled again.
            asked.terminate = asked.terminate || self.terminate.as_mut().poll(&mut own).is_ready();
            asked.idle = asked.idle || self.idle.as_mut().poll(&mut own).is_ready();
            asked.park = asked.park || self.park.as_mut().poll(&mut own).is_ready();
            asked.migrate = asked.migrate || self.migrate.as_mut().poll(&mut own).is_ready();
        }
        self.asked
    }
}

/// Marks that a request's future woke the task, then wakes it.
struct WakeFlag {
    woken: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl Wake for WakeFlag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        if let Some(task) = self.task.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            task.wake_by_ref();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::{pending, poll_fn};
    use std::task::Poll;
    use std::time::Duration;
    use tokio_util::sync::CancellationToken;

    /// Each request reaches a relay-like task that is waiting on nothing else, whichever thread
    /// makes it and however many turns passed before.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_request_wakes_the_waiting_task() {
        for which in 0..4 {
            let (terminate, idle) = (CancellationToken::new(), CancellationToken::new());
            let (park_tx, mut park_rx) = tokio::sync::watch::channel(0u64);
            let (migrate_tx, mut migrate_rx) = tokio::sync::watch::channel(0u64);
            let (t, i) = (terminate.clone(), idle.clone());
            let task = tokio::spawn(async move {
                let park = async {
                    if park_rx.changed().await.is_err() {
                        pending::<()>().await;
                    }
                };
                let migrate = async {
                    if migrate_rx.changed().await.is_err() {
                        pending::<()>().await;
                    }
                };
                let mut requests = Requests::new(t.cancelled(), i.cancelled(), park, migrate);
                let mut turns = 0u32;
                poll_fn(|cx| {
                    turns += 1;
                    let asked = requests.poll(cx);
                    if asked == Asked::default() {
                        Poll::Pending
                    } else {
                        Poll::Ready((asked, turns))
                    }
                })
                .await
            });
            tokio::time::sleep(Duration::from_millis(50)).await;
            match which {
                0 => terminate.cancel(),
                1 => idle.cancel(),
                2 => {
                    park_tx.send_replace(1);
                }
                _ => {
                    migrate_tx.send_replace(1);
                }
            }
            let (asked, turns) = tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .expect("the request woke the task")
                .unwrap();
            let expected = [asked.terminate, asked.idle, asked.park, asked.migrate];
            assert_eq!(
                expected.iter().filter(|&&b| b).count(),
                1,
                "{which}: {asked:?}"
            );
            assert!(expected[which], "{which}: {asked:?}");
            assert_eq!(turns, 2, "registered on the first turn, woken once");
        }
    }
}
