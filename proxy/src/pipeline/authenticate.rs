//! Authentication at the gateway: SCRAM with the client (or a cleartext password inside an
//! encrypted link), checked against the tenant's credential source with the failure throttle
//! around it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use pgwake_routing::TenantId;
use tokio::io::AsyncWriteExt;

use super::route::TenantRefusal;
use crate::auth::client::authenticate_client;
use crate::auth::password::PasswordChecker;
use crate::auth::throttle::{Reservation, Throttle};
use crate::auth::{CredentialSource, LoginMaterial, NoUsers};
use crate::capacity::ClientSlot;
use crate::config::UnknownTenant;
use crate::error::SessionError;
use crate::metrics::Metrics;
use crate::stream::Stream;
use crate::wire::read_password_message;

/// Checks clients' passwords.
pub struct Authenticator {
    /// Failed-authentication throttle.
    pub throttle: Throttle,
    /// Key for mock SCRAM salts of unknown users (each tenant's derived from it: see
    /// `Authenticator::mock_key_for`).
    pub mock_key: Vec<u8>,
    /// Cleartext password checks (HTTP and WebSocket logins, passwords naming their tenant).
    pub passwords: PasswordChecker,
    /// Largest message accepted from a client during a login.
    pub max_client_message: usize,
    /// Time for a client to finish authenticating.
    pub timeout: Duration,
    /// Metrics.
    pub metrics: Arc<Metrics>,
}

impl Authenticator {
    /// Checks the client's password with the throttle around it: SCRAM, or a cleartext
    /// password for WebSocket clients (the serverless driver sends it in the clear inside the
    /// tunnel, often pipelined right behind the startup message). `slot` is told when the
    /// exchange has begun (the client's first answer arrived), for whom to end first when
    /// connections still logging in must make room.
    pub async fn authenticate(
        &self,
        client: &mut Stream,
        peer: SocketAddr,
        tenant: &TenantId,
        source: &dyn CredentialSource,
        user: &str,
        slot: &mut ClientSlot,
    ) -> Result<LoginMaterial, SessionError> {
        let deadline = self.refuse_throttled(peer, tenant, user)?;
        if client.is_tunnel() {
            let password = self.ask_cleartext_password(client).await?;
            slot.progressed();
            let material = self
                .check_password(peer, tenant, source, user, &password)
                .await?;
            return self.accept(client, material).await;
        }
        let credential = source.lookup(user).await.map_err(|e| {
            self.metrics.auth_attempt("error");
            SessionError::AuthUnavailable(e.to_string())
        })?;
        // The certificate this client's handshake was served, even if a reload came since.
        let channel_binding = client.channel_binding().map(<[u8]>::to_vec);
        let mut reservation = None;
        let reserve = async || {
            let r = self
                .throttle
                .reserve(peer.ip(), tenant, user, deadline)
                .await;
            reservation = Some(r.map_err(SessionError::Throttled)?);
            Ok(())
        };
        let result = authenticate_client(
            client,
            user,
            credential,
            channel_binding,
            &self.mock_key_for(tenant),
            self.max_client_message,
            (|| slot.progressed(), reserve),
        )
        .await;
        self.attempt_done(peer, tenant, source, user, reservation, &result);
        self.share_outcome(peer, tenant, source, user, &result)
            .await;
        result
    }

    /// The deadline of an attempt starting now, or its refusal when the throttle's wait already
    /// outlasts it (a shorter wait is sat out when the attempt is reserved, so a client sharing
    /// its address with one that fails gets in late rather than not at all).
    fn refuse_throttled(
        &self,
        peer: SocketAddr,
        tenant: &TenantId,
        user: &str,
    ) -> Result<std::time::Instant, SessionError> {
        match self.throttle.blocked_for(peer.ip(), tenant, user) {
            Some(wait) if wait > self.timeout => {
                self.metrics.auth_attempt("throttled");
                Err(SessionError::Throttled(wait))
            }
            _ => Ok(std::time::Instant::now() + self.timeout),
        }
    }

    /// The key of `tenant`'s mock salts. A salt that depended on the user name alone would be
    /// the same under every tenant that does not exist (or is refused) and differ under one
    /// where the user is real: probing one common user name across tenants would tell which
    /// exist. Keyed by tenant too, every tenant answers with its own stable salt, real or not.
    fn mock_key_for(&self, tenant: &TenantId) -> Vec<u8> {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &self.mock_key);
        ring::hmac::sign(&key, tenant.as_str().as_bytes())
            .as_ref()
            .to_vec()
    }

    /// Tells a client whose password was checked in the clear that it is in.
    pub async fn accept(
        &self,
        client: &mut Stream,
        material: LoginMaterial,
    ) -> Result<LoginMaterial, SessionError> {
        client
            .write_all(&pgwake_protocol::auth::authentication_ok())
            .await
            .map_err(SessionError::ClientIo)?;
        Ok(material)
    }

    /// Asks the client for its password in the clear (only over an encrypted link) and reads it.
    pub async fn ask_cleartext_password(
        &self,
        client: &mut Stream,
    ) -> Result<String, SessionError> {
        client
            .write_all(&pgwake_protocol::auth::authentication_cleartext_password())
            .await
            .map_err(SessionError::ClientIo)?;
        client.flush().await.map_err(SessionError::ClientIo)?;
        let m = read_password_message(client, self.max_client_message).await?;
        let text = pgwake_protocol::auth::parse_password_message(m.body())
            .map_err(|e| SessionError::ClientProtocol(e.to_string()))?;
        String::from_utf8(text.to_vec())
            .map_err(|_| SessionError::ClientProtocol("password is not valid UTF-8".into()))
    }

    /// Checks a cleartext password for `user` of `tenant` against the tenant's credential
    /// source, with the same throttle and metrics as a SCRAM login.
    pub async fn check_password(
        &self,
        peer: SocketAddr,
        tenant: &TenantId,
        source: &dyn CredentialSource,
        user: &str,
        password: &str,
    ) -> Result<LoginMaterial, SessionError> {
        let deadline = self.refuse_throttled(peer, tenant, user)?;
        let credential = source.lookup(user).await.map_err(|e| {
            self.metrics.auth_attempt("error");
            SessionError::AuthUnavailable(e.to_string())
        })?;
        // The password this credential was recently verified with (a `/sql` client sends it
        // with every request): a success known without the work, so there is no attempt to
        // reserve against concurrent guesses. Only the block checked above applies, and the
        // success takes back this attempter's earlier failures as any success does. A wrong
        // password never gets here, so guesses are still reserved and counted below.
        if let Some(material) = credential
            .as_ref()
            .and_then(|c| self.passwords.recall(tenant, user, c, password))
        {
            let result = Ok(material);
            self.attempt_done(peer, tenant, source, user, None, &result);
            self.share_outcome(peer, tenant, source, user, &result)
                .await;
            return result;
        }
        let reserved = self.throttle.reserve(peer.ip(), tenant, user, deadline);
        let (reservation, result) = match reserved.await {
            Err(wait) => (None, Err(SessionError::Throttled(wait))),
            Ok(r) => {
                self.metrics.password_hashes.inc();
                let material = match credential {
                    Some(c) => self.passwords.check(tenant, user, c, password).await,
                    // The same key derivation as for a known user, so timing tells nothing.
                    None => {
                        self.passwords
                            .check_unknown(&self.mock_key_for(tenant), user, password)
                            .await;
                        None
                    }
                };
                let result = material.ok_or_else(|| SessionError::AuthFailed(user.to_owned()));
                (Some(r), result)
            }
        };
        self.attempt_done(peer, tenant, source, user, reservation, &result);
        self.share_outcome(peer, tenant, source, user, &result)
            .await;
        result
    }

    /// The answer to a client naming a tenant that does not exist or is forbidden to it: by
    /// default the very exchange and answer of a wrong password (`routing.unknown_tenant`).
    pub async fn refuse_unknown_tenant(
        &self,
        refusal: &TenantRefusal,
        client: &mut Stream,
        peer: SocketAddr,
        tenant: &TenantId,
        user: Option<&str>,
        slot: &mut ClientSlot,
    ) -> SessionError {
        let refused = |hidden_as: Option<&str>| SessionError::UnknownTenant {
            tenant: tenant.to_string(),
            forbidden: refusal.forbidden,
            hidden_as: hidden_as.map(str::to_owned),
            nearest: refusal.nearest.as_ref().map(TenantId::to_string),
        };
        if refusal.answer == UnknownTenant::Reveal {
            return refused(None);
        }
        let Some(user) = user else {
            return SessionError::NoUser;
        };
        let login = self.authenticate(client, peer, tenant, &NoUsers, user, slot);
        match tokio::time::timeout(self.timeout, login).await {
            Err(_) => SessionError::AuthTimeout,
            Ok(Err(SessionError::AuthFailed(user))) => refused(Some(&user)),
            Ok(Err(e)) => e,
            // Nobody logs in against no users; refuse all the same.
            Ok(Ok(_)) => refused(Some(user)),
        }
    }

    /// Like [`Authenticator::refuse_unknown_tenant`], for a client whose cleartext password is
    /// already in hand (`/sql`, a tenant named in the password): by default the work and answer
    /// of a wrong one.
    pub async fn refuse_unknown_password(
        &self,
        refusal: &TenantRefusal,
        peer: SocketAddr,
        tenant: &TenantId,
        user: &str,
        password: &str,
    ) -> SessionError {
        let mut hidden_as = None;
        if refusal.answer == UnknownTenant::PasswordFailed {
            match self
                .check_password(peer, tenant, &NoUsers, user, password)
                .await
            {
                Err(SessionError::AuthFailed(user)) => hidden_as = Some(user),
                Err(e) => return e,
                Ok(_) => hidden_as = Some(user.to_owned()),
            }
        }
        SessionError::UnknownTenant {
            tenant: tenant.to_string(),
            forbidden: refusal.forbidden,
            hidden_as,
            nearest: refusal.nearest.as_ref().map(TenantId::to_string),
        }
    }

    /// Tells the fleet's throttle counts and the credential source how an evaluated attempt
    /// ended, before the client hears it (so its next try, on any replica or session thread,
    /// finds the failure there and no stale cached credential).
    async fn share_outcome<T>(
        &self,
        peer: SocketAddr,
        tenant: &TenantId,
        source: &dyn CredentialSource,
        user: &str,
        result: &Result<T, SessionError>,
    ) {
        let failed = match result {
            Ok(_) => false,
            Err(SessionError::AuthFailed(_)) => true,
            Err(_) => return,
        };
        if failed {
            source.failed(user).await;
        }
        self.throttle
            .share_outcome(peer.ip(), tenant, user, failed)
            .await;
    }

    /// Counts an authentication attempt's outcome and settles it with the local throttle: a
    /// success takes its `reservation` (if it made one) back, anything else leaves it counted.
    fn attempt_done<T>(
        &self,
        peer: SocketAddr,
        tenant: &TenantId,
        source: &dyn CredentialSource,
        user: &str,
        reservation: Option<Reservation<'_>>,
        result: &Result<T, SessionError>,
    ) {
        match result {
            Ok(_) => {
                self.metrics.auth_attempt("ok");
                match reservation {
                    Some(r) => r.success(),
                    None => self.throttle.success(peer.ip(), tenant, user),
                }
            }
            // The mock exchange for a tenant that does not exist (or refuses the address).
            Err(SessionError::AuthFailed(_)) if source.kind() == NoUsers.kind() => {
                self.metrics.auth_attempt("unknown_tenant")
            }
            Err(SessionError::AuthFailed(_)) => self.metrics.auth_attempt("failed"),
            Err(SessionError::Throttled(_)) => self.metrics.auth_attempt("throttled"),
            Err(_) => self.metrics.auth_attempt("error"),
        }
    }
}
