//! The replicas of the gateway's Service, read from its EndpointSlices (watched).
//!
//! Every listed address counts, ready or not: a replica that is draining is no longer ready but
//! still runs sessions whose queries its clients may want to cancel.

use std::net::{IpAddr, SocketAddr};

use futures_util::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// A watched copy of one Service's EndpointSlices.
pub struct PeerEndpoints {
    store: Store<EndpointSlice>,
    port_name: String,
}

impl PeerEndpoints {
    /// Starts watching the EndpointSlices of `service` in `namespace` until `stop` fires.
    pub fn start(
        client: kube::Client,
        namespace: &str,
        service: &str,
        port_name: &str,
        stop: CancellationToken,
    ) -> PeerEndpoints {
        let api: Api<EndpointSlice> = Api::namespaced(client, namespace);
        let (store, writer) = reflector::store();
        let config =
            watcher::Config::default().labels(&format!("kubernetes.io/service-name={service}"));
        let stream = reflector::reflector(writer, watcher(api, config).default_backoff());
        let endpoints = PeerEndpoints {
            store,
            port_name: port_name.to_owned(),
        };
        let watched = PeerEndpoints {
            store: endpoints.store.clone(),
            port_name: port_name.to_owned(),
        };
        let service = service.to_owned();
        tokio::spawn(async move {
            let mut stream = stream.boxed();
            let mut listed = None;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    e = stream.next() => match e {
                        None => return,
                        // The copy keeps the last listing, so forwarding goes on meanwhile.
                        Some(Err(e)) => warn!(%service, error = %e, "endpointslice watch failed; retrying"),
                        Some(Ok(_)) => {
                            let now = watched.addresses();
                            if listed.as_ref() != Some(&now) {
                                info!(%service, replicas = now.len(), "peer replicas listed");
                                listed = Some(now);
                            }
                        }
                    },
                }
            }
        });
        endpoints
    }

    /// Every replica's peer address as last listed (empty until the first listing).
    pub fn addresses(&self) -> Vec<SocketAddr> {
        let mut out = Vec::new();
        for slice in self.store.state() {
            let port = slice
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(self.port_name.as_str()))
                .and_then(|p| p.port)
                .and_then(|p| u16::try_from(p).ok());
            let Some(port) = port else { continue };
            for endpoint in &slice.endpoints {
                for address in &endpoint.addresses {
                    if let Ok(ip) = address.parse::<IpAddr>() {
                        out.push(SocketAddr::new(ip, port));
                    }
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }
}
