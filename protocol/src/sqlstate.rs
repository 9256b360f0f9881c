//! SQLSTATE codes the gateway sends itself, named as in the PostgreSQL documentation.

/// `08001` sqlclient_unable_to_establish_sqlconnection: the backend could not be reached.
pub const SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION: &str = "08001";
/// `08004` sqlserver_rejected_establishment_of_sqlconnection: unknown, forbidden or ambiguous tenant.
pub const SQLSERVER_REJECTED_ESTABLISHMENT_OF_SQLCONNECTION: &str = "08004";
/// `08006` connection_failure: the backend connection broke.
pub const CONNECTION_FAILURE: &str = "08006";
/// `08P01` protocol_violation: malformed or oversized protocol input.
pub const PROTOCOL_VIOLATION: &str = "08P01";
/// `0A000` feature_not_supported.
pub const FEATURE_NOT_SUPPORTED: &str = "0A000";
/// `28000` invalid_authorization_specification: the connection is not allowed as made.
pub const INVALID_AUTHORIZATION_SPECIFICATION: &str = "28000";
/// `28P01` invalid_password: wrong password or unknown user (one answer for both).
pub const INVALID_PASSWORD: &str = "28P01";
/// `53300` too_many_connections.
pub const TOO_MANY_CONNECTIONS: &str = "53300";
/// `57014` query_canceled: a request was cancelled at the client's request.
pub const QUERY_CANCELED: &str = "57014";
/// `57P01` admin_shutdown: the gateway is shutting down.
pub const ADMIN_SHUTDOWN: &str = "57P01";
/// `57P03` cannot_connect_now.
pub const CANNOT_CONNECT_NOW: &str = "57P03";
/// `XX000` internal_error.
pub const INTERNAL_ERROR: &str = "XX000";
/// `57P02` crash_shutdown: the server ended sessions after another process crashed.
pub const CRASH_SHUTDOWN: &str = "57P02";
/// `57P05` idle_session_timeout: an idle session was ended.
pub const IDLE_SESSION_TIMEOUT: &str = "57P05";
/// `25P03` idle_in_transaction_session_timeout: a session idle inside a transaction was ended.
pub const IDLE_IN_TRANSACTION_SESSION_TIMEOUT: &str = "25P03";
