//! Startup wiring: backends chosen once from config, the hub, the mounted connectors, the
//! public and internal (metrics, probes, operator API) listeners, background loops
//! (presence, janitor) and the drain.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use switchyard_core::crypto::{Cipher, UrlSigner};
use switchyard_core::engine::{Connector, Hub, Janitor, OutboxCommitter, OutflowLimits};
use switchyard_core::hosts::Hosts;
use switchyard_core::ids::{now_ms, random_secret};
use switchyard_core::store::Store;
use switchyard_protocol::BuildInfo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::config::Config;
use crate::doorbells::Doorbells;
use crate::http::{ConnState, connector_router};
pub use crate::providers::connectors;
use crate::session::SessionLimits;

mod backends;
mod identity;

pub use backends::{
    Backends, SCHEMA_WINDOW, backends, keys, open_bus, open_ephemeral, open_files, open_store,
    prepare_schema, schema_fit,
};
pub use identity::{IdentitySource, POD_ID_FILE, PodIdentity, pod_identity};

/// Build information injected at compile time (build.rs).
pub fn build_info() -> BuildInfo {
    BuildInfo {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        git_tag: env!("SWITCHYARD_GIT_TAG").to_owned(),
        git_rev: env!("SWITCHYARD_GIT_REV").to_owned(),
        build_time: env!("SWITCHYARD_BUILD_TIME").to_owned(),
    }
}

/// How the public listener trusts a client certificate passed on by an ingress, if at all.
fn trusted_ingress(cfg: &Config) -> anyhow::Result<Option<crate::hosts::TrustedIngress>> {
    let Some(header) = cfg.hosts_client_cert_header.as_deref() else {
        return Ok(None);
    };
    let cert_header = axum::http::HeaderName::try_from(header.to_ascii_lowercase())
        .context("hosts_client_cert_header is not a valid header name")?;
    Ok(Some(crate::hosts::TrustedIngress {
        cert_header,
        secrets: Arc::new(
            cfg.hosts_ingress_secret
                .0
                .iter()
                .map(|s| s.expose().trim().to_owned())
                .collect(),
        ),
        sources: Arc::new(cfg.hosts_ingress_sources.0.clone()),
    }))
}

/// The host service for administrative commands (CLI): the same backends and keys as a pod.
pub async fn admin_hosts(cfg: &Config) -> anyhow::Result<Arc<Hosts>> {
    let b = backends(cfg).await?;
    prepare_schema(cfg, b.store.as_ref()).await?;
    let (signing, encryption) = keys(cfg)?;
    let hub = Arc::new(Hub {
        store: b.store.clone(),
        bus: b.bus,
        ephemeral: b.ephemeral,
        files: b.files,
        cipher: Cipher::from_base64(&encryption).context("encryption keys")?,
        signer: UrlSigner::new(signing).context("signing keys")?,
        config: cfg.engine(),
        committer: OutboxCommitter::start(b.store.clone(), cfg.commit_limits()),
        quotas: switchyard_core::quota::Quotas::new(cfg.quotas.values()),
        journal: switchyard_core::journal::Journal::disabled(),
        pod_id: format!("cli-{}", random_secret(3)),
        public_base_url: cfg
            .public_base_url
            .clone()
            .unwrap_or_else(|| format!("http://{}", cfg.listen)),
    });
    Ok(Arc::new(Hosts::new(hub, cfg.hosts.core())))
}

/// Names in the mTLS listener's certificate.
fn tls_names(cfg: &Config, hub: &Hub) -> Vec<String> {
    let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    if let Ok(u) = url::Url::parse(&hub.public_base_url)
        && let Some(h) = u.host_str()
    {
        names.push(h.trim_matches(['[', ']']).to_owned());
    }
    if let Some((h, _)) = cfg.hosts_tls_listen.rsplit_once(':') {
        let h = h.trim_matches(['[', ']']);
        if !h.is_empty() && h != "0.0.0.0" && h != "::" {
            names.push(h.to_owned());
        }
    }
    names.extend(cfg.hosts.tls_names.iter().cloned());
    names.sort();
    names.dedup();
    names
}

/// What the first start of an embedded node prints on stdout.
fn first_start_text(
    tenant: &switchyard_core::model::Tenant,
    base_urls: &[(String, String)],
    metrics_addr: SocketAddr,
    key: &str,
) -> String {
    use std::fmt::Write;
    let mut out = format!("created tenant {} ({})\n", tenant.name, tenant.id);
    out.push_str("connector Base URLs (enter one in xAgent, with the API key below):\n");
    let width = base_urls.iter().map(|(c, _)| c.len()).max().unwrap_or(0);
    for (card, url) in base_urls {
        let _ = writeln!(out, "  {card:width$}  {url}");
    }
    let _ = writeln!(
        out,
        "metrics and probes: http://{metrics_addr}/metrics, /livez, /readyz"
    );
    let _ = writeln!(out, "its API key (shown once):\n{key}");
    out
}

#[derive(Clone)]
struct Probe {
    readiness: Arc<crate::readiness::Readiness>,
    store: Arc<dyn Store>,
    draining: Arc<AtomicBool>,
}

/// Liveness never depends on a backend (a backend outage must not restart healthy pods).
async fn livez() -> impl IntoResponse {
    "ok"
}

/// Answers from the pod's own backend checks (crate::readiness), never by pinging here.
async fn readyz(State(p): State<Probe>) -> axum::response::Response {
    if p.draining.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining").into_response();
    }
    match p.readiness.verdict() {
        Ok(()) => (StatusCode::OK, "ready").into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e).into_response(),
    }
}

/// The shared backends `/readyz` follows: the store, the bus and the ephemeral state.
fn readiness(cfg: &Config, hub: &Arc<Hub>) -> Arc<crate::readiness::Readiness> {
    use crate::readiness::check_fn;
    let r =
        crate::readiness::Readiness::new(cfg.readiness.failure_threshold, cfg.readiness.timeout.0);
    let reason = |e: switchyard_core::error::BackendError| format!("{:?}: {}", e.kind, e.context);
    let store = hub.store.clone();
    r.add(
        "store",
        check_fn(move || {
            let store = store.clone();
            async move { store.ping().await.map_err(reason) }
        }),
    );
    let bus = hub.bus.clone();
    r.add(
        "bus",
        check_fn(move || {
            let up = bus.is_connected();
            async move {
                if up {
                    Ok(())
                } else {
                    Err("disconnected".to_owned())
                }
            }
        }),
    );
    let ephemeral = hub.ephemeral.clone();
    r.add(
        "ephemeral",
        check_fn(move || {
            let e = ephemeral.clone();
            async move { e.ping().await.map_err(reason) }
        }),
    );
    Arc::new(r)
}

async fn metrics_text(State(p): State<Probe>) -> impl IntoResponse {
    crate::telemetry::process_metrics();
    crate::telemetry::pool_metrics(p.store.as_ref());
    crate::telemetry::prometheus().render()
}

/// Runs a pod until `shutdown` is cancelled, then drains: readiness fails, new upgrades are
/// refused, sessions finish in-flight work within the drain timeout and close with a
/// reconnect code, leases and presence are released.
pub async fn run(
    cfg: Config,
    listener: TcpListener,
    metrics_listener: TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    crate::telemetry::prometheus();
    let build = build_info();
    crate::telemetry::build_info_metric(&build.version, &build.git_rev);
    let b = backends(&cfg).await?;
    prepare_schema(&cfg, b.store.as_ref()).await?;
    let (signing, encryption) = keys(&cfg)?;
    // Held until `run` returns: the data directory's identity stays this process's.
    let identity = pod_identity(&cfg);
    let pod = identity.id.clone();
    tracing::info!(pod_id = %pod, source = ?identity.source, "pod identity");
    let local: SocketAddr = listener.local_addr()?;
    let public_base_url = cfg
        .public_base_url
        .clone()
        .unwrap_or_else(|| format!("http://{local}"));
    let hub = Arc::new(Hub {
        store: b.store.clone(),
        bus: b.bus.clone(),
        ephemeral: b.ephemeral.clone(),
        files: b.files.clone(),
        cipher: Cipher::from_base64(&encryption).context("encryption keys")?,
        signer: UrlSigner::new(signing.clone()).context("signing keys")?,
        config: cfg.engine(),
        committer: OutboxCommitter::start(b.store.clone(), cfg.commit_limits()),
        quotas: switchyard_core::quota::Quotas::new(cfg.quotas.values()),
        journal: switchyard_core::journal::Journal::start(
            b.store.clone(),
            &pod,
            &cfg.journal.core(),
        ),
        pod_id: pod.clone(),
        public_base_url,
    });
    let first_start = if !cfg.is_clustered() && hub.store.list_tenants().await?.is_empty() {
        Some(switchyard_core::engine::create_tenant(hub.store.as_ref(), "default").await?)
    } else {
        None
    };
    let now = now_ms();
    // If the whole deployment was down, restored connectors get a full grace from now.
    let restarted = hub
        .store
        .restart_offline_clocks(now, now - cfg.lease.presence_ttl.0.as_millis() as i64)
        .await?;
    if restarted > 0 {
        tracing::info!(
            connectors = restarted,
            "first pod up: offline grace restarts now for restored connectors"
        );
    }
    // A process starts with no sockets: rows left under this identity by an earlier
    // incarnation (killed before it could drain) are stale, and their connectors' offline
    // time starts now, as the janitor would have done had the identity changed.
    hub.store
        .remove_pod(&pod, now)
        .await
        .context("clearing an earlier incarnation's sockets")?;
    hub.store
        .pod_heartbeat(&pod, now)
        .await
        .context("registering pod presence")?;

    hub.quotas
        .refresh(hub.store.as_ref())
        .await
        .context("loading tenant quotas")?;
    let hosts = Arc::new(Hosts::new(hub.clone(), cfg.hosts.core()));
    let ca = crate::hosts::ca::host_ca(&cfg, &hub).await?;
    let drain = CancellationToken::new();
    let draining = Arc::new(AtomicBool::new(false));
    let sessions = TaskTracker::new();
    let gateway = crate::hosts::Gateway {
        hosts: hosts.clone(),
        ca: ca.clone(),
        jwt_key: Arc::new(crate::hosts::jwt_key(signing[0].expose())),
        jwt_ttl: cfg.hosts.jwt_ttl.0,
        cert_valid_days: cfg.hosts.cert_valid_days,
        max_frame_bytes: cfg.limits.max_frame_bytes,
        max_preauth_bytes: usize::try_from(cfg.ingress.max_preauth_bytes).unwrap_or(usize::MAX),
        operators: crate::operators::Operators::new(
            cfg.operators(),
            hub.ephemeral.clone(),
            cfg.operator_auth.limits(),
        ),
        drain: drain.clone(),
        draining: draining.clone(),
        sessions: sessions.clone(),
    };
    // The gateway's routes on the public listener: certificates come from a trusted ingress
    // header, if one is configured.
    let public_gateway = crate::hosts::router(
        gateway.clone(),
        crate::hosts::CertSource::Header(trusted_ingress(&cfg)?),
    );
    let connectors: Vec<Connector> = connectors(&cfg, &hub, hosts.clone(), public_gateway);
    let metrics_addr = metrics_listener.local_addr()?;
    let base_urls: Vec<(String, String)> = connectors
        .iter()
        .map(|c| {
            (
                c.card_id().to_owned(),
                format!(
                    "{}{}",
                    hub.public_base_url.trim_end_matches('/'),
                    c.prefix()
                ),
            )
        })
        .collect();
    crate::telemetry::register_connectors(
        &connectors
            .iter()
            .map(|c| {
                let tools = c
                    .provider
                    .card()
                    .tools
                    .iter()
                    .map(|t| t.tool_id.clone())
                    .collect();
                (c.card_id().to_owned(), c.prefix(), tools)
            })
            .collect::<Vec<_>>(),
    );
    for (card, url) in &base_urls {
        tracing::info!(card = %card, base_url = %url, "connector mounted");
    }
    tracing::info!(%metrics_addr, "internal listener: /metrics, /livez, /readyz");
    if let Some((tenant, key)) = first_start {
        // Shown exactly once, on the first start of an embedded node: where to point xAgent,
        // with which key (alone on the last line).
        print!(
            "{}",
            first_start_text(&tenant, &base_urls, metrics_addr, key.key.expose())
        );
    }
    // Stops provider background consumers (pollers) at the end of the drain.
    let providers_stop = CancellationToken::new();
    let doorbells = Doorbells::new(hub.bus.clone());
    let limits = SessionLimits {
        session: switchyard_core::engine::SessionLimits {
            max_frame_bytes: cfg.limits.max_frame_bytes,
            tools_per_socket: cfg.limits.tools_per_socket,
            channel_queue: cfg.limits.channel_queue,
            opens_per_socket: cfg.limits.opens_per_socket,
            auth_per_socket: cfg.limits.auth_per_socket,
            delivery: OutflowLimits {
                window: cfg.delivery.window,
                ack_timeout: cfg.delivery.ack_timeout.0,
                retry_pause: cfg.delivery.retry_pause.0,
            },
            hello_timeout: cfg.limits.hello_timeout.0,
            sweep_interval: cfg.delivery.sweep_interval.0,
            drain_timeout: cfg.drain_timeout.0,
        },
        send: crate::sendq::SendLimits {
            packets: cfg.limits.socket_send_queue,
            bytes: cfg.limits.socket_send_queue_bytes,
            stall: cfg.limits.socket_stall.0,
        },
        ws_ping_interval: cfg.limits.ws_ping_interval.0,
        ws_read_buffer: cfg.limits.ws_read_buffer_bytes,
    };
    // The operator API is not mounted here: it lives on the internal (metrics) listener.
    let mut app = Router::new();
    for c in &connectors {
        let state = ConnState {
            conn: c.clone(),
            doorbells: doorbells.clone(),
            limits: limits.clone(),
            drain: drain.clone(),
            draining: draining.clone(),
            sessions: sessions.clone(),
        };
        app = app.nest(c.prefix(), connector_router(state));
    }
    // Spans name the path only: query strings carry URL signatures and pairing tokens.
    for c in &connectors {
        c.provider.start(providers_stop.clone());
    }
    let app = app.layer(axum::middleware::from_fn(crate::listener::answer_refusals));
    let app = crate::telemetry::observe(app, "public", &pod);

    let ready = readiness(&cfg, &hub);
    let probe = Probe {
        readiness: ready.clone(),
        store: hub.store.clone(),
        draining: draining.clone(),
    };
    // The operator API (/admin/v1) and the console (/console). With `admin_listen` set (the
    // chart sets it) they get their own address, so network access to /metrics is not
    // console access; unset, they stay on the internal listener, where CONTRACT.md puts them.
    let pulse = Arc::new(crate::console::Pulse::new(
        &pod,
        cfg.console.sample_interval.0,
        hub.ephemeral.clone(),
    ));
    let admin_routes = crate::hosts::operator_router(gateway.clone()).merge(
        crate::console::router(crate::console::ConsoleState {
            hosts: hosts.clone(),
            pulse: pulse.clone(),
            operators: gateway.operators.clone(),
        }),
    );
    let own_admin_listener = !cfg.admin_listen.trim().is_empty();
    // The internal listener: what monitoring and the kubelet need, and the operators' routes
    // only when they have no listener of their own.
    let metrics_app = Router::new()
        .route("/metrics", get(metrics_text))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .with_state(probe);
    let (metrics_app, admin_app) = if own_admin_listener {
        (metrics_app, admin_routes)
    } else {
        (metrics_app.merge(admin_routes), Router::new())
    };
    let metrics_app = crate::telemetry::observe(metrics_app, "internal", &pod);
    let admin_app = crate::telemetry::observe(admin_app, "admin", &pod);
    let admin_listener = if gateway.operators.is_empty() || !own_admin_listener {
        None
    } else {
        let l = TcpListener::bind(cfg.admin_listen.trim())
            .await
            .with_context(|| {
                format!(
                    "binding the admin listener (admin_listen) on {}",
                    cfg.admin_listen
                )
            })?;
        tracing::info!(admin_addr = %l.local_addr()?, "admin listener: /console, /admin/v1");
        Some(l)
    };
    let stopped = CancellationToken::new();
    let metrics_stop = stopped.clone();
    // Every listener runs the same accept loop: header timeout and connection cap.
    let listener_limits = crate::listener::ListenerLimits {
        max_connections: cfg.limits.max_connections,
        header_read_timeout: cfg.limits.header_read_timeout.0,
        drain_timeout: Duration::from_secs(5),
    };
    let metrics_server = tokio::spawn(crate::listener::serve(
        metrics_listener,
        metrics_app,
        listener_limits,
        metrics_stop.clone(),
    ));
    let admin_server = admin_listener.map(|l| {
        tokio::spawn(crate::listener::serve(
            l,
            admin_app,
            listener_limits,
            metrics_stop,
        ))
    });

    // Background loops log under the pod's span (HTTP requests and sockets carry the pod id
    // in their own spans).
    let pod_span = tracing::info_span!("pod", pod = %pod);
    let background = TaskTracker::new();
    background.spawn(pulse.run(stopped.clone()).instrument(pod_span.clone()));
    background.spawn(
        quota_loop(hub.clone(), cfg.quotas.refresh_interval.0, stopped.clone())
            .instrument(pod_span.clone()),
    );
    background.spawn(
        ready
            .run(cfg.readiness.interval.0, stopped.clone())
            .instrument(pod_span.clone()),
    );
    background.spawn(
        presence_loop(hub.clone(), cfg.lease.presence_interval.0, stopped.clone())
            .instrument(pod_span.clone()),
    );
    let janitor = Arc::new(Janitor::new(
        hub.clone(),
        &connectors,
        cfg.lease.presence_ttl.0,
        cfg.lease.janitor_lease_ttl.0,
    ));
    background.spawn(
        janitor_loop(
            janitor.clone(),
            hosts.clone(),
            cfg.lease.janitor_interval.0,
            stopped.clone(),
        )
        .instrument(pod_span.clone()),
    );
    background.close();

    let tls_server = if cfg.hosts_tls_listen.trim().is_empty() {
        None
    } else {
        let tls_listener = TcpListener::bind(cfg.hosts_tls_listen.trim())
            .await
            .with_context(|| format!("binding the hosts mTLS listener {}", cfg.hosts_tls_listen))?;
        let tls_addr = tls_listener.local_addr()?;
        let (cert, key) = ca
            .server_certificate(&tls_names(&cfg, &hub))
            .context("issuing the mTLS listener certificate")?;
        let tls = switchyard_hosts_tls::server::server_config(&ca.cert_pem(), &cert, &key)
            .context("mTLS listener configuration")?;
        let router = crate::telemetry::observe(
            Router::new().nest(
                crate::providers::AGENT_HOST_PREFIX,
                crate::hosts::router(gateway.clone(), crate::hosts::CertSource::Tls),
            ),
            "hosts_tls",
            &pod,
        );
        tracing::info!(%tls_addr, "hosts mTLS listener");
        Some(tokio::spawn(switchyard_hosts_tls::server::serve_with(
            tls_listener,
            tls,
            router,
            listener_limits,
            drain.clone(),
        )))
    };
    tracing::info!(%local, pod = %pod, "switchyard serving");
    let accept_stop = drain.clone();
    let server = tokio::spawn(async move {
        crate::listener::serve(listener, app, listener_limits, accept_stop).await;
    });

    shutdown.cancelled().await;
    tracing::info!("drain started");
    metrics::gauge!("switchyard_draining").set(1.0);
    draining.store(true, Ordering::SeqCst);
    drain.cancel();
    sessions.close();
    if tokio::time::timeout(
        cfg.drain_timeout.0 + Duration::from_secs(2),
        sessions.wait(),
    )
    .await
    .is_err()
    {
        tracing::warn!(
            remaining = sessions.len(),
            "sessions still open after the drain timeout"
        );
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    if let Some(t) = tls_server {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    stopped.cancel();
    providers_stop.cancel();
    background.wait().await;
    // Acked messages stay behind the channels' ack cursors until the janitor's bulk purge. A
    // pod that drained removes them at once, so a build that does not read the cursors (an
    // older one after `helm rollback`, or still running mid-upgrade) never delivers them again.
    match hub.store.purge_acked_outbox().await {
        Ok(n) => tracing::debug!(purged = n, "acked messages removed at the drain"),
        Err(e) => {
            tracing::warn!(error = %e, "removing acked messages at the drain failed; the janitor removes them")
        }
    }
    janitor.resign().await;
    if let Err(e) = hub.store.remove_pod(&pod, now_ms()).await {
        tracing::warn!(error = %e, "removing pod presence failed; peers reap it after the presence TTL");
    }
    let _ = metrics_server.await;
    if let Some(a) = admin_server {
        let _ = a.await;
    }
    tracing::info!("drain complete");
    Ok(())
}

/// Reloads the tenants' quota overrides (`switchyard tenant quota`), so a change reaches
/// every pod within one interval.
async fn quota_loop(hub: Arc<Hub>, every: Duration, stop: CancellationToken) {
    let mut t = tokio::time::interval(every.max(Duration::from_millis(100)));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = t.tick() => {
                if let Err(e) = hub.quotas.refresh(hub.store.as_ref()).await {
                    tracing::warn!(error = %e, "reloading tenant quotas failed; keeping the last ones");
                }
            }
        }
    }
}

async fn presence_loop(hub: Arc<Hub>, every: Duration, stop: CancellationToken) {
    let mut t = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = t.tick() => {
                if let Err(e) = hub.store.pod_heartbeat(&hub.pod_id, now_ms()).await {
                    tracing::warn!(error = %e, "pod heartbeat failed");
                }
            }
        }
    }
}

async fn janitor_loop(
    janitor: Arc<Janitor>,
    hosts: Arc<Hosts>,
    every: Duration,
    stop: CancellationToken,
) {
    let mut t = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = t.tick() => match crate::telemetry::timed_sweep(janitor.step(), hosts.sweep(), hosts.hub.store.as_ref()).await {
                Ok(Some((r, hosts_sweep))) => {
                    if r.connectors_removed + r.channels_removed + r.dead_pods > 0 {
                        tracing::info!(generation = r.generation, dead_pods = r.dead_pods, connectors = r.connectors_removed, channels = r.channels_removed, files = r.files_removed, "janitor sweep");
                    }
                    // Hosts are swept by the same single lease holder.
                    match hosts_sweep {
                        Ok(h) if h.hosts_lost + h.approvals_expired + h.runs_purged > 0 => {
                            tracing::info!(hosts_lost = h.hosts_lost, runs = h.runs_requeued_or_failed, approvals_expired = h.approvals_expired, runs_purged = h.runs_purged, "host sweep");
                        }
                        Ok(_) => {}
                        Err(e) => tracing::warn!(error = %e, "host sweep failed"),
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "janitor sweep failed"),
            }
        }
    }
}
