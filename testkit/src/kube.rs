//! A real Kubernetes API server for tests: etcd plus kube-apiserver on 127.0.0.1, with the
//! CloudNativePG `Cluster` CRD installed.
//!
//! The Kubernetes backends are tested against the real API (RBAC, CRDs, status subresources,
//! patches, optimistic concurrency) rather than a mock. There is no controller manager, scheduler,
//! kubelet or CNPG operator: nothing writes a `Cluster`'s status, so tests play the operator by
//! patching `/status` as admin, and namespaces never finish deleting.
//!
//! The binaries are built from Go modules by `testkit/k8s/build.sh` on first use and cached under
//! `${XDG_CACHE_HOME:-$HOME/.cache}/pgwake/k8s/<version>/bin` (10-18 minutes on two cores, once
//! per machine). `PGWAKE_K8S_BIN` points at prebuilt binaries instead; `PGWAKE_K8S_VERSION` picks
//! another Kubernetes version; `PGWAKE_GO` names the `go` command to build with.
//! CloudNativePG's own `Cluster` CRD comes the same way, from the operator's Go module
//! (`build.sh cnpg-crd`, seconds; `PGWAKE_CNPG_CRD` names another copy), so `Cluster` objects
//! are validated against the real schema.
//!
//! `deploy/` is tested here too: [`render_kustomization`] renders one of its kustomizations with
//! kustomize (built by `build.sh kustomize` and cached the same way), [`KubeLab::dry_run`] has the
//! API server validate the result without storing it, and [`KubeLab::deploy_rbac_token`] gives a
//! test the gateway's identity exactly as `deploy/` defines it.
//!
//! ```no_run
//! use pgwake_testkit::kube::KubeLab;
//!
//! let lab = KubeLab::shared();
//! lab.ensure_namespace("tenant-a").unwrap();
//! let token = lab.service_account_token("tenant-a", "pgwake").unwrap();
//! let resp = lab
//!     .request_as(&token, "GET", "/api/v1/namespaces/tenant-a/secrets", None)
//!     .unwrap();
//! assert_eq!(resp.status, 403);
//! ```

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::sleep;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};
use ureq::tls::{Certificate, RootCerts, TlsConfig};

use crate::free_port;

/// The Kubernetes version built when `PGWAKE_K8S_VERSION` is unset.
pub const DEFAULT_K8S_VERSION: &str = "1.37.2";

/// Where the `Cluster` objects of a namespace live, for building request paths.
pub fn clusters_path(namespace: &str) -> String {
    format!("/apis/postgresql.cnpg.io/v1/namespaces/{namespace}/clusters")
}

/// The directory holding `build.sh`, `up.sh` and `down.sh`.
pub fn scripts_dir() -> PathBuf {
    repo_root().join("testkit/k8s")
}

/// The repository's root, found at run time from where cargo runs the test (a package's
/// folder) and only then from where this crate was compiled: a build cache shared between
/// checkouts may hold a testkit compiled in a checkout that is gone.
fn repo_root() -> PathBuf {
    let runtime = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .into_iter()
        .chain(std::env::current_dir().ok());
    for start in runtime {
        if let Some(root) = start
            .ancestors()
            .find(|dir| dir.join("testkit/k8s").is_dir())
        {
            return root.to_path_buf();
        }
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `build.sh` (a no-op when the binaries are cached) and returns the directory holding
/// `etcd` and `kube-apiserver`. Honors `PGWAKE_K8S_BIN`, which skips the build altogether.
pub fn ensure_binaries() -> io::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("PGWAKE_K8S_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let version =
        std::env::var("PGWAKE_K8S_VERSION").unwrap_or_else(|_| DEFAULT_K8S_VERSION.to_owned());
    // stderr is inherited so a first, long build shows its progress instead of looking hung.
    let out = Command::new(scripts_dir().join("build.sh"))
        .arg(&version)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()?;
    match out.status.code() {
        Some(0) => {}
        Some(127) => {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "no Go toolchain to build kube-apiserver and etcd with: install Go \
                 (expected at /usr/local/go/bin/go or on PATH), set PGWAKE_GO to the go \
                 command, or set PGWAKE_K8S_BIN to a directory with prebuilt binaries",
            ));
        }
        _ => {
            return Err(io::Error::other(format!(
                "testkit/k8s/build.sh {version} failed ({}); its output is above",
                out.status
            )));
        }
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = stdout
        .lines()
        .last()
        .map(|l| PathBuf::from(l.trim()))
        .ok_or_else(|| io::Error::other("build.sh printed no binary directory"))?;
    Ok(dir)
}

/// Runs `build.sh kustomize` (a no-op when it is cached) and returns the path of the `kustomize`
/// binary. `PGWAKE_KUSTOMIZE` names a prebuilt one instead.
pub fn ensure_kustomize() -> io::Result<PathBuf> {
    build_sh_path("kustomize", "PGWAKE_KUSTOMIZE")
}

/// Runs `build.sh cnpg-crd` (a no-op when it is cached) and returns the path of CloudNativePG's
/// own `Cluster` CRD, fetched from the operator's Go module at the release `build.sh` pins.
/// `PGWAKE_CNPG_CRD` names another copy of that file instead.
pub fn ensure_cnpg_crd() -> io::Result<PathBuf> {
    build_sh_path("cnpg-crd", "PGWAKE_CNPG_CRD")
}

/// Runs `build.sh MODE`, which prints the path of what it built or fetched last, unless the
/// environment variable `override_var` already names that path.
fn build_sh_path(mode: &str, override_var: &str) -> io::Result<PathBuf> {
    if let Some(path) = std::env::var_os(override_var) {
        return Ok(PathBuf::from(path));
    }
    let out = Command::new(scripts_dir().join("build.sh"))
        .arg(mode)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "testkit/k8s/build.sh {mode} failed ({}); its output is above{}",
            out.status,
            if out.status.code() == Some(127) {
                format!(" (no Go toolchain: install Go or set {override_var})")
            } else {
                String::new()
            }
        )));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .last()
        .map(|l| PathBuf::from(l.trim()))
        .ok_or_else(|| io::Error::other(format!("build.sh {mode} printed no path")))
}

/// The repository's `deploy/` folder.
pub fn deploy_dir() -> PathBuf {
    repo_root().join("deploy")
}

/// Renders the kustomization in `dir` (e.g. `deploy_dir().join("base")`) with kustomize and
/// returns its objects as JSON, in kustomize's order.
pub fn render_kustomization(dir: &Path) -> io::Result<Vec<Value>> {
    let out = Command::new(ensure_kustomize()?)
        .arg("build")
        .arg(dir)
        .stdin(Stdio::null())
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "kustomize build {} failed ({}): {}",
            dir.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    parse_manifests(&String::from_utf8_lossy(&out.stdout))
}

/// Parses a multi-document YAML manifest into one JSON value per non-empty document.
pub fn parse_manifests(yaml: &str) -> io::Result<Vec<Value>> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml)
        .map_err(|e| io::Error::other(format!("manifest is not valid YAML: {e}")))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// `kind/name` (or `kind/generateName*`) of a manifest object, for messages.
pub fn object_label(obj: &Value) -> String {
    let meta = &obj["metadata"];
    match meta["name"].as_str() {
        Some(name) => format!("{}/{name}", obj["kind"].as_str().unwrap_or("?")),
        None => format!(
            "{}/{}*",
            obj["kind"].as_str().unwrap_or("?"),
            meta["generateName"].as_str().unwrap_or("?")
        ),
    }
}

/// A status code and body from the API server.
#[derive(Clone, Debug)]
pub struct ApiResponse {
    /// HTTP status code.
    pub status: u16,
    /// The body as text (JSON for API objects and `Status` errors).
    pub body: String,
}

impl ApiResponse {
    /// The body parsed as JSON.
    pub fn json(&self) -> io::Result<Value> {
        serde_json::from_str(&self.body)
            .map_err(|e| io::Error::other(format!("API response is not JSON ({e}): {}", self.body)))
    }

    /// The body as JSON if the status is 2xx, else an error that carries status and body, so a
    /// failing test shows what the API server objected to.
    pub fn success_json(&self) -> io::Result<Value> {
        if (200..300).contains(&self.status) {
            self.json()
        } else {
            Err(io::Error::other(format!(
                "API server answered {}: {}",
                self.status, self.body
            )))
        }
    }
}

/// etcd and kube-apiserver running on free loopback ports in a temporary directory.
///
/// Stopped by [`KubeLab::stop`] or on drop. Independently of that, `up.sh` leaves a watchdog
/// that stops both servers and deletes the directory once this process exits, because a
/// `'static` lab from [`KubeLab::shared`] is never dropped, and a killed test never drops anything.
pub struct KubeLab {
    workdir: PathBuf,
    api_port: u16,
    etcd_ports: (u16, u16),
    ca_pem: String,
    admin_token: String,
    gateway_token: String,
    agent: ureq::Agent,
    stopped: Mutex<bool>,
    kubeconfigs: AtomicU64,
    // Removes the directory when the lab is dropped; fields drop after `Drop::drop` has run
    // `stop`, so the servers are gone by then.
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for KubeLab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeLab")
            .field("api_url", &self.api_url())
            .field("workdir", &self.workdir)
            .finish_non_exhaustive()
    }
}

/// Bounds one API call, so a wedged server fails a test instead of hanging it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// kube-apiserver is ready in 3-4 s on an idle machine, 6-11 s under load; a generous bound for
/// a CI machine that is also compiling.
const READY_TIMEOUT: Duration = Duration::from_secs(180);

impl KubeLab {
    /// Builds the binaries if needed, starts etcd and kube-apiserver, waits for `/readyz` and
    /// installs the CNPG `Cluster` CRD.
    pub fn start() -> io::Result<KubeLab> {
        let bin = ensure_binaries()?;
        // A port picked free may be taken by someone else before the server binds it; a retry
        // with fresh ports makes that race harmless.
        // Other failures are not retried: a lab that is merely slow would triple the wait.
        let mut attempt = 1;
        loop {
            match Self::start_once(&bin) {
                Err(e) if attempt < 3 && e.to_string().contains("address already in use") => {
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    fn start_once(bin: &Path) -> io::Result<KubeLab> {
        let dir = tempfile::Builder::new().prefix("pgwake-k8s-").tempdir()?;
        let workdir = dir.path().to_path_buf();
        let (api_port, etcd_port, peer_port) = distinct_free_ports();
        let out = Command::new(scripts_dir().join("up.sh"))
            .arg(&workdir)
            .args([
                api_port.to_string(),
                etcd_port.to_string(),
                peer_port.to_string(),
            ])
            .env("PGWAKE_K8S_BIN", bin)
            .env("PGWAKE_K8S_WATCHDOG", std::process::id().to_string())
            .env("PGWAKE_K8S_WATCHDOG_RMDIR", "1")
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            run_down(&workdir);
            return Err(io::Error::other(format!(
                "testkit/k8s/up.sh failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let read = |name: &str| -> io::Result<String> {
            Ok(fs::read_to_string(workdir.join(name))?.trim().to_owned())
        };
        let ca_pem = fs::read_to_string(workdir.join("pki/ca.crt"))?;
        let ca = Certificate::from_pem(ca_pem.as_bytes())
            .map_err(|e| io::Error::other(format!("lab CA certificate: {e}")))?;
        let agent = ureq::Agent::config_builder()
            .tls_config(
                TlsConfig::builder()
                    .root_certs(RootCerts::new_with_certs(&[ca]))
                    .build(),
            )
            // Tests assert on 403s and 409s; they are answers, not transport errors.
            .http_status_as_error(false)
            .timeout_global(Some(REQUEST_TIMEOUT))
            .build()
            .new_agent();
        let lab = KubeLab {
            api_port,
            etcd_ports: (etcd_port, peer_port),
            ca_pem,
            admin_token: read("admin.token")?,
            gateway_token: read("gateway.token")?,
            agent,
            stopped: Mutex::new(false),
            kubeconfigs: AtomicU64::new(0),
            workdir,
            _dir: dir,
        };
        // On error `lab` drops here, which stops the servers.
        lab.wait_ready()?;
        lab.install_crd()?;
        Ok(lab)
    }

    /// The lab of this test binary, started on first use and shared by all its tests.
    ///
    /// Never dropped (Rust runs no destructors for statics): the servers are stopped and the
    /// directory removed by the watchdog `up.sh` starts, within a second or so of the process
    /// exiting. Panics with the start-up error, the same one for every caller, if the lab could
    /// not start; it is not retried.
    pub fn shared() -> &'static KubeLab {
        static SHARED: OnceLock<Result<KubeLab, String>> = OnceLock::new();
        match SHARED.get_or_init(|| KubeLab::start().map_err(|e| e.to_string())) {
            Ok(lab) => lab,
            Err(e) => panic!("the shared Kubernetes lab could not start: {e}"),
        }
    }

    fn wait_ready(&self) -> io::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let last = match self.request("GET", "/readyz", None) {
                Ok(r) if r.status == 200 => return Ok(()),
                Ok(r) => format!("{} {}", r.status, r.body),
                Err(e) => e.to_string(),
            };
            if !self.pid_alive("apiserver") || !self.pid_alive("etcd") {
                return Err(io::Error::other(format!(
                    "the Kubernetes lab died during start-up; apiserver log tail:\n{}\netcd log tail:\n{}",
                    self.log_tail("apiserver", 40),
                    self.log_tail("etcd", 20)
                )));
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "kube-apiserver not ready within {READY_TIMEOUT:?} (last answer: {last}); log tail:\n{}",
                    self.log_tail("apiserver", 40)
                )));
            }
            sleep(Duration::from_millis(100));
        }
    }

    /// Creates CloudNativePG's `Cluster` CRD and waits until `Cluster` objects can be listed: a
    /// CRD is served only after it is `Established`, a moment after it is created.
    ///
    /// The operator's own CRD, schema and all, so that a misspelt or mistyped `Cluster` field
    /// fails here as it would in a real cluster. Created rather than applied: its schema is
    /// larger than a client-side apply annotation may hold.
    fn install_crd(&self) -> io::Result<()> {
        let path = ensure_cnpg_crd()?;
        let crd = fs::read_to_string(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let created = self.create(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            &crd,
        )?;
        if created.status != 409 {
            created.success_json()?;
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = self.get(&clusters_path("default"))?;
            if r.status == 200 {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "the Cluster CRD was not served within 60 s: {} {}",
                    r.status, r.body
                )));
            }
            sleep(Duration::from_millis(50));
        }
    }

    /// The API server's base URL, `https://127.0.0.1:PORT`.
    pub fn api_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.api_port)
    }

    /// The API server's port on 127.0.0.1.
    pub fn api_port(&self) -> u16 {
        self.api_port
    }

    /// PEM of the CA that signed the API server's certificate (trust it to talk TLS).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Path of the CA certificate file.
    pub fn ca_path(&self) -> PathBuf {
        self.workdir.join("pki/ca.crt")
    }

    /// Bearer token of `pgwake-admin`, a member of `system:masters` (RBAC does not apply).
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// Bearer token of user `pgwake-gateway`, in no group: it may do only what RBAC grants it.
    pub fn gateway_token(&self) -> &str {
        &self.gateway_token
    }

    /// A kubeconfig with contexts `admin` (current) and `gateway`, both by bearer token.
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.workdir.join("kubeconfig")
    }

    /// The lab's working directory (PKI, logs, PID files, kubeconfigs).
    pub fn workdir(&self) -> &Path {
        &self.workdir
    }

    /// Writes a kubeconfig whose only context (`lab`, namespace `default`) authenticates with
    /// `token`, for running a client as some identity, e.g. a ServiceAccount; returns its path.
    pub fn kubeconfig_for_token(&self, token: &str) -> io::Result<PathBuf> {
        let n = self.kubeconfigs.fetch_add(1, Ordering::Relaxed);
        let path = self.workdir.join(format!("kubeconfig-token-{n}"));
        // JSON is YAML, and serde_json does the quoting of whatever the token contains.
        let config = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "pgwake-lab", "cluster": {
                "server": self.api_url(),
                "certificate-authority-data": BASE64.encode(self.ca_pem.as_bytes()),
            }}],
            "users": [{"name": "lab", "user": {"token": token}}],
            "contexts": [{"name": "lab", "context": {
                "cluster": "pgwake-lab", "user": "lab", "namespace": "default",
            }}],
            "current-context": "lab",
        });
        fs::write(&path, serde_json::to_string_pretty(&config)?)?;
        Ok(path)
    }

    /// One API call as admin. `body` is `(content type, bytes)`.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<(&str, &[u8])>,
    ) -> io::Result<ApiResponse> {
        self.request_as(&self.admin_token, method, path, body)
    }

    /// One API call with this bearer token. `body` is `(content type, bytes)`.
    pub fn request_as(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<(&str, &[u8])>,
    ) -> io::Result<ApiResponse> {
        let url = format!("{}{path}", self.api_url());
        let mut req = ureq::http::Request::builder()
            .method(method)
            .uri(&url)
            .header("Authorization", format!("Bearer {token}"))
            .header("Accept", "application/json");
        let bytes = match body {
            Some((content_type, bytes)) => {
                req = req.header("Content-Type", content_type);
                bytes.to_vec()
            }
            None => Vec::new(),
        };
        let req = req
            .body(bytes)
            .map_err(|e| io::Error::other(format!("{method} {url}: {e}")))?;
        let mut resp = self
            .agent
            .run(req)
            .map_err(|e| io::Error::other(format!("{method} {url}: {e}")))?;
        let status = resp.status().as_u16();
        let body = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| io::Error::other(format!("{method} {url}: reading the body: {e}")))?;
        Ok(ApiResponse { status, body })
    }

    /// Streams a watch as admin: `path` must ask for one (`?watch=1&resourceVersion=…`, with
    /// `timeoutSeconds` well under 30 s, the lab's bound on one call). Calls `on_event` with each
    /// event (`{"type": …, "object": …}`) until the server ends the watch or `on_event` returns
    /// false.
    pub fn watch(&self, path: &str, mut on_event: impl FnMut(Value) -> bool) -> io::Result<()> {
        use std::io::BufRead;
        let url = format!("{}{path}", self.api_url());
        let req = ureq::http::Request::builder()
            .method("GET")
            .uri(&url)
            .header("Authorization", format!("Bearer {}", self.admin_token))
            .header("Accept", "application/json")
            .body(Vec::new())
            .map_err(|e| io::Error::other(format!("GET {url}: {e}")))?;
        let resp = self
            .agent
            .run(req)
            .map_err(|e| io::Error::other(format!("GET {url}: {e}")))?;
        if resp.status() != 200 {
            return Err(io::Error::other(format!(
                "watch {url}: API server answered {}",
                resp.status()
            )));
        }
        let reader = io::BufReader::new(resp.into_body().into_reader());
        for line in reader.lines() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let event: Value = serde_json::from_str(&line)
                .map_err(|e| io::Error::other(format!("watch event is not JSON ({e}): {line}")))?;
            if !on_event(event) {
                break;
            }
        }
        Ok(())
    }

    /// `GET path` as admin.
    pub fn get(&self, path: &str) -> io::Result<ApiResponse> {
        self.request("GET", path, None)
    }

    /// `POST` a manifest (YAML or JSON, as the API server accepts both) to a collection as admin,
    /// e.g. `create("/api/v1/namespaces", "{\"metadata\":{\"name\":\"x\"}}")`.
    pub fn create(&self, collection_path: &str, manifest: &str) -> io::Result<ApiResponse> {
        self.request(
            "POST",
            collection_path,
            Some((content_type_of(manifest), manifest.as_bytes())),
        )
    }

    /// A JSON merge patch (`application/merge-patch+json`) as admin; for the status of a custom
    /// resource, patch `<object path>/status`.
    pub fn merge_patch(&self, path: &str, patch: &Value) -> io::Result<ApiResponse> {
        self.request(
            "PATCH",
            path,
            Some(("application/merge-patch+json", patch.to_string().as_bytes())),
        )
    }

    /// Creates a namespace unless it exists.
    pub fn ensure_namespace(&self, name: &str) -> io::Result<()> {
        let r = self.create(
            "/api/v1/namespaces",
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
                .to_string(),
        )?;
        if r.status != 409 {
            r.success_json()?;
        }
        Ok(())
    }

    /// A token for ServiceAccount `namespace/name` from the TokenRequest API, valid for a day,
    /// for the API server's audience. Creates the namespace and the ServiceAccount if missing.
    /// What the token may do is up to the Roles bound to
    /// `system:serviceaccount:<namespace>:<name>`.
    pub fn service_account_token(&self, namespace: &str, name: &str) -> io::Result<String> {
        self.ensure_namespace(namespace)?;
        let r = self.create(
            &format!("/api/v1/namespaces/{namespace}/serviceaccounts"),
            &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
                .to_string(),
        )?;
        if r.status != 409 {
            r.success_json()?;
        }
        let request = json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 86400},
        });
        let issued = self
            .create(
                &format!("/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"),
                &request.to_string(),
            )?
            .success_json()?;
        issued["status"]["token"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| io::Error::other(format!("TokenRequest answered no token: {issued}")))
    }

    /// The REST collection path of a manifest object, found through API discovery: e.g.
    /// `/apis/apps/v1/namespaces/NS/deployments`. Namespaced objects without a namespace go to
    /// `default`, as kubectl would send them.
    pub fn collection_path(&self, obj: &Value) -> io::Result<String> {
        let api_version = obj["apiVersion"]
            .as_str()
            .ok_or_else(|| io::Error::other(format!("no apiVersion in {obj}")))?;
        let kind = obj["kind"]
            .as_str()
            .ok_or_else(|| io::Error::other(format!("no kind in {obj}")))?;
        let group_path = if api_version.contains('/') {
            format!("/apis/{api_version}")
        } else {
            format!("/api/{api_version}")
        };
        let discovery = self.get(&group_path)?.success_json()?;
        let resource = discovery["resources"]
            .as_array()
            .into_iter()
            .flatten()
            // Subresources (`deployments/scale`) share their parent's kind.
            .find(|r| r["kind"] == kind && !r["name"].as_str().unwrap_or("/").contains('/'))
            .ok_or_else(|| {
                io::Error::other(format!("the API server serves no {kind} in {api_version}"))
            })?;
        let plural = resource["name"].as_str().unwrap_or_default();
        if resource["namespaced"] == true {
            let ns = obj["metadata"]["namespace"].as_str().unwrap_or("default");
            Ok(format!("{group_path}/namespaces/{ns}/{plural}"))
        } else {
            Ok(format!("{group_path}/{plural}"))
        }
    }

    /// Server-side apply of one object as admin (field manager `pgwake-testkit`, conflicts
    /// forced), with strict field validation; `dry_run` has the server validate and admit it
    /// without storing it. Objects with only a `generateName` are created instead.
    pub fn apply(&self, obj: &Value, dry_run: bool) -> io::Result<ApiResponse> {
        let collection = self.collection_path(obj)?;
        let dry = if dry_run { "&dryRun=All" } else { "" };
        let body = obj.to_string();
        match obj["metadata"]["name"].as_str() {
            Some(name) => self.request(
                "PATCH",
                &format!(
                    "{collection}/{name}?fieldManager=pgwake-testkit&force=true&fieldValidation=Strict{dry}"
                ),
                Some(("application/apply-patch+yaml", body.as_bytes())),
            ),
            None => self.request(
                "POST",
                &format!("{collection}?fieldValidation=Strict{dry}"),
                Some(("application/json", body.as_bytes())),
            ),
        }
    }

    /// Server-side dry run (`dryRun=All`) of every object in order: the API server validates,
    /// defaults and admits each one but stores nothing. Fails on the first object it rejects,
    /// naming it; the namespaces the objects name must exist.
    pub fn dry_run(&self, objects: &[Value]) -> io::Result<()> {
        for obj in objects {
            self.apply(obj, true)?
                .success_json()
                .map_err(|e| io::Error::other(format!("{}: {e}", object_label(obj))))?;
        }
        Ok(())
    }

    /// [`KubeLab::dry_run`] of a multi-document YAML manifest.
    pub fn dry_run_manifest(&self, yaml: &str) -> io::Result<()> {
        self.dry_run(&parse_manifests(yaml)?)
    }

    /// Applies the ServiceAccount, Role and RoleBinding of `deploy/base` into `namespace` (made
    /// if missing) and returns a token of that ServiceAccount, so a test runs the gateway with
    /// exactly the permissions `deploy/` grants, not as admin.
    pub fn deploy_rbac_token(&self, namespace: &str) -> io::Result<String> {
        self.ensure_namespace(namespace)?;
        let mut account = None;
        for mut obj in render_kustomization(&deploy_dir().join("base"))? {
            let kind = obj["kind"].as_str().unwrap_or_default().to_owned();
            if !matches!(kind.as_str(), "ServiceAccount" | "Role" | "RoleBinding") {
                continue;
            }
            obj["metadata"]["namespace"] = json!(namespace);
            if kind == "RoleBinding" {
                for subject in obj["subjects"].as_array_mut().into_iter().flatten() {
                    if subject["kind"] == "ServiceAccount" {
                        subject["namespace"] = json!(namespace);
                    }
                }
            }
            if kind == "ServiceAccount" {
                account = obj["metadata"]["name"].as_str().map(str::to_owned);
            }
            self.apply(&obj, false)?
                .success_json()
                .map_err(|e| io::Error::other(format!("{}: {e}", object_label(&obj))))?;
        }
        let account =
            account.ok_or_else(|| io::Error::other("deploy/base renders no ServiceAccount"))?;
        self.service_account_token(namespace, &account)
    }

    /// The last `lines` lines of `logs/<name>.log` (`apiserver` or `etcd`), for failure messages.
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        let text =
            fs::read_to_string(self.workdir.join(format!("logs/{name}.log"))).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The PID recorded for `apiserver` or `etcd`, while the lab runs.
    pub fn pid(&self, name: &str) -> Option<u32> {
        fs::read_to_string(self.workdir.join(format!("{name}.pid")))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Kills kube-apiserver alone (etcd keeps the data), as an API outage; see
    /// [`KubeLab::start_apiserver`].
    pub fn stop_apiserver(&self) -> io::Result<()> {
        let Some(pid) = self.pid("apiserver") else {
            return Ok(());
        };
        // A crash, not a graceful stop: kube-apiserver drains open watches for many seconds
        // on SIGTERM, and an outage does not wait for that either.
        let status = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()?;
        if !status.success() {
            return Err(io::Error::other(format!("kill -KILL {pid} failed")));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.pid_alive("apiserver") {
            if Instant::now() > deadline {
                return Err(io::Error::other("kube-apiserver did not stop within 30 s"));
            }
            sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Starts kube-apiserver again on the same port and storage after
    /// [`KubeLab::stop_apiserver`], and waits until it is ready.
    pub fn start_apiserver(&self) -> io::Result<()> {
        let out = Command::new(scripts_dir().join("up.sh"))
            .arg(&self.workdir)
            .args([
                self.api_port.to_string(),
                self.etcd_ports.0.to_string(),
                self.etcd_ports.1.to_string(),
            ])
            .env("PGWAKE_K8S_BIN", ensure_binaries()?)
            .env("PGWAKE_K8S_APISERVER_ONLY", "1")
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "up.sh (apiserver only) failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        self.wait_ready()
    }

    fn pid_alive(&self, name: &str) -> bool {
        self.pid(name)
            .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists())
    }

    /// Stops the watchdog, kube-apiserver and etcd (in that order, by recorded PID). Idempotent.
    pub fn stop(&self) {
        let mut stopped = self.stopped.lock().unwrap_or_else(|e| e.into_inner());
        if !*stopped {
            run_down(&self.workdir);
            *stopped = true;
        }
    }
}

impl Drop for KubeLab {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run_down(workdir: &Path) {
    let _ = Command::new(scripts_dir().join("down.sh"))
        .arg(workdir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status();
}

/// Three different free ports: the OS may hand out the same ephemeral port twice in a row once
/// each probe socket is closed.
fn distinct_free_ports() -> (u16, u16, u16) {
    loop {
        let (a, b, c) = (free_port(), free_port(), free_port());
        if a != b && b != c && a != c {
            return (a, b, c);
        }
    }
}

fn content_type_of(manifest: &str) -> &'static str {
    if manifest.trim_start().starts_with('{') {
        "application/json"
    } else {
        "application/yaml"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_are_sent_with_the_right_content_type() {
        assert_eq!(content_type_of("  {\"kind\":\"x\"}"), "application/json");
        assert_eq!(
            content_type_of("---\napiVersion: v1\nkind: ConfigMap\n"),
            "application/yaml"
        );
    }

    #[test]
    fn manifests_split_into_documents() {
        let docs = parse_manifests(
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\ndata:\n  port: \"5432\"\n---\n---\nkind: Secret\nmetadata:\n  generateName: b-\n",
        )
        .unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0]["data"]["port"], "5432");
        assert_eq!(object_label(&docs[0]), "ConfigMap/a");
        assert_eq!(object_label(&docs[1]), "Secret/b-*");
    }
}
