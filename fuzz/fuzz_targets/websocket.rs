//! Client frames of any shape to a server WebSocket with the gateway's write bound
//! (`proxy/src/http/websocket.rs`'s `ws_config`: every frame to the socket at once, at most
//! `http.websocket_write_buffer` waiting), from a client that reads nothing until the input
//! ends: however many pings and closes it sends, what waits for it stays within the bound
//! plus one control frame each for the pong and the close answer kept aside.
#![no_main]

use std::io::{self, Read, Write};

use libfuzzer_sys::fuzz_target;
use tungstenite::protocol::{Role, WebSocket, WebSocketConfig};

/// The write bound under test (`http.websocket_write_buffer`'s smallest value).
const BOUND: usize = 4096;
/// A server's control frame: 2 header bytes and at most 125 of payload.
const CONTROL_FRAME: usize = 127;

/// The client's end: its frames come in chunks of a size the input chooses; what the server
/// sends is refused (a full socket) until `reads` is set, then counted.
struct Client<'a> {
    input: &'a [u8],
    chunk: usize,
    reads: bool,
    received: usize,
}

impl Read for Client<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.input.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = self.chunk.min(buf.len()).min(self.input.len());
        buf[..n].copy_from_slice(&self.input[..n]);
        self.input = &self.input[n..];
        Ok(n)
    }
}

impl Write for Client<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if !self.reads {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.received += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, frames)) = data.split_first() else {
        return;
    };
    let client = Client {
        input: frames,
        chunk: usize::from(chunk).max(1),
        reads: false,
        received: 0,
    };
    let config = WebSocketConfig::default()
        .write_buffer_size(0)
        .max_write_buffer_size(BOUND);
    let mut ws = WebSocket::from_raw_socket(client, Role::Server, Some(config));
    // Until the input is spent (WouldBlock) or the framing is refused.
    while ws.read().is_ok() {}
    ws.get_mut().reads = true;
    let _ = ws.flush();
    let received = ws.get_ref().received;
    assert!(
        received <= BOUND + 2 * CONTROL_FRAME,
        "{received} bytes waited for a client that did not read"
    );
});
