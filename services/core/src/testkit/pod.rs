//! A provider on one pod of a test cluster, called the way the core calls it.

use std::sync::{Arc, Mutex};

use axum::serve::ListenerExt as _;
use serde_json::{Map, Value};
use switchyard_protocol::ConnectionStatus;
use switchyard_protocol::card::AuthFlow;
use switchyard_protocol::im::ActivityStatus;
use tokio_util::sync::CancellationToken;

use super::cluster::{AuthSession, Cluster};
use super::services::FakeServices;
use super::{NoProgress, TENANT, init_logs};
use crate::ids::now_ms;
use crate::provider::{
    AuthPoll, AuthRequest, AuthStep, OutboundMessage, Provider, ProviderError, ProviderServices,
    ToolCall,
};
use crate::store::Store;

/// One pod: a provider, the services it was built with and the stop of its background loops
/// (cancelled on drop).
/// What the provider answered to the calls made through the pod is kept in `shown`, in the
/// form a client would see it, for the secrets checks.
pub struct ProviderPod<P> {
    pub provider: Arc<P>,
    pub services: Arc<FakeServices>,
    pub stop: CancellationToken,
    /// `http://127.0.0.1:PORT`, the services' public base URL; the provider's ingress, if it has
    /// one, is served there under its prefix.
    pub url: String,
    /// The public parts of every auth step, tool result and error the provider returned.
    pub shown: Mutex<Vec<String>>,
}

impl<P> Drop for ProviderPod<P> {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// What of an auth step reaches a client: never the credentials nor the provider state.
pub fn public_step(step: &AuthStep) -> String {
    match step {
        AuthStep::Authenticated {
            view, binding_key, ..
        } => format!(
            "authenticated {} {binding_key:?}",
            serde_json::to_string(view).unwrap_or_default()
        ),
        AuthStep::Pending {
            status,
            qr_code_text,
            qr_code_image,
            message,
            ..
        } => format!("pending {status:?} {qr_code_text:?} {qr_code_image:?} {message}"),
        AuthStep::Failed { code, message } => format!("failed {code} {message}"),
    }
}

impl<P: Provider> ProviderPod<P> {
    /// Starts a provider on pod `name` of `cluster`, as the edge does: the pod's services
    /// for a provider mounted under `prefix` first, then the provider `build` makes with
    /// them, its ingress served on a real port and, when `run` is true, its background loops
    /// started (after the ingress).
    pub async fn start(
        cluster: Arc<Cluster>,
        name: &str,
        prefix: &str,
        build: impl FnOnce(Arc<dyn ProviderServices>) -> P,
        run: bool,
    ) -> Self {
        init_logs();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let services = FakeServices::new(cluster, name, &url, prefix);
        let provider = Arc::new(build(services.clone()));
        assert_eq!(provider.prefix(), prefix, "the provider's prefix");
        let stop = CancellationToken::new();
        if let Some(router) = provider.ingress() {
            let app = axum::Router::new().nest(provider.prefix(), router);
            let served = stop.clone();
            tokio::spawn(async move {
                let _ = axum::serve(
                    listener.tap_io(|tcp| {
                        // Nagle off, as a real server has it: no delayed-ACK waits.
                        let _ = tcp.set_nodelay(true);
                    }),
                    app,
                )
                .with_graceful_shutdown(served.cancelled_owned())
                .await;
            });
        }
        if run {
            provider.start(stop.clone());
        }
        Self {
            provider,
            services,
            stop,
            url,
            shown: Mutex::default(),
        }
    }

    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.services.cluster
    }

    fn show(&self, what: String) {
        self.shown.lock().unwrap().push(what);
    }

    fn show_result(&self, r: &Result<Value, ProviderError>) {
        match r {
            Ok(v) => self.show(v.to_string()),
            Err(e) => self.show(e.to_string()),
        }
    }

    /// A flow of the Card; panics when it declares none by that id.
    pub fn flow(&self, flow_id: &str) -> AuthFlow {
        self.provider
            .card()
            .flow(flow_id)
            .unwrap_or_else(|| panic!("the Card declares no flow {flow_id}"))
            .clone()
    }

    /// `auth.start` of `flow` with `input` and no stored session (form flows).
    pub async fn try_auth(
        &self,
        flow: &AuthFlow,
        channel_id: &str,
        auth_session_id: &str,
        input: &Map<String, Value>,
    ) -> Result<AuthStep, ProviderError> {
        let r = self
            .provider
            .auth_start(AuthRequest {
                tenant_id: TENANT,
                channel_id,
                auth_session_id,
                flow,
                input,
            })
            .await;
        match &r {
            Ok(step) => self.show(public_step(step)),
            Err(e) => self.show(e.to_string()),
        }
        r
    }

    /// `auth.start` of the form flow `flow_id` with `input` (an object); panics on an error.
    pub async fn auth(&self, flow_id: &str, channel_id: &str, input: Value) -> AuthStep {
        let Value::Object(input) = input else {
            panic!("object input")
        };
        self.try_auth(&self.flow(flow_id), channel_id, "auth_1", &input)
            .await
            .expect("auth_start")
    }

    /// [`auth`](Self::auth), then the binding stored as the core would on success.
    pub async fn bind(&self, flow_id: &str, channel_id: &str, input: Value) -> AuthStep {
        let step = self.auth(flow_id, channel_id, input).await;
        if let AuthStep::Authenticated { credentials, .. } = &step {
            self.services.cluster.bind(channel_id, credentials.clone());
        }
        step
    }

    /// `auth.start` as the core runs it for flows with a session (QR, pairing): the session
    /// exists first, the step is applied after.
    pub async fn session_start(
        &self,
        flow_id: &str,
        channel_id: &str,
        session_id: &str,
        input: Value,
    ) -> AuthStep {
        let cluster = &self.services.cluster;
        cluster.open_session(session_id, channel_id, Value::Null);
        let ch = cluster.channel(channel_id);
        if ch.binding.is_none() {
            cluster
                .store
                .set_channel_status(&ch.id, ConnectionStatus::Authenticating, &ch.view, now_ms())
                .await
                .expect("store");
        }
        let Value::Object(input) = input else {
            panic!("object input")
        };
        let step = self
            .try_auth(&self.flow(flow_id), channel_id, session_id, &input)
            .await
            .expect("auth_start");
        self.apply(session_id, step.clone()).await;
        step
    }

    /// Applies a step the provider answered as the core does (`CardServices::apply_step`): a
    /// success binds the session's channel with the status the provider gives it, a terminal
    /// step forgets the provider state, and a session that ended meanwhile takes nothing.
    async fn apply(&self, session_id: &str, step: AuthStep) {
        let cluster = &self.services.cluster;
        let Some(mut rec) = cluster
            .store
            .get_auth_session(session_id)
            .await
            .expect("store")
        else {
            return;
        };
        let ch = cluster.channel(&rec.channel_id);
        self.services
            .real
            .apply_step(Some(self.provider.as_ref()), &ch, &mut rec, step)
            .await
            .expect("the core takes the step");
    }

    /// `auth.status` as the core runs it (terminal sessions are not polled); returns the
    /// session afterwards.
    pub async fn session_poll(
        &self,
        flow_id: &str,
        session_id: &str,
        refresh: bool,
    ) -> AuthSession {
        let s = self.services.cluster.session(session_id);
        if s.status.is_terminal() {
            return s;
        }
        let flow = self.flow(flow_id);
        let step = self
            .provider
            .auth_poll(AuthPoll {
                channel_id: &s.channel_id,
                auth_session_id: session_id,
                flow: &flow,
                status: s.status,
                state: &s.state,
                refresh,
            })
            .await
            .expect("auth_poll");
        if let Some(step) = step {
            self.show(public_step(&step));
            self.apply(session_id, step).await;
        }
        self.services.cluster.session(session_id)
    }

    /// Calls a tool on a bound channel (`args` is an object).
    pub async fn tool(
        &self,
        channel_id: &str,
        tool_id: &str,
        args: Value,
        key: &str,
    ) -> Result<Value, ProviderError> {
        let binding = self.services.cluster.binding(channel_id);
        let Value::Object(arguments) = args else {
            panic!("object arguments")
        };
        let r = self
            .provider
            .invoke_tool(ToolCall {
                binding: &binding,
                tool_id,
                arguments: &arguments,
                idempotency_key: key,
                progress: &NoProgress,
            })
            .await;
        self.show_result(&r);
        r
    }

    /// Delivers a final message with uploaded files of the channel.
    pub async fn deliver(
        &self,
        channel_id: &str,
        message_id: &str,
        text: Option<&str>,
        file_refs: &[&str],
    ) -> Result<(), ProviderError> {
        let binding = self.services.cluster.binding(channel_id);
        let mut files = Vec::new();
        for r in file_refs {
            let (f, _) = self
                .services
                .open_file(channel_id, r)
                .await
                .expect("uploaded file");
            files.push(f);
        }
        let r = self
            .provider
            .deliver(OutboundMessage {
                binding: &binding,
                message_id,
                text,
                files: &files,
            })
            .await;
        if let Err(e) = &r {
            self.show(e.to_string());
        }
        r
    }

    pub async fn activity(
        &self,
        channel_id: &str,
        status: ActivityStatus,
    ) -> Result<(), ProviderError> {
        let binding = self.services.cluster.binding(channel_id);
        self.provider.activity(&binding, status).await
    }

    pub async fn delta(
        &self,
        channel_id: &str,
        message_id: &str,
        text: &str,
    ) -> Result<(), ProviderError> {
        let binding = self.services.cluster.binding(channel_id);
        self.provider.delta(&binding, message_id, text).await
    }
}
