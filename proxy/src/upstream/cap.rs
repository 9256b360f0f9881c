//! Caps on the gateway's backend connections per tenant (`max_backend_connections`): every
//! connection of a capped tenant, in use or kept idle, holds one slot; a login past the cap waits
//! in a bounded queue, with a deadline, for a slot or a kept connection.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use pgwake_routing::TenantId;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// A backend connection's place under its tenant's cap (`None`: the tenant has no cap). Kept
/// with the connection and given up when it closes.
pub type BackendSlot = Option<OwnedSemaphorePermit>;

/// One tenant's cap.
pub(super) struct Cap {
    /// The tenant's `max_backend_connections`.
    pub(super) max: usize,
    /// Slots left.
    pub(super) slots: Arc<Semaphore>,
    /// Sessions waiting now.
    pub(super) waiting: AtomicUsize,
    /// Woken when a connection of the tenant is kept idle (a waiter may take or close it).
    pub(super) kept: Notify,
}

/// The caps of all capped tenants, and how waits for them are bounded.
pub(super) struct Caps {
    caps: HashMap<TenantId, Cap>,
    /// Sessions that may wait for a slot of one tenant at once.
    pub(super) max_waiters: usize,
    /// How long one may wait.
    pub(super) wait: Duration,
}

/// A place in a tenant's queue of sessions waiting for a slot, given up on drop.
pub(super) struct Waiting<'a>(&'a Cap);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Caps {
    /// Caps from `limits` (tenant and its `max_backend_connections`).
    pub(super) fn new(
        limits: impl IntoIterator<Item = (TenantId, usize)>,
        max_waiters: usize,
        wait: Duration,
    ) -> Caps {
        let caps = limits
            .into_iter()
            .map(|(tenant, max)| {
                let cap = Cap {
                    max,
                    slots: Arc::new(Semaphore::new(max)),
                    waiting: AtomicUsize::new(0),
                    kept: Notify::new(),
                };
                (tenant, cap)
            })
            .collect();
        Caps {
            caps,
            max_waiters,
            wait,
        }
    }

    /// The cap of `tenant`, if it has one.
    pub(super) fn get(&self, tenant: &TenantId) -> Option<&Cap> {
        self.caps.get(tenant)
    }

    /// Tells waiters of `tenant` that one of its connections was kept idle.
    pub(super) fn kept(&self, tenant: &TenantId) {
        if let Some(cap) = self.caps.get(tenant) {
            cap.kept.notify_waiters();
        }
    }
}

impl Cap {
    /// A free slot now, if there is one.
    pub(super) fn try_slot(&self) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }

    /// Joins the queue of waiting sessions, unless `max` already wait.
    pub(super) fn join(&self, max: usize) -> Option<Waiting<'_>> {
        let before = self.waiting.fetch_add(1, Ordering::Relaxed);
        let place = Waiting(self);
        (before < max).then_some(place)
    }
}
