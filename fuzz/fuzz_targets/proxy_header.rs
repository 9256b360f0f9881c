//! The PROXY protocol header parser on any bytes, read the way the gateway reads a socket: only
//! as many bytes as the parser asks for, which must grow and never pass what the whole buffer
//! parses to.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pgwake_protocol::proxy_header::{detect, parse, Parsed};

fuzz_target!(|data: &[u8]| {
    let _ = detect(data);
    let max = 4096;
    let whole = parse(data, max);
    let mut have = 0;
    loop {
        match parse(&data[..have], max) {
            Ok(Parsed::Incomplete { need }) => {
                assert!(need > have, "no progress at {have}");
                if need > data.len() {
                    return;
                }
                have = need;
            }
            Ok(Parsed::Complete { len, .. }) => {
                assert!(len <= have && len <= max);
                assert_eq!(whole.map(|p| matches!(p, Parsed::Complete { .. })), Ok(true));
                return;
            }
            Err(_) => return,
        }
    }
});
