//! A `/sql` response body assembled in memory up to a bound and in an unnamed temporary file
//! beyond it. The status of a response is known only once its last statement has run (a later
//! statement of a batch may fail), so the body cannot go out while it is built; spilling keeps
//! what a large result costs on disk rather than in the gateway's memory. What all responses
//! keep on disk together is bounded by a [`SpillBudget`] (`http.max_spill_total`, and
//! `http.max_spill_per_tenant` for one tenant's), held until each body has been sent or dropped.

use std::collections::HashMap;
use std::io::{Seek, SeekFrom, Write};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::TryStreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use pgwake_routing::TenantId;
use tokio_util::io::ReaderStream;

use super::Body;

/// Size of the reads that send a spilled body.
const SEND_CHUNK: usize = 64 * 1024;

/// The room all spilled responses share on disk, and each tenant's share of it.
pub struct SpillBudget {
    limit: u64,
    per_tenant: u64,
    used: Mutex<Used>,
}

/// What spilled responses hold now: in all, and per tenant holding any (so the map is as
/// large as the tenants with a response on disk, never more).
#[derive(Default)]
struct Used {
    total: u64,
    tenants: HashMap<TenantId, u64>,
}

impl SpillBudget {
    /// Room for `limit` bytes of spilled responses at once, at most `per_tenant` of them for
    /// any one tenant.
    pub fn new(limit: u64, per_tenant: u64) -> Arc<SpillBudget> {
        Arc::new(SpillBudget {
            limit,
            per_tenant,
            used: Mutex::new(Used::default()),
        })
    }

    /// Bytes spilled responses hold now.
    pub fn used(&self) -> u64 {
        self.lock().total
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Used> {
        // The counts are updated in one step each: a panic elsewhere leaves them consistent.
        self.used.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The part of the budget one response holds, given back when it is dropped (with the body
/// stream, once sent).
struct Held {
    budget: Arc<SpillBudget>,
    tenant: TenantId,
    bytes: u64,
}

impl Held {
    /// Takes `n` more bytes of the budget, or fails when it, or the tenant's share of it, has
    /// no room left.
    fn take(&mut self, n: u64) -> std::io::Result<()> {
        let budget = &self.budget;
        let mut used = budget.lock();
        let tenant = used.tenants.get(&self.tenant).copied().unwrap_or(0);
        let full = |what: String| std::io::Error::new(std::io::ErrorKind::StorageFull, what);
        // The whole budget first: when both are out of room, the gateway's limit is the one
        // that says why.
        if used.total.saturating_add(n) > budget.limit {
            return Err(full(format!(
                "spilled responses hold {} bytes already (http.max_spill_total)",
                budget.limit
            )));
        }
        if tenant.saturating_add(n) > budget.per_tenant {
            return Err(full(format!(
                "this tenant's spilled responses hold {} bytes already \
                 (http.max_spill_per_tenant)",
                budget.per_tenant
            )));
        }
        used.total += n;
        *used.tenants.entry(self.tenant.clone()).or_insert(0) += n;
        self.bytes += n;
        Ok(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        let mut used = self.budget.lock();
        used.total -= self.bytes;
        if let Some(held) = used.tenants.get_mut(&self.tenant) {
            *held -= self.bytes;
            if *held == 0 {
                used.tenants.remove(&self.tenant);
            }
        }
    }
}

/// A response body under construction: append with [`SpillBuffer::buf`], then call
/// [`SpillBuffer::settle`] so that what outgrew the memory bound moves to disk.
pub struct SpillBuffer {
    mem: Vec<u8>,
    file: Option<std::fs::File>,
    spilled: u64,
    memory: usize,
    held: Held,
}

impl SpillBuffer {
    /// An empty body of `tenant`'s that keeps at most about `memory` bytes in memory, and
    /// spills into the room `budget` has left for it.
    pub fn new(memory: usize, budget: Arc<SpillBudget>, tenant: TenantId) -> SpillBuffer {
        SpillBuffer {
            mem: Vec::new(),
            file: None,
            spilled: 0,
            memory,
            held: Held {
                budget,
                tenant,
                bytes: 0,
            },
        }
    }

    /// An empty body with the same bounds, for the same tenant.
    pub fn empty_like(&self) -> SpillBuffer {
        SpillBuffer::new(
            self.memory,
            self.held.budget.clone(),
            self.held.tenant.clone(),
        )
    }

    /// The in-memory tail, to append to.
    pub fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.mem
    }

    /// Bytes written so far, in memory and on disk.
    pub fn len(&self) -> u64 {
        self.spilled + self.mem.len() as u64
    }

    /// Whether the body is still only in memory.
    pub fn in_memory(&self) -> bool {
        self.file.is_none()
    }

    /// Moves the in-memory tail to the temporary file once it has reached the memory bound.
    pub async fn settle(&mut self) -> std::io::Result<()> {
        if self.mem.len() < self.memory {
            return Ok(());
        }
        self.held.take(self.mem.len() as u64)?;
        // The buffer itself travels to the blocking thread and back: no copy of it is made.
        let mem = std::mem::take(&mut self.mem);
        let file = self.file.take();
        let (file, mut mem) = tokio::task::spawn_blocking(move || {
            // The file has no name from the start, so it vanishes with its last handle
            // whatever way the request ends.
            let mut file = match file {
                Some(f) => f,
                None => tempfile::tempfile()?,
            };
            file.write_all(&mem)?;
            Ok::<_, std::io::Error>((file, mem))
        })
        .await
        .map_err(std::io::Error::other)??;
        self.spilled += mem.len() as u64;
        mem.clear();
        // Capacity beyond the bound (one oversized row) is given back rather than kept.
        mem.shrink_to(self.memory);
        self.mem = mem;
        self.file = Some(file);
        Ok(())
    }

    /// The finished body: the bytes themselves, or a stream reading them back from disk.
    pub async fn into_body(self) -> std::io::Result<Body> {
        let Some(file) = self.file else {
            return Ok(super::full(Bytes::from(self.mem)));
        };
        let mut held = self.held;
        held.take(self.mem.len() as u64)?;
        let mem = self.mem;
        let file = tokio::task::spawn_blocking(move || {
            let mut file = file;
            file.write_all(&mem)?;
            file.seek(SeekFrom::Start(0))?;
            Ok::<_, std::io::Error>(file)
        })
        .await
        .map_err(std::io::Error::other)??;
        let file = tokio::fs::File::from_std(file);
        // The room on disk is given back with the stream: once sent, or dropped unsent.
        let frames = ReaderStream::with_capacity(file, SEND_CHUNK).map_ok(move |chunk| {
            let _held = &held;
            Frame::data(chunk)
        });
        Ok(BodyExt::boxed_unsync(StreamBody::new(frames)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str) -> TenantId {
        TenantId::parse(name).expect("valid tenant id")
    }

    async fn collect(body: Body) -> Vec<u8> {
        body.collect().await.expect("readable").to_bytes().to_vec()
    }

    #[tokio::test]
    async fn small_bodies_stay_in_memory() {
        let mut b = SpillBuffer::new(1024, SpillBudget::new(1 << 20, 1 << 20), tenant("a"));
        b.buf().extend_from_slice(b"{\"rows\":[]}");
        b.settle().await.expect("settle");
        assert!(b.in_memory());
        assert_eq!(b.len(), 11);
        assert_eq!(
            collect(b.into_body().await.expect("body")).await,
            b"{\"rows\":[]}"
        );
    }

    #[tokio::test]
    async fn large_bodies_spill_and_come_back_whole_and_in_order() {
        let budget = SpillBudget::new(1 << 20, 1 << 20);
        let mut b = SpillBuffer::new(1000, budget.clone(), tenant("a"));
        let mut expected = Vec::new();
        for i in 0..10_000u32 {
            let piece = format!("{i},");
            b.buf().extend_from_slice(piece.as_bytes());
            expected.extend_from_slice(piece.as_bytes());
            b.settle().await.expect("settle");
            assert!(b.buf().len() < 1000);
        }
        assert!(!b.in_memory());
        assert_eq!(b.len(), expected.len() as u64);
        let body = b.into_body().await.expect("body");
        assert_eq!(budget.used(), expected.len() as u64);
        assert_eq!(collect(body).await, expected);
        assert_eq!(budget.used(), 0, "given back with the body");
    }

    #[tokio::test]
    async fn spills_past_the_budget_are_refused_until_room_is_given_back() {
        let budget = SpillBudget::new(3000, 3000);
        let mut a = SpillBuffer::new(1000, budget.clone(), tenant("a"));
        a.buf().extend_from_slice(&[b'a'; 2000]);
        a.settle().await.expect("room for a");
        let mut b = SpillBuffer::new(1000, budget.clone(), tenant("b"));
        b.buf().extend_from_slice(&[b'b'; 2000]);
        let err = b.settle().await.expect_err("no room for b");
        assert_eq!(err.kind(), std::io::ErrorKind::StorageFull);
        drop(a);
        assert_eq!(budget.used(), 0);
        b.settle().await.expect("room once a is gone");
    }

    #[tokio::test]
    async fn a_tenant_past_its_share_is_refused_while_others_keep_theirs() {
        let budget = SpillBudget::new(6000, 3000);
        let mut a1 = SpillBuffer::new(1000, budget.clone(), tenant("a"));
        a1.buf().extend_from_slice(&[b'a'; 2000]);
        a1.settle().await.expect("room for a's first");
        let mut a2 = SpillBuffer::new(1000, budget.clone(), tenant("a"));
        a2.buf().extend_from_slice(&[b'a'; 2000]);
        let err = a2.settle().await.expect_err("a is past its share");
        assert_eq!(err.kind(), std::io::ErrorKind::StorageFull);
        let mut b = SpillBuffer::new(1000, budget.clone(), tenant("b"));
        b.buf().extend_from_slice(&[b'b'; 2000]);
        b.settle().await.expect("b keeps its share");
        drop(a1);
        a2.settle().await.expect("room once a's first is gone");
        drop((a2, b));
        assert_eq!(budget.used(), 0);
    }
}
