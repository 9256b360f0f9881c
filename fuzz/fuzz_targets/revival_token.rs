//! Opening revival tokens: any bytes as a token (header, key id, nonce, tag), and any bytes as
//! the plaintext of a token sealed with the right key (the claims decoder).
#![no_main]

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use libfuzzer_sys::fuzz_target;
use pgwake_protocol::revival::{RevivalClaims, RevivalKeys, RevivalToken};

fn keys() -> &'static RevivalKeys {
    static KEYS: OnceLock<RevivalKeys> = OnceLock::new();
    KEYS.get_or_init(|| {
        RevivalKeys::new(vec![("k1".into(), [9; 32]), ("k0".into(), [3; 32])]).unwrap()
    })
}

fuzz_target!(|data: &[u8]| {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let token = RevivalToken::from_bytes(data.to_vec());
    let _ = keys().open(&token, "alpha", now);
    if let Some(claims) = RevivalClaims::decode(data) {
        let sealed = keys().seal(&claims);
        let _ = keys().open(&sealed, &claims.tenant, now);
    }
});
