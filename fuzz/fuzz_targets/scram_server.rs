//! The SCRAM server on client messages: the SASLInitialResponse body, then a client-final.
//! The input is the initial response's wire body and the client-final, separated by the first
//! 0xff byte; the first input byte picks channel binding on or off.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use pgwake_protocol::auth::parse_sasl_initial_response;
use pgwake_protocol::scram::{Nonce, ScramSecret, ScramServer};

fn secret() -> &'static ScramSecret {
    static SECRET: OnceLock<ScramSecret> = OnceLock::new();
    SECRET.get_or_init(|| ScramSecret::from_password("pencil", b"fuzz-salt-16byte", 4096))
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, data)) = data.split_first() else {
        return;
    };
    let (initial, client_final) = match data.iter().position(|&b| b == 0xff) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let binding = [7u8; 32];
    let cb = (flags & 1 == 1).then_some(&binding[..]);
    let Ok(initial) = parse_sasl_initial_response(initial) else {
        return;
    };
    let client_first = initial.data.unwrap_or_default();
    let nonce = Nonce::from_random([42; 18]);
    let started = if flags & 2 == 2 {
        ScramServer::start_mock(b"mock-key", "user", cb, nonce, &initial.auth_method, &client_first)
    } else {
        ScramServer::start(secret(), cb, nonce, &initial.auth_method, &client_first)
    };
    if let Ok((server, _server_first)) = started {
        let _ = server.finish(client_final);
    }
});
