//! Front: accepting client connections, naming their client (PROXY protocol from trusted load
//! balancers) and negotiating them (SSL and GSS requests, direct TLS, the startup or cancel
//! message) before the pipeline takes over.

pub mod accept;
pub mod negotiate;
pub mod proxy_protocol;
pub mod shards;

pub use accept::{ActiveGuard, Front, accept_next, serve};
pub use negotiate::{NegotiateSettings, Negotiated, negotiate, negotiate_tunnel};
pub use proxy_protocol::{ProxyProtocol, ProxyRefusal};
pub use shards::Shards;
