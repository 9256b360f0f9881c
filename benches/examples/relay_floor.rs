//! The floor of a byte relay on this machine: how little CPU per transaction a proxy can spend
//! when it does nothing but copy bytes between a client and a Postgres server, with two I/O
//! models. It answers whether issue 17's relay targets (pgwake at ≤ 0.8× PgBouncer's CPU per
//! transaction) are within reach of an epoll relay, or of batched submission through io_uring.
//!
//! ```sh
//! cargo run -p pgwake-bench --release --example relay_floor -- uring  LISTEN_PORT BACKEND_PORT
//! cargo run -p pgwake-bench --release --example relay_floor -- tokio  LISTEN_PORT BACKEND_PORT
//! ```
//!
//! Both relay on one thread, as PgBouncer does, and set `TCP_NODELAY` on every socket. No
//! parsing, no tracking, no TLS: whatever pgwake does on top of this is its own cost.
//! `benches/notes/relay.md` has the measurements and the script that ran them.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;

use anyhow::{Context, Result, bail};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [mode, listen, backend] = args.as_slice() else {
        bail!("usage: relay_floor uring|tokio LISTEN_PORT BACKEND_PORT");
    };
    let listen: SocketAddr = format!("127.0.0.1:{listen}").parse()?;
    let backend: SocketAddr = format!("127.0.0.1:{backend}").parse()?;
    match mode.as_str() {
        "uring" => uring::serve(listen, backend),
        "tokio" => tokio_relay(listen, backend),
        other => bail!("unknown mode {other:?}: uring or tokio"),
    }
}

/// The epoll model: a current-thread tokio runtime and `copy_bidirectional` per connection.
fn tokio_relay(listen: SocketAddr, backend: SocketAddr) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        loop {
            let (mut client, _) = listener.accept().await?;
            tokio::spawn(async move {
                let Ok(mut server) = tokio::net::TcpStream::connect(backend).await else {
                    return;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    })
}

/// The batched-submission model: one io_uring, a receive always pending on each socket, a send
/// submitted as soon as its receive completes, and one `io_uring_enter` per turn of the loop.
mod uring {
    use super::*;
    use io_uring::{IoUring, opcode, squeue, types};

    const BUF: usize = 16 * 1024;
    const ACCEPT: u64 = u64::MAX;

    /// One direction of a relayed pair: bytes received on `from`, not yet all sent to the peer.
    struct Half {
        buf: Box<[u8]>,
        len: usize,
        sent: usize,
    }

    /// A client and its backend connection; direction 0 is client to backend.
    struct Pair {
        socks: [TcpStream; 2],
        halves: [Half; 2],
        in_flight: u32,
        closing: bool,
    }

    fn data(slot: usize, op: u64) -> u64 {
        ((slot as u64) << 2) | op
    }

    fn push(ring: &mut IoUring, entry: squeue::Entry) -> io::Result<()> {
        // SAFETY: every buffer an entry points at is owned by a `Pair` that stays in its slot
        // until its last operation has completed (`in_flight` reaches zero).
        while unsafe { ring.submission().push(&entry) }.is_err() {
            ring.submit()?;
        }
        Ok(())
    }

    fn recv(ring: &mut IoUring, pairs: &mut [Option<Pair>], slot: usize, dir: usize) -> Result<()> {
        let pair = pairs[slot].as_mut().context("slot")?;
        let half = &mut pair.halves[dir];
        let entry = opcode::Recv::new(
            types::Fd(pair.socks[dir].as_raw_fd()),
            half.buf.as_mut_ptr(),
            BUF as u32,
        )
        .build()
        .user_data(data(slot, dir as u64));
        pair.in_flight += 1;
        push(ring, entry)?;
        Ok(())
    }

    fn send(ring: &mut IoUring, pairs: &mut [Option<Pair>], slot: usize, dir: usize) -> Result<()> {
        let pair = pairs[slot].as_mut().context("slot")?;
        let half = &pair.halves[dir];
        let rest = &half.buf[half.sent..half.len];
        let entry = opcode::Send::new(
            types::Fd(pair.socks[1 - dir].as_raw_fd()),
            rest.as_ptr(),
            rest.len() as u32,
        )
        .build()
        .user_data(data(slot, 2 + dir as u64));
        pair.in_flight += 1;
        push(ring, entry)?;
        Ok(())
    }

    fn accept(ring: &mut IoUring, listener: &TcpListener) -> Result<()> {
        let entry = opcode::Accept::new(
            types::Fd(listener.as_raw_fd()),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
        .build()
        .user_data(ACCEPT);
        push(ring, entry)?;
        Ok(())
    }

    fn close(pair: &mut Pair) {
        if !pair.closing {
            pair.closing = true;
            for s in &pair.socks {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    pub fn serve(listen: SocketAddr, backend: SocketAddr) -> Result<()> {
        let listener = TcpListener::bind(listen)?;
        let mut ring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_coop_taskrun()
            .build(1024)?;
        let mut pairs: Vec<Option<Pair>> = Vec::new();
        accept(&mut ring, &listener)?;
        loop {
            ring.submit_and_wait(1)?;
            let done: Vec<(u64, i32)> = ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            for (ud, res) in done {
                if ud == ACCEPT {
                    accept(&mut ring, &listener)?;
                    if res < 0 {
                        continue;
                    }
                    // SAFETY: the kernel handed this new descriptor to us alone.
                    let client = unsafe { <TcpStream as std::os::fd::FromRawFd>::from_raw_fd(res) };
                    let Ok(server) = TcpStream::connect(backend) else {
                        continue;
                    };
                    client.set_nodelay(true)?;
                    server.set_nodelay(true)?;
                    let half = || Half {
                        buf: vec![0u8; BUF].into_boxed_slice(),
                        len: 0,
                        sent: 0,
                    };
                    let pair = Pair {
                        socks: [client, server],
                        halves: [half(), half()],
                        in_flight: 0,
                        closing: false,
                    };
                    let slot = match pairs.iter().position(Option::is_none) {
                        Some(i) => i,
                        None => {
                            pairs.push(None);
                            pairs.len() - 1
                        }
                    };
                    pairs[slot] = Some(pair);
                    recv(&mut ring, &mut pairs, slot, 0)?;
                    recv(&mut ring, &mut pairs, slot, 1)?;
                    continue;
                }
                let slot = (ud >> 2) as usize;
                let op = (ud & 3) as usize;
                let Some(pair) = pairs[slot].as_mut() else {
                    continue;
                };
                pair.in_flight -= 1;
                let dir = op % 2;
                if res <= 0 || pair.closing {
                    close(pair);
                } else if op < 2 {
                    pair.halves[dir].len = res as usize;
                    pair.halves[dir].sent = 0;
                    send(&mut ring, &mut pairs, slot, dir)?;
                } else {
                    let half = &mut pair.halves[dir];
                    half.sent += res as usize;
                    if half.sent < half.len {
                        send(&mut ring, &mut pairs, slot, dir)?;
                    } else {
                        recv(&mut ring, &mut pairs, slot, dir)?;
                    }
                }
                if pairs[slot]
                    .as_ref()
                    .is_some_and(|p| p.closing && p.in_flight == 0)
                {
                    pairs[slot] = None;
                }
            }
        }
    }
}
