//! The startup parser on any initial packet: the length check, then the parse, then every
//! accessor the gateway uses on a parsed startup message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pgwake_protocol::startup::{initial_length, parse_initial};
use pgwake_protocol::InitialMessage;

fuzz_target!(|data: &[u8]| {
    if let Some(len) = data.get(..4) {
        let _ = initial_length(len.try_into().unwrap(), 10 * 1024);
    }
    if let Ok(InitialMessage::Startup(mut startup)) = parse_initial(data) {
        let _ = startup.unsupported_options();
        let _ = startup.needs_negotiation();
        let _ = startup.forwardable_params().count();
        let user = startup.get("user").map(str::to_owned);
        startup.set("application_name", user.unwrap_or_default());
        startup.remove("options");
    }
});
