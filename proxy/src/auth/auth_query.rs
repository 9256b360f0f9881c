//! The `auth_query` credential source: verifiers read from the tenant's own database with a
//! configured role and query, cached for a while.
//!
//! The trade-off: the lookup needs that database awake, so a login attempt for a sleeping tenant
//! wakes it before the password is checked. Tenants whose wake must stay protected by the
//! password use `static` (or, on Kubernetes, a Secret) instead.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use moka::future::Cache;
use pgwake_routing::{TenantId, WakeCoordinator};
use tokio_postgres::NoTls;

use super::{Credential, CredentialError, CredentialSource, parse_secret};

/// Settings of one tenant's `auth_query`.
#[derive(Clone, Debug)]
pub struct AuthQuerySettings {
    /// Role the gateway logs in as.
    pub user: String,
    /// Its password.
    pub password: String,
    /// Database to connect to.
    pub database: String,
    /// Query: `$1` is the user name; returns (name, verifier).
    pub query: String,
    /// How long answers are cached.
    pub ttl: Duration,
    /// Time to connect and run the query.
    pub timeout: Duration,
}

/// Looks users up on the tenant's database.
pub struct AuthQuerySource {
    tenant: TenantId,
    settings: AuthQuerySettings,
    coordinator: Arc<WakeCoordinator>,
    cache: Cache<String, Option<Arc<Credential>>>,
}

impl AuthQuerySource {
    /// A source for `tenant`, waking it through `coordinator` when a lookup needs it.
    pub fn new(
        tenant: TenantId,
        settings: AuthQuerySettings,
        coordinator: Arc<WakeCoordinator>,
    ) -> AuthQuerySource {
        let cache = Cache::builder()
            .max_capacity(10_000)
            .time_to_live(settings.ttl)
            .build();
        AuthQuerySource {
            tenant,
            settings,
            coordinator,
            cache,
        }
    }

    async fn fetch(&self, user: &str) -> Result<Option<Arc<Credential>>, CredentialError> {
        let unavailable = |e: &dyn std::fmt::Display| CredentialError::Unavailable(e.to_string());
        let admission = self
            .coordinator
            .ensure_awake(&self.tenant)
            .await
            .map_err(|e| unavailable(&e))?;
        let s = &self.settings;
        let mut config = tokio_postgres::Config::new();
        config
            .host(&admission.endpoint.host)
            .port(admission.endpoint.port)
            .user(&s.user)
            .password(&s.password)
            .dbname(&s.database)
            .application_name("pgwake-auth-query")
            .connect_timeout(s.timeout);
        let lookup = async {
            let (client, conn) = config.connect(NoTls).await.map_err(|e| unavailable(&e))?;
            let conn = tokio::spawn(conn);
            let rows = client
                .query(&s.query, &[&user])
                .await
                .map_err(|e| unavailable(&e))?;
            drop(client);
            let _ = conn.await;
            Ok::<_, CredentialError>(rows)
        };
        let rows = tokio::time::timeout(s.timeout, lookup)
            .await
            .map_err(|_| CredentialError::Unavailable("auth_query timed out".into()))??;
        drop(admission);
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let secret: Option<String> = row
            .try_get(1)
            .map_err(|e| CredentialError::Invalid(format!("auth_query result: {e}")))?;
        match secret {
            None => Ok(None),
            // Verifiers from Postgres need no PBKDF2; a plain password would, so compute it
            // off the runtime's threads.
            Some(secret) => tokio::task::spawn_blocking(move || parse_secret(&secret))
                .await
                .map_err(|e| CredentialError::Unavailable(e.to_string()))?
                .map(|c| Some(Arc::new(c))),
        }
    }
}

#[async_trait]
impl CredentialSource for AuthQuerySource {
    fn kind(&self) -> &'static str {
        "auth_query"
    }

    async fn lookup(&self, user: &str) -> Result<Option<Arc<Credential>>, CredentialError> {
        if let Some(hit) = self.cache.get(user).await {
            return Ok(hit);
        }
        let found = self.fetch(user).await?;
        self.cache.insert(user.to_owned(), found.clone()).await;
        Ok(found)
    }

    async fn failed(&self, user: &str) {
        self.cache.invalidate(user).await;
    }
}
