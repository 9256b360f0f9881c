//! Waiting for a tenant's database: the client is told it is waking (when the gateway knows
//! who it is) and held in the tenant's accept queue until it accepts logins.

use pgwake_routing::{Admission, TenantId, WakeCoordinator};
use tokio::io::AsyncWriteExt;

use crate::error::SessionError;
use crate::stream::Stream;

/// Waits until `tenant` accepts logins, telling the client first when `notice` is set. A client
/// that hangs up meanwhile leaves the queue at once, instead of holding a place and getting a
/// backend connection nobody reads.
pub async fn wake(
    coordinator: &WakeCoordinator,
    client: &mut Stream,
    tenant: &TenantId,
    notice: bool,
) -> Result<Admission, SessionError> {
    if notice && !coordinator.is_awake(tenant) {
        // Boxed: the notice's write should not size a wait that may hold thousands of clients.
        Box::pin(tell_waking(client, tenant)).await?;
    }
    tokio::select! {
        a = coordinator.ensure_awake(tenant) => {
            a.map_err(|e| SessionError::Wake(tenant.clone(), e))
        }
        _ = client.hung_up() => Err(SessionError::client_left("its database was waking")),
    }
}

/// Tells the client its database is waking.
async fn tell_waking(client: &mut Stream, tenant: &TenantId) -> Result<(), SessionError> {
    let notice = pgwake_protocol::ErrorMessage::notice(
        "00000",
        format!("waking database for tenant \"{tenant}\""),
    );
    client
        .write_all(&notice.to_bytes())
        .await
        .map_err(SessionError::ClientIo)?;
    client.flush().await.map_err(SessionError::ClientIo)
}
