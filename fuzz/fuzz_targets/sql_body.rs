//! The `/sql` request body parser on any bytes. The module is the gateway's own file, built here
//! without the rest of its crate (whose Kubernetes stack would make the sanitizer build slow).
#![no_main]

#[path = "../../proxy/src/http/body.rs"]
mod body;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((statements, batch)) = body::parse(data) {
        assert!(batch || statements.len() == 1);
        for s in &statements {
            let _ = (s.query.len(), s.params.len());
        }
    }
});
