//! Micro-benchmarks of the protocol pieces on the gateway's hot paths: the frame scanner the
//! relay runs over every chunk it copies, and the parsing of a connection's first packet, which
//! every new connection pays (and which matters for the churn scenarios of the load harness).
//!
//! `cargo bench -p pgwake-bench --bench protocol`

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use pgwake_protocol::FrameScanner;
use pgwake_protocol::backend::{ssl_request, startup_packet};
use pgwake_protocol::startup::{InitialMessage, parse_initial};

/// The relay reads at most this much per chunk; the scanner sees the stream in pieces this size.
const CHUNK: usize = 16 * 1024;

fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![tag];
    m.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    m.extend_from_slice(body);
    m
}

/// What a backend sends for one `pgbench -S` transaction in the simple protocol: RowDescription,
/// one DataRow, CommandComplete, ReadyForQuery. Many small messages: the scanner's worst case.
fn select_only_response() -> Vec<u8> {
    let mut row_description = 1u16.to_be_bytes().to_vec();
    row_description.extend_from_slice(b"abalance\0");
    row_description.extend_from_slice(&[0; 18]);
    let mut data_row = 1u16.to_be_bytes().to_vec();
    data_row.extend_from_slice(&4u32.to_be_bytes());
    data_row.extend_from_slice(b"1234");
    let mut out = message(b'T', &row_description);
    out.extend(message(b'D', &data_row));
    out.extend(message(b'C', b"SELECT 1\0"));
    out.extend(message(b'Z', b"I"));
    out
}

/// Scans `stream` in relay-sized chunks, counting messages so the work cannot be optimized away.
fn scan(stream: &[u8]) -> usize {
    let mut scanner = FrameScanner::new(1 << 30);
    let mut messages = 0;
    for chunk in stream.chunks(CHUNK) {
        scanner
            .feed(chunk, |_, _| messages += 1)
            .expect("valid stream");
    }
    messages
}

fn frame_scanner(c: &mut Criterion) {
    let mut group = c.benchmark_group("frame_scanner");

    let small: Vec<u8> = select_only_response().repeat(4096);
    group.throughput(Throughput::Bytes(small.len() as u64));
    group.bench_function("select_only_responses", |b| {
        b.iter(|| scan(black_box(&small)))
    });

    // Large DataRows (8 KiB each, like wide rows or COPY data): the scanner skips payloads
    // without reading them, so its cost follows the number of messages, not bytes.
    let large: Vec<u8> = message(b'D', &[b'x'; 8192]).repeat(256);
    group.throughput(Throughput::Elements(256));
    group.bench_function("large_data_rows", |b| b.iter(|| scan(black_box(&large))));

    group.finish();
}

fn initial_packet(c: &mut Criterion) {
    let mut group = c.benchmark_group("parse_initial");

    // The parameters libpq 15 sends for `pgbench` plus a routing option.
    let params: Vec<(String, String)> = [
        ("user", "app_user"),
        ("database", "tenant42.appdb"),
        ("application_name", "pgbench"),
        ("client_encoding", "UTF8"),
        ("options", "endpoint=tenant42 -c statement_timeout=5s"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let startup = startup_packet(&params);
    group.bench_function("startup_message", |b| {
        b.iter(|| match parse_initial(black_box(&startup)) {
            Ok(InitialMessage::Startup(m)) => m.params.len(),
            other => panic!("unexpected {other:?}"),
        })
    });

    let ssl = ssl_request();
    group.bench_function("ssl_request", |b| {
        b.iter(|| parse_initial(black_box(&ssl)).is_ok())
    });

    group.finish();
}

criterion_group!(benches, frame_scanner, initial_packet);
criterion_main!(benches);
