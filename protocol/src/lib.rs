//! Sans-io pieces of the Postgres wire protocol that the pgwake gateway needs: framing of the
//! relayed byte stream, parsing of the first message a client sends, and the messages the
//! gateway writes itself. Nothing here touches a socket, so all of it is unit-tested and fuzzable.

pub mod auth;
pub mod backend;
pub mod channel_binding;
pub mod error;
pub mod frame;
pub mod frontend;
pub mod login;
pub mod mobility;
pub mod notify_pid;
pub mod peer;
pub mod proxy_header;
pub mod revival;
pub mod scram;
pub mod sql_text;
pub mod sqlstate;
pub mod stale;
pub mod startup;
mod text_watch;
pub mod tracker;

pub use error::{ErrorMessage, Severity};
pub use frame::{FrameError, FrameScanner};
pub use startup::{CancelKey, InitialMessage, StartupError, StartupMessage};
pub use tracker::{Pins, SessionTracker, TrackerLimits, TxStatus};
