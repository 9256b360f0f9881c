//! pgwake, the gateway: configuration, listeners, TLS, the login relay, the byte relay, cancel
//! forwarding, metrics and graceful shutdown. Routing rules live in `pgwake-routing`, protocol
//! rules in `pgwake-protocol`.

pub mod admin;
pub mod admit;
pub mod auth;
pub mod cancel;
pub mod capacity;
pub mod config;
pub mod connect;
pub mod error;
pub mod http;
pub mod listener;
pub mod metrics;
pub mod negotiate;
pub mod pool;
pub mod quickstart;
pub mod relay;
pub mod reuse;
pub mod revive;
pub mod server;
pub mod session;
pub mod stream;
pub mod tls;
