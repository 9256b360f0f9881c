//! pgwake, the gateway. The folders follow a connection's journey: `front` (accept, negotiate)
//! → `pipeline` (route, admit, authenticate, wake) → `upstream` (connect, log in, reuse, pool)
//! → `session` (relay, park, revive); `http` is the front for `/sql` and WebSocket clients and
//! `app` builds and runs it all. `auth`, `cancel`, `capacity`, `config`, `error`, `metrics`,
//! `peer` (cancels across replicas), `stream`, `tls` and `wire` serve every stage. Routing rules
//! live in `pgwake-routing`, protocol rules in `pgwake-protocol`.

pub mod admin;
pub mod app;
pub mod auth;
pub mod cancel;
pub mod capacity;
pub mod config;
pub mod error;
pub mod front;
pub mod http;
pub mod metrics;
pub mod peer;
pub mod pipeline;
pub mod session;
pub mod stream;
pub mod tls;
pub mod upstream;
mod wire;
