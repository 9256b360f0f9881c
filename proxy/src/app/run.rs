//! Running the gateway: its listeners, the admin API and background jobs, until shutdown; then
//! draining sessions and stopping the local servers it started.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use pgwake_routing::backend::ClaimError;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use super::{Gateway, build};
use crate::admin::{self, AdminLimits, AdminState};
use crate::capacity::CapacitySettings;
use crate::config::Config;
use crate::{front, http};

/// How long terminated sessions get to deliver their last message before the process exits.
const TERMINATE_DRAIN: Duration = Duration::from_secs(5);

/// How the gateway is asked to stop: usually by signals (see the `pgwake` command), by hand in
/// tests.
#[derive(Clone, Debug, Default)]
pub struct StopRequest {
    /// Begins the shutdown: stop accepting and drain.
    pub drain: CancellationToken,
    /// Sessions at rest (no transaction open, nothing in flight) end at once, the others as
    /// soon as they come to rest, instead of going on through the grace period. Fired together
    /// with `drain` when whoever stops the gateway does not wait for clients (Ctrl-C).
    pub end_idle: CancellationToken,
    /// Ends what is left of the grace period: every session is terminated now.
    pub now: CancellationToken,
}

/// Takes the local backend's data folder for this process (refusing while another gateway
/// serves it) and stops the postmasters an earlier run left in it.
async fn claim_local_data(gateway: &Gateway) -> anyhow::Result<()> {
    let Some(local) = &gateway.local else {
        return Ok(());
    };
    local.claim().map_err(|e| match e {
        ClaimError::InUse { pid, .. } => anyhow::anyhow!(
            "{e}: stop it first{}, or set local.data_dir to another folder",
            pid.map(|p| format!(" (kill {p})")).unwrap_or_default()
        ),
        ClaimError::Io(_) => anyhow::anyhow!("local.data_dir: {e}"),
    })?;
    for t in gateway.pipeline().router.directory.all() {
        local.stop_stale(&t.id).await;
    }
    Ok(())
}

/// Serves until `stop_request.drain` fires, then drains: stop accepting, `/readyz` 503,
/// connections not yet relaying (held for a wake, waiting for a backend connection, logging in)
/// end at once with FATAL 57P01, relaying sessions get `shutdown_grace` (idle ones none with
/// `end_idle`; nobody any more once `now` fires), then the rest end with 57P01 too;
/// last the local servers it started are stopped, one whose wake is under way included.
pub async fn run(
    config: Config,
    stop_request: StopRequest,
    banner: Option<String>,
) -> anyhow::Result<()> {
    let terminate = CancellationToken::new();
    let gateway = Arc::new(build(&config, terminate.clone(), stop_request.end_idle.clone()).await?);
    let listener = bind("listen.postgres", config.listen.postgres).await?;
    // Bound before the admin listener, so /readyz never answers for a gateway that then fails.
    let peer_listener = bind_some("listen.peer", config.listen.peer).await?;
    let http_listener = bind_some("listen.http", config.listen.http).await?;
    claim_local_data(&gateway).await?;
    let admin_state = admin_state(&config, &gateway)?;
    let sleeper_stop = CancellationToken::new();
    let replenisher = start_background_jobs(&gateway, &sleeper_stop);
    watch_certificates(&config, &gateway, &sleeper_stop);
    if let Some(admin_listener) = bind_some("listen.admin", config.listen.admin).await? {
        let limits = AdminLimits {
            max_connections: config.admin.max_connections,
            header_timeout: config.admin.header_timeout,
            idle_timeout: config.admin.idle_timeout,
        };
        tokio::spawn(admin::serve(admin_listener, admin_state.clone(), limits));
    }
    info!(
        postgres = %config.listen.postgres,
        admin = ?config.listen.admin,
        http = ?config.listen.http,
        peer = ?config.listen.peer,
        tenants = gateway.pipeline().router.directory.len(),
        tls = config.tls.is_some(),
        "pgwake serving"
    );
    if let Some(b) = banner {
        println!("{b}");
    }
    let tasks = TaskTracker::new();
    // Stops the accept loops and ends the connections not relaying yet.
    let stop = gateway.pipeline().draining.clone();
    // Served until the sessions are gone (not just until accepting stops): draining sessions'
    // clients may still cancel through another replica.
    if let (Some(l), Some(peers)) = (peer_listener, &gateway.pipeline().peers) {
        let max = config.peer.max_connections;
        tokio::spawn(peers.clone().serve(l, max, gateway.front.terminate.clone()));
    }
    let shards = Arc::new(
        front::Shards::start(config.listen.session_threads)
            .map_err(|e| anyhow::anyhow!("cannot start the session threads: {e}"))?,
    );
    let accept = tokio::spawn(front::serve(
        listener,
        gateway.front.clone(),
        shards.clone(),
        tasks.clone(),
        stop.clone(),
    ));

    let http_accept = http_listener.map(|l| {
        let state = Arc::new(http::HttpState::new(
            gateway.front.clone(),
            gateway.certificates.clone(),
            config.http.clone(),
            config.listen.allow_plaintext,
        ));
        let (shards, tasks) = (shards.clone(), tasks.clone());
        tokio::spawn(http::serve(l, state, shards, tasks, stop.clone()))
    });

    stop_request.drain.cancelled().await;
    stop.cancel();
    let _ = accept.await;
    if let Some(h) = http_accept {
        let _ = h.await;
    }
    // Only once the listeners are closed: a 503 from /readyz promises that a new connection is
    // refused, which a probe or a test may rely on.
    admin_state.ready.store(false, Ordering::Relaxed);
    tasks.close();
    let grace = config.limits.shutdown_grace;
    drain(&gateway, &tasks, grace, &stop_request, &terminate).await;
    sleeper_stop.cancel();
    if let Some(r) = replenisher {
        // It gives its Leases up, so another replica replenishes without waiting them out.
        let _ = tokio::time::timeout(TERMINATE_DRAIN, r).await;
    }
    if let Some(local) = &gateway.local {
        local.stop_all().await;
    }
    // Ends the Kubernetes watches.
    gateway.front.terminate.cancel();
    Ok(())
}

/// Reloads the certificates when their files change, until `stop`.
fn watch_certificates(config: &Config, gateway: &Gateway, stop: &CancellationToken) {
    if let (Some(certs), Some(tls)) = (&gateway.certificates, &config.tls) {
        let metrics = gateway.front.metrics.clone();
        let on_error = move || metrics.error("tls_reload");
        tokio::spawn(
            certs
                .clone()
                .watch(tls.watch_interval, stop.clone(), on_error),
        );
    }
}

/// What the admin API serves from: the gateway's metrics and tenants, readiness, the token.
fn admin_state(config: &Config, gateway: &Gateway) -> anyhow::Result<Arc<AdminState>> {
    Ok(Arc::new(AdminState {
        metrics: gateway.front.metrics.clone(),
        coordinator: gateway.pipeline().coordinator.clone(),
        ready: true.into(),
        token: read_admin_token(config)?,
        hosts: config.admin.hosts.clone(),
        started: std::time::Instant::now(),
    }))
}

/// A listener on `addr` (`key` names it in the error).
async fn bind(key: &str, addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("{key}: cannot listen on {addr}: {e}"))
}

/// A listener on `addr` when one is configured.
async fn bind_some(key: &str, addr: Option<SocketAddr>) -> anyhow::Result<Option<TcpListener>> {
    match addr {
        Some(addr) => bind(key, addr).await.map(Some),
        None => Ok(None),
    }
}

/// The admin API's bearer token, from `[admin] token_file`.
fn read_admin_token(config: &Config) -> anyhow::Result<Option<String>> {
    let Some(path) = &config.admin.token_file else {
        return Ok(None);
    };
    let token = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("admin.token_file: cannot read {}: {e}", path.display()))?
        .trim()
        .to_owned();
    if token.is_empty() {
        anyhow::bail!("admin.token_file: {} is empty", path.display());
    }
    Ok(Some(token))
}

/// Starts the idle sleeper, the reuse reaper and the warm-pool replenisher until `stop`; the
/// replenisher's task is returned so shutdown can wait for it to give its Leases up.
fn start_background_jobs(
    gateway: &Gateway,
    stop: &CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    let pipeline = gateway.pipeline();
    let sleeper = pipeline.coordinator.clone();
    tokio::spawn(sleeper.run_idle_sleeper(stop.clone(), pipeline.draining.clone()));
    let (connector, stop_reaper) = (pipeline.connector.clone(), stop.clone());
    tokio::spawn(async move { connector.run_reaper(stop_reaper).await });
    gateway
        .pool
        .clone()
        .map(|pool| tokio::spawn(pool.run_replenisher(stop.clone())))
}

/// Lets sessions finish within `grace` (or until `stop.now`), then ends the rest (FATAL 57P01
/// at their next message boundary) and waits a little for them to go.
async fn drain(
    gateway: &Gateway,
    tasks: &TaskTracker,
    grace: Duration,
    stop: &StopRequest,
    terminate: &CancellationToken,
) {
    let active = gateway.front.metrics.connections_active.get();
    let idle = match stop.end_idle.is_cancelled() {
        true => "idle sessions end now, ",
        false => "",
    };
    info!(
        active,
        grace = ?grace,
        "shutting down: {idle}waiting for sessions (signal again to end them now)"
    );
    let why = tokio::select! {
        _ = tasks.wait() => return,
        _ = tokio::time::sleep(grace) => "grace period over",
        _ = stop.now.cancelled() => "asked again",
    };
    info!(
        remaining = gateway.front.metrics.connections_active.get(),
        "{why}: terminating sessions"
    );
    terminate.cancel();
    let _ = tokio::time::timeout(TERMINATE_DRAIN, tasks.wait()).await;
}

/// The most backend connections the gateway can hold at once, when the configuration bounds
/// them: every tenant capped by `max_backend_connections`, plus `/sql`'s pool when the HTTP
/// listener is on. Discovered tenants have no cap, so discovery leaves them unbounded.
fn backend_bound(config: &crate::config::Config) -> Option<u64> {
    if config.kubernetes.discover {
        return None;
    }
    let tenants: Option<usize> = config
        .tenants
        .iter()
        .map(|t| t.max_backend_connections)
        .sum();
    let pool = match config.listen.http {
        Some(_) => config.http.pool_max_total,
        None => 0,
    };
    Some((tenants? + pool) as u64)
}

/// The connection caps of `[limits]`, lowered to what the process's file limit can hold.
pub(super) fn capacity_settings(config: &crate::config::Config) -> CapacitySettings {
    let limits = &config.limits;
    let configured = CapacitySettings {
        max_clients: limits.max_client_connections,
        max_unauthenticated: limits.max_unauthenticated_connections,
    };
    let Ok((soft, _)) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    else {
        return configured;
    };
    // The admin and peer listeners' connections are capped on their own, beside the clients'.
    let admin = match config.listen.admin {
        Some(_) => config.admin.max_connections as u64,
        None => 0,
    };
    let peer = match config.listen.peer {
        Some(_) => config.peer.max_connections as u64,
        None => 0,
    };
    let fitted = configured.fitted_to(soft, backend_bound(config), admin + peer);
    // The default caps are more than an ordinary file limit (1024) can hold, so lowering them is
    // what every start on an ordinary machine does, not news; a cap someone chose and the
    // process cannot hold is.
    let defaults = crate::config::Limits::default();
    let clients_lowered = fitted.max_clients < configured.max_clients;
    let unauthenticated_lowered = fitted.max_unauthenticated < configured.max_unauthenticated;
    let chosen_and_lowered = (clients_lowered
        && configured.max_clients != defaults.max_client_connections)
        || (unauthenticated_lowered
            && configured.max_unauthenticated != defaults.max_unauthenticated_connections);
    if chosen_and_lowered {
        warn!(
            open_files = soft,
            max_client_connections = fitted.max_clients,
            max_unauthenticated_connections = fitted.max_unauthenticated,
            "the file limit holds fewer connections than configured: caps lowered (raise it with ulimit -n)"
        );
    } else if clients_lowered || unauthenticated_lowered {
        debug!(
            open_files = soft,
            max_client_connections = fitted.max_clients,
            max_unauthenticated_connections = fitted.max_unauthenticated,
            "the file limit holds fewer connections than the default caps: caps lowered"
        );
    }
    fitted
}
