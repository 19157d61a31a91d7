//! The composition root of a pod: [`App::build`] opens the backends chosen by the config,
//! builds the hub, the host service and the mounted connectors, and binds every listener;
//! [`App::serve`] starts them with the background loops and, once `shutdown` is cancelled,
//! drains. The command line reuses the engine half ([`admin_hosts`]).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use switchyard_core::crypto::{Cipher, Secret, UrlSigner};
use switchyard_core::engine::{Hub, HubParts, Janitor, MountedCard, OutflowLimits};
use switchyard_core::hosts::Hosts;
use switchyard_core::ids::random_secret;
use switchyard_core::journal::JournalConfig;
use switchyard_core::trace::Tracer;
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
mod loops;
mod probes;

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

/// Names in the mTLS listener's certificate.
fn tls_names(cfg: &Config, hub: &Hub) -> Vec<String> {
    let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    if let Ok(u) = url::Url::parse(hub.public_base_url())
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

/// The engine half of a pod, the same for the server and the command line: the backends
/// opened and their schema prepared, the keys loaded, the hub and the host service built.
struct Engine {
    hub: Arc<Hub>,
    hosts: Arc<Hosts>,
    /// The deployment's signing keys (URL signatures; the first also derives the host JWT key).
    signing: Vec<Secret>,
}

impl Engine {
    async fn build(
        cfg: &Config,
        pod_id: String,
        public_base_url: String,
        journal: JournalConfig,
        tracer: Tracer,
    ) -> anyhow::Result<Self> {
        let b = backends(cfg).await?;
        prepare_schema(cfg, b.store.as_ref()).await?;
        let (signing, encryption) = keys(cfg)?;
        let hub = Arc::new(Hub::new(HubParts {
            store: b.store,
            bus: b.bus,
            ephemeral: b.ephemeral,
            files: b.files,
            cipher: Cipher::from_base64(&encryption).context("encryption keys")?,
            signer: UrlSigner::new(signing.clone()).context("signing keys")?,
            config: cfg.engine(),
            pod_id,
            public_base_url,
            commit: cfg.commit_limits(),
            quotas: cfg.quotas.values(),
            journal,
            tracer,
        }));
        let hosts = Arc::new(Hosts::new(hub.clone(), cfg.hosts.core()));
        Ok(Self {
            hub,
            hosts,
            signing,
        })
    }
}

/// The host service for administrative commands (CLI): the same backends and keys as a pod,
/// under a pod id of its own, recording no journal.
pub async fn admin_hosts(cfg: &Config) -> anyhow::Result<Arc<Hosts>> {
    let public_base_url = cfg
        .public_base_url
        .clone()
        .unwrap_or_else(|| format!("http://{}", cfg.listen));
    let engine = Engine::build(
        cfg,
        format!("cli-{}", random_secret(3)),
        public_base_url,
        JournalConfig::off(),
        Tracer::disabled(),
    )
    .await?;
    Ok(engine.hosts)
}

/// A listener's accept loop, built and not yet polled: [`App::serve`] spawns it.
type Server = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A pod built from its configuration with every listener bound, not yet serving.
pub struct App {
    cfg: Config,
    /// Held while the pod runs: the data directory's identity stays this process's.
    _identity: PodIdentity,
    hub: Arc<Hub>,
    hosts: Arc<Hosts>,
    connectors: Vec<MountedCard>,
    /// Printed once, on the first start of an embedded node: where to point xAgent, with
    /// which key.
    first_start: Option<Secret>,
    readiness: Arc<crate::readiness::Readiness>,
    pulse: Arc<crate::console::Pulse>,
    /// The public listener's address.
    local: SocketAddr,
    /// The public listener (connectors, the host gateway) and the mTLS one: they stop
    /// accepting when the drain starts.
    public: Server,
    tls: Option<Server>,
    /// The internal listener (metrics, probes) and the admin one: they stop last.
    internal: Server,
    admin: Option<Server>,
    /// Cancelled when the drain starts: sessions finish in-flight work and close.
    drain: CancellationToken,
    draining: Arc<AtomicBool>,
    sessions: TaskTracker,
    /// Cancelled at the end of the drain: internal listeners and background loops.
    stopped: CancellationToken,
    /// The OTLP span exporter, when configured: it sends what is queued once `stopped`.
    exporter: Option<tokio::task::JoinHandle<()>>,
}

impl App {
    /// Opens the backends, joins the deployment, mounts the connectors and binds the admin
    /// and mTLS listeners when configured. `listener` and `metrics_listener` are the public
    /// and internal listeners, bound by the caller.
    pub async fn build(
        cfg: Config,
        listener: TcpListener,
        metrics_listener: TcpListener,
    ) -> anyhow::Result<Self> {
        crate::telemetry::prometheus();
        let build = build_info();
        crate::telemetry::build_info_metric(&build.version, &build.git_rev);
        let identity = pod_identity(&cfg);
        let pod = identity.id.clone();
        tracing::info!(pod_id = %pod, source = ?identity.source, "pod identity");
        let local: SocketAddr = listener.local_addr()?;
        let public_base_url = cfg
            .public_base_url
            .clone()
            .unwrap_or_else(|| format!("http://{local}"));
        // Cancelled at the end of the drain: internal listeners, background loops and the
        // span exporter (which sends what is still queued).
        let stopped = CancellationToken::new();
        let (tracer, exporter) = match crate::otel::OtlpConfig::from_env(|k| std::env::var(k).ok())
            .context("OpenTelemetry export (OTEL_* variables)")?
        {
            Some(otlp) => {
                let (t, task) = crate::otel::start(otlp, &pod, &build.version, stopped.clone())?;
                (t, Some(task))
            }
            None => (Tracer::disabled(), None),
        };
        let Engine {
            hub,
            hosts,
            signing,
        } = Engine::build(
            &cfg,
            pod.clone(),
            public_base_url,
            cfg.journal.core(),
            tracer,
        )
        .await?;
        let store = hub.store();
        let first_start = if !cfg.is_clustered() && store.list_tenants().await?.is_empty() {
            Some(switchyard_core::engine::create_tenant(store.as_ref(), "default").await?)
        } else {
            None
        };
        let restarted = hub
            .arrive(cfg.lease.presence_ttl.0)
            .await
            .context("joining the deployment (pod presence, tenant quotas)")?;
        if restarted > 0 {
            tracing::info!(
                connectors = restarted,
                "first pod up: offline grace restarts now for restored connectors"
            );
        }

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
                hub.ephemeral().clone(),
                cfg.operator_auth.limits(),
            ),
            drain: drain.clone(),
            draining: draining.clone(),
            sessions: sessions.clone(),
        };
        // The gateway's routes on the public listener: certificates come from a trusted
        // ingress header, if one is configured.
        let public_gateway = crate::hosts::router(
            gateway.clone(),
            crate::hosts::CertSource::Header(trusted_ingress(&cfg)?),
        );
        let connectors: Vec<MountedCard> = connectors(&cfg, &hub, hosts.clone(), public_gateway);
        let metrics_addr = metrics_listener.local_addr()?;
        let base_urls: Vec<(String, String)> = connectors
            .iter()
            .map(|c| {
                let base = hub.public_base_url().trim_end_matches('/');
                (c.card_id().to_owned(), format!("{base}{}", c.prefix()))
            })
            .collect();
        crate::telemetry::register_connectors(
            &connectors
                .iter()
                .map(|c| {
                    let card = c.provider.card();
                    let tools = card.tools.iter().map(|t| t.tool_id.clone()).collect();
                    (c.card_id().to_owned(), c.prefix(), tools)
                })
                .collect::<Vec<_>>(),
        );
        for (card, url) in &base_urls {
            tracing::info!(card = %card, base_url = %url, "connector mounted");
        }
        tracing::info!(%metrics_addr, "internal listener: /metrics, /livez, /readyz");
        let first_start = first_start.map(|(tenant, key)| {
            Secret::new(first_start_text(
                &tenant,
                &base_urls,
                metrics_addr,
                key.key.expose(),
            ))
        });

        // Every listener runs the same accept loop: header timeout and connection cap.
        let limits = crate::listener::ListenerLimits {
            max_connections: cfg.limits.max_connections,
            header_read_timeout: cfg.limits.header_read_timeout.0,
            drain_timeout: Duration::from_secs(5),
        };
        let public_app = public_router(&cfg, &connectors, &hub, &drain, &draining, &sessions);
        let public: Server = Box::pin(crate::listener::serve(
            listener,
            public_app,
            limits,
            drain.clone(),
        ));

        let readiness = probes::readiness(&cfg, &hub);
        let pulse = Arc::new(crate::console::Pulse::new(
            &pod,
            cfg.console.sample_interval.0,
            hub.ephemeral().clone(),
            hub.tally().clone(),
        ));
        // The operator API (/admin/v1) and the console (/console). With `admin_listen` set
        // (the chart sets it) they get their own address, so network access to /metrics is
        // not console access; unset, they stay on the internal listener, where CONTRACT.md
        // puts them. The operator API is never on the public listener.
        let admin_routes = crate::hosts::operator_router(gateway.clone()).merge(
            crate::console::router(crate::console::ConsoleState {
                hosts: hosts.clone(),
                pulse: pulse.clone(),
                operators: gateway.operators.clone(),
            }),
        );
        let own_admin_listener = !cfg.admin_listen.trim().is_empty();
        let internal_app = probes::router(readiness.clone(), store.clone(), draining.clone());
        let (internal_app, admin_app) = if own_admin_listener {
            (internal_app, admin_routes)
        } else {
            (internal_app.merge(admin_routes), Router::new())
        };
        let internal: Server = Box::pin(crate::listener::serve(
            metrics_listener,
            crate::telemetry::observe(internal_app, "internal", &pod),
            limits,
            stopped.clone(),
        ));
        let admin: Option<Server> = if gateway.operators.is_empty() || !own_admin_listener {
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
            Some(Box::pin(crate::listener::serve(
                l,
                crate::telemetry::observe(admin_app, "admin", &pod),
                limits,
                stopped.clone(),
            )))
        };

        let tls: Option<Server> = if cfg.hosts_tls_listen.trim().is_empty() {
            None
        } else {
            let tls_listener = TcpListener::bind(cfg.hosts_tls_listen.trim())
                .await
                .with_context(|| {
                    format!("binding the hosts mTLS listener {}", cfg.hosts_tls_listen)
                })?;
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
            Some(Box::pin(switchyard_hosts_tls::server::serve_with(
                tls_listener,
                tls,
                router,
                limits,
                drain.clone(),
            )))
        };

        Ok(Self {
            cfg,
            _identity: identity,
            hub,
            hosts,
            connectors,
            first_start,
            local,
            readiness,
            pulse,
            public,
            tls,
            internal,
            admin,
            drain,
            draining,
            sessions,
            stopped,
            exporter,
        })
    }

    /// Serves until `shutdown` is cancelled, then drains: readiness fails, new upgrades are
    /// refused, sessions finish in-flight work within the drain timeout and close with a
    /// reconnect code, leases and presence are released.
    pub async fn serve(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let cfg = &self.cfg;
        if let Some(text) = &self.first_start {
            print!("{}", text.expose());
        }
        // Stops provider background consumers (pollers) at the end of the drain.
        let providers_stop = CancellationToken::new();
        for c in &self.connectors {
            c.provider.start(providers_stop.clone());
        }
        let internal = tokio::spawn(self.internal);
        let admin = self.admin.map(tokio::spawn);
        let tls = self.tls.map(tokio::spawn);
        let public = tokio::spawn(self.public);

        // Background loops log under the pod's span (HTTP requests and sockets carry the
        // pod id in their own spans).
        let hub = &self.hub;
        let stopped = &self.stopped;
        let pod_span = tracing::info_span!("pod", pod = %hub.pod_id());
        let background = TaskTracker::new();
        let spawn = |f: Pin<Box<dyn Future<Output = ()> + Send>>| {
            background.spawn(f.instrument(pod_span.clone()));
        };
        spawn(Box::pin(self.pulse.clone().run(stopped.clone())));
        spawn(Box::pin(loops::quota_loop(
            hub.clone(),
            cfg.quotas.refresh_interval.0,
            stopped.clone(),
        )));
        spawn(Box::pin(
            self.readiness
                .clone()
                .run(cfg.readiness.interval.0, stopped.clone()),
        ));
        spawn(Box::pin(loops::presence_loop(
            hub.clone(),
            cfg.lease.presence_interval.0,
            stopped.clone(),
        )));
        let janitor = Arc::new(Janitor::new(
            hub.clone(),
            &self.connectors,
            cfg.lease.presence_ttl.0,
            cfg.lease.janitor_lease_ttl.0,
        ));
        spawn(Box::pin(loops::janitor_loop(
            janitor.clone(),
            self.hosts.clone(),
            cfg.lease.janitor_interval.0,
            stopped.clone(),
        )));
        background.close();
        tracing::info!(local = %self.local, pod = %hub.pod_id(), "switchyard serving");

        shutdown.cancelled().await;
        tracing::info!("drain started");
        metrics::gauge!("switchyard_draining").set(1.0);
        self.draining.store(true, Ordering::SeqCst);
        self.drain.cancel();
        self.sessions.close();
        if tokio::time::timeout(
            cfg.drain_timeout.0 + Duration::from_secs(2),
            self.sessions.wait(),
        )
        .await
        .is_err()
        {
            tracing::warn!(
                remaining = self.sessions.len(),
                "sessions still open after the drain timeout"
            );
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), public).await;
        if let Some(t) = tls {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        self.stopped.cancel();
        providers_stop.cancel();
        background.wait().await;
        janitor.resign().await;
        // The journal's writer holds a message's steps until it goes quiet: store them now.
        let _ = tokio::time::timeout(Duration::from_secs(5), hub.journal().flush()).await;
        hub.depart().await;
        if let Some(e) = self.exporter {
            let _ = tokio::time::timeout(Duration::from_secs(10), e).await;
        }
        let _ = internal.await;
        if let Some(a) = admin {
            let _ = a.await;
        }
        tracing::info!("drain complete");
        Ok(())
    }
}

/// Runs a pod until `shutdown` is cancelled, then drains ([`App::build`], [`App::serve`]).
pub async fn run(
    cfg: Config,
    listener: TcpListener,
    metrics_listener: TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    App::build(cfg, listener, metrics_listener)
        .await?
        .serve(shutdown)
        .await
}

/// The public listener's routes: every mounted Card under its prefix, each socket's session
/// bounded by the configured limits.
fn public_router(
    cfg: &Config,
    connectors: &[MountedCard],
    hub: &Hub,
    drain: &CancellationToken,
    draining: &Arc<AtomicBool>,
    sessions: &TaskTracker,
) -> Router {
    let doorbells = Doorbells::new(hub.bus().clone());
    let limits = session_limits(cfg);
    let mut app = Router::new();
    for c in connectors {
        let state = ConnState {
            conn: c.clone(),
            doorbells: doorbells.clone(),
            limits: limits.clone(),
            drain: drain.clone(),
            draining: draining.clone(),
            sessions: sessions.clone(),
        };
        let mut routes = connector_router(state);
        if hub.tracer().enabled() {
            let (tracer, prefix) = (hub.tracer().clone(), c.prefix());
            routes = routes.layer(axum::middleware::from_fn(move |req, next| {
                crate::otel::server_span(tracer.clone(), prefix, req, next)
            }));
        }
        app = app.nest(c.prefix(), routes);
    }
    let app = app.layer(axum::middleware::from_fn(crate::listener::answer_refusals));
    // Spans name the path only: query strings carry URL signatures and pairing tokens.
    crate::telemetry::observe(app, "public", hub.pod_id())
}

/// The bounds of one xAgent socket, from the config.
fn session_limits(cfg: &Config) -> SessionLimits {
    SessionLimits {
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
    }
}
