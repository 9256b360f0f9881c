//! Who a connection is for and where that tenant's database runs: tenant identity, the rules
//! that find a tenant in a connection's startup, the tenant directory and compute backends.

pub mod activity;
pub mod backend;
pub mod directory;
pub mod discovery;
pub mod lease;
pub mod predict;
pub mod private_file;
pub mod resolver;
pub mod tenant;
pub mod wake;

pub use backend::{BackendError, ComputeBackend, ComputeState, Endpoint};
pub use directory::{Tenant, TenantDirectory};
pub use predict::{Pattern, PredictPolicy};
pub use resolver::{ResolveError, Resolved, ResolverConfig, Rule, Source, TenantResolver};
pub use tenant::{InvalidTenantId, TenantId};
pub use wake::{
    Admission, ParkedMark, Phase, PredictSettings, RunStatus, TenantStatus, WAKE_HISTORY,
    WakeClaim, WakeCoordinator, WakeError, WakeEvent, WakeRecord, WakeSettings,
};
