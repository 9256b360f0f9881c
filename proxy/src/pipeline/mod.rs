//! The pipeline a negotiated connection goes through, in order: route and admit
//! ([`admit`]), authenticate ([`authenticate`]), wake ([`wake`]), connect and log in (the
//! upstream [`Connector`]), then the session ([`Sessions`]). TCP, WebSocket and `/sql` share
//! its stages.

pub mod access;
pub mod admit;
pub mod authenticate;
pub mod route;
pub mod wake;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use pgwake_protocol::{CancelKey, StartupMessage};
use pgwake_routing::wake::SessionClient;
use pgwake_routing::{Admission, WakeCoordinator};
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

pub use access::AccessList;
pub use admit::Admitted;
pub use authenticate::Authenticator;
pub use route::{Profiles, Router, TenantProfile};

use crate::cancel::CancelMap;
use crate::capacity::ClientSlot;
use crate::error::{SessionError, fail};
use crate::metrics::Metrics;
use crate::peer::PeerCancels;
use crate::session::{Attached, Revivable, SessionStart, Sessions};
use crate::stream::Stream;
use crate::upstream::{ClientLogin, Connector, Upstream};

/// The stages, each a narrow handle of its own.
pub struct Pipeline {
    /// Finds tenants and their profiles.
    pub router: Router,
    /// Checks passwords.
    pub auth: Authenticator,
    /// Wakes tenants and holds connections while they wake.
    pub coordinator: Arc<WakeCoordinator>,
    /// Tell authenticated clients that must wait that their database is waking.
    pub wake_notice: bool,
    /// Opens backend connections.
    pub connector: Arc<Connector>,
    /// Relays, parks and revives sessions.
    pub sessions: Sessions,
    /// Gateway-issued cancel keys.
    pub cancels: Arc<CancelMap>,
    /// Forwards keys other replicas issued to them; none with a single replica.
    pub peers: Option<Arc<PeerCancels>>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Fires when the gateway begins to shut down: a connection that is not relaying yet has
    /// no transaction in flight, so it ends then (FATAL 57P01) instead of holding the shutdown
    /// for the grace period, and its client can reconnect elsewhere at once.
    pub draining: CancellationToken,
}

/// A session ready to relay, and whether its backend connection was a kept one.
struct Opened {
    start: Box<SessionStart>,
    reused: bool,
}

impl Pipeline {
    /// Forwards a cancel request to the backend its gateway-issued key maps to (or, for a key
    /// another replica issued, to that replica), then closes the client's connection properly
    /// (TLS close_notify: libpq 17 reports a cancel whose TLS session just breaks off as
    /// failed).
    pub async fn cancel_request(&self, key: &CancelKey, peer: SocketAddr, mut client: Stream) {
        match self.cancels.lookup(key) {
            Some(route) => {
                self.metrics.cancels_forwarded.inc();
                let connect_timeout = self.connector.connect_timeout();
                let to = route.describe();
                if let Err(e) = route.deliver(connect_timeout).await {
                    warn!(error = %e, backend = %to, "cancel not delivered");
                }
            }
            None => match &self.peers {
                Some(peers) => peers.forward(key, peer.ip()).await,
                None => debug!("cancel request with an unknown key dropped"),
            },
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), client.shutdown()).await;
    }

    /// Carries a client stream whose startup message has arrived through login and the relay,
    /// over TCP, TLS or a tunnel alike.
    // An async block, not an async fn, so that the arguments are not held twice for the
    // session's whole life.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn holds its arguments twice"
    )]
    pub fn run_session<'a>(
        &'a self,
        mut client: Stream,
        peer: SocketAddr,
        startup: StartupMessage,
        accepted_at: Instant,
        slot: &'a mut ClientSlot,
    ) -> impl Future<Output = ()> + Send + 'a {
        async move {
            if let Err(full) = slot.check_gateway() {
                let failed = fail(&self.metrics, Some(client), SessionError::Full(full));
                return Box::pin(failed).await;
            }
            let evicted = slot.eviction();
            // Boxed, the waits for a drain or an eviction too: the login's state is freed once it
            // is done instead of sizing every session's task (parked sessions should cost little).
            let opened = Box::pin(async {
                // Owned here, so that the token is freed with the login's state.
                let evicted = evicted;
                tokio::select! {
                    r = self.open_session(&mut client, peer, startup, slot) => r,
                    _ = self.draining.cancelled() => Err(SessionError::ShuttingDown),
                    _ = evicted.cancelled() => Err(SessionError::Evicted),
                }
            })
            .await;
            slot.logged_in();
            let opened = match opened {
                Ok(s) => s,
                Err(err) => return Box::pin(fail(&self.metrics, Some(client), err)).await,
            };
            let elapsed = accepted_at.elapsed();
            self.metrics.startup_duration.observe(elapsed.as_secs_f64());
            let (elapsed_ms, backend) =
                (elapsed.as_millis() as u64, &opened.start.attached.endpoint);
            if opened.reused {
                debug!(elapsed_ms, %backend, "kept backend connection reused");
            } else {
                debug!(elapsed_ms, %backend, "login relayed");
            }
            debug!(peer = %peer, "session ready");
            // Boxed: a connection still queued for a wake should not carry the relay's size.
            Box::pin(self.sessions.run(&mut client, opened.start)).await;
        }
    }

    /// Admits, authenticates, wakes and connects a client: the journey up to the relay.
    async fn open_session(
        &self,
        client: &mut Stream,
        peer: SocketAddr,
        mut startup: StartupMessage,
        slot: &mut ClientSlot,
    ) -> Result<Opened, SessionError> {
        if startup.needs_negotiation() {
            let unsupported = startup.unsupported_options();
            let msg = pgwake_protocol::backend::negotiate_protocol_version(unsupported);
            client
                .write_all(&msg)
                .await
                .map_err(SessionError::ClientIo)?;
        }
        // The SCRAM exchange and the backend login are boxed so that a connection queued in the
        // wake holds only the wake step's state, not the largest step's.
        let admitted = Box::pin(admit::admit(
            &self.router,
            &self.auth,
            client,
            peer,
            &mut startup,
            slot,
        ));
        let admitted = admitted.await?;
        // Only a client the gateway authenticated may learn that its database is waking.
        let notice = admitted.material.is_some() && self.wake_notice;
        let tenant = &admitted.tenant.id;
        let awake = wake::wake(&self.coordinator, client, tenant, notice).await?;
        let who = SessionClient {
            application_name: startup.get("application_name").map(str::to_owned),
            address: peer,
        };
        Box::pin(self.log_in(client, admitted, &startup, (awake, who))).await
    }

    /// Logs a woken client in on a backend connection, sealing its revival token first; `who`
    /// is the client as the operator sees it.
    async fn log_in(
        &self,
        client: &mut Stream,
        admitted: Admitted,
        startup: &StartupMessage,
        (awake, who): (Admission, SessionClient),
    ) -> Result<Opened, SessionError> {
        let Admitted {
            tenant,
            profile,
            user,
            material,
        } = admitted;
        let params: Vec<(String, String)> = startup.forwardable_params().cloned().collect();
        let checked = user.as_deref().zip(material.as_ref());
        let revivable = checked.and_then(|(user, material)| {
            let revival = self
                .sessions
                .revival
                .as_ref()
                .filter(|r| r.config.enabled)?;
            let who = (&tenant.id, user, profile.tls);
            Some(Revivable::seal(revival, who, &params, material))
        });
        let login = ClientLogin {
            tenant: &tenant.id,
            endpoint: &awake.endpoint,
            tls: profile.tls,
            params: &params,
            checked,
            reuse_passthrough: profile.reuse_passthrough,
        };
        let up = Box::pin(self.connector.for_client(client, login)).await?;
        Ok(Opened::new(up, awake, revivable, who))
    }
}

impl Opened {
    /// The session that starts on backend connection `up` to the tenant `awake` admitted.
    fn new(
        up: Upstream,
        awake: Admission,
        revivable: Option<Revivable>,
        client: SessionClient,
    ) -> Opened {
        let attached = Attached {
            stream: up.stream,
            slot: up.slot,
            claim: awake.claim,
            endpoint: awake.endpoint,
        };
        let start = SessionStart {
            attached,
            cancel: up.cancel,
            revivable,
            returnable: up.returnable,
            client,
        };
        Opened {
            start: Box::new(start),
            reused: up.reused,
        }
    }
}
