//! Front: accepting client connections and negotiating them (SSL and GSS requests, direct TLS,
//! the startup or cancel message) before the pipeline takes over.

pub mod accept;
pub mod negotiate;

pub use accept::{ActiveGuard, Front, accept_next, serve};
pub use negotiate::{NegotiateSettings, Negotiated, negotiate, negotiate_tunnel};
