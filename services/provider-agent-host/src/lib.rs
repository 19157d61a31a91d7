//! `device.agent-host`: a remote agent host (Connector API v1) as an xAgent `device` channel.
//!
//! A channel binds to one host of its tenant with the host's name and the pairing code the
//! host agent prints (one channel per host and tenant). The tools act only on that host:
//! observe it, start runs on its agents, follow, cancel and hand them off, fetch artifacts.
//! The run machinery lives in [`switchyard_core::hosts::Hosts`]; this crate maps tools onto it.
//! Approvals are not a tool: only people decide them, through the operator API.

mod card;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::{Map, Value, json};
use switchyard_core::hosts::{
    AgentHostRefusal, AgentHostRefusalCode, Hosts, NewRun, binding_key, connection_status,
};
use switchyard_core::hoststore::{HostRecord, HostStatus, RunRecord};
use switchyard_core::provider::{
    AuthRequest, AuthStep, Binding, OutboundMessage, Provider, ProviderError, ProviderErrorKind,
    ProviderServices, ToolCall,
};
use switchyard_protocol::descriptor::TargetView;
use switchyard_protocol::hosts::message::{ContextBundle, HandoffBundle, RunConstraints};
use switchyard_protocol::{BuildInfo, Card, ConnectionStatus, ErrorCode};

pub use card::*;

pub const PREFIX: &str = "/hosts";

pub struct AgentHostProvider {
    card: Card,
    skill: String,
    hosts: Arc<Hosts>,
    /// What the core offers this Card (artifact files are opened through it).
    services: Arc<dyn ProviderServices>,
    /// Longest `agent_run_wait`; kept below the engine's tool timeout.
    max_wait: Duration,
    /// The Connector API routes hosts dial, served under this connector's prefix; the edge
    /// builds them (they need its certificate authority, JWT key and drain).
    gateway: Option<axum::Router>,
}

impl AgentHostProvider {
    pub fn new(
        build: BuildInfo,
        api_key_required: bool,
        hosts: Arc<Hosts>,
        max_wait: Duration,
        services: Arc<dyn ProviderServices>,
    ) -> Self {
        Self {
            card: card::build(build, api_key_required),
            skill: card::skill(),
            hosts,
            services,
            max_wait,
            gateway: None,
        }
    }

    /// Serves `routes` (the host gateway) next to the connector's own routes.
    pub fn with_gateway(mut self, routes: axum::Router) -> Self {
        self.gateway = Some(routes);
        self
    }

    /// The host a binding names, checked against the binding's tenant.
    async fn bound_host(&self, binding: &Binding) -> Result<HostRecord, ProviderError> {
        let host_id = binding
            .credentials
            .get("host_id")
            .and_then(Value::as_str)
            .unwrap_or_default();
        match self.hosts.host(host_id).await {
            Ok(Some(h)) if h.tenant_id == binding.tenant_id => {
                if h.status == HostStatus::Revoked {
                    return Err(ProviderError::new(
                        ProviderErrorKind::Unauthorized,
                        AgentHostRefusalCode::HostRevoked,
                        "the host was revoked by an operator",
                    ));
                }
                Ok(h)
            }
            Ok(_) => Err(ProviderError::new(
                ProviderErrorKind::Unauthorized,
                AgentHostRefusalCode::HostNotFound,
                "the bound host no longer exists",
            )),
            Err(e) => Err(map_err(e.into())),
        }
    }

    /// A run of the bound host, or one started from this channel (a handoff may have moved
    /// the work to another host of the tenant).
    async fn run_of(
        &self,
        host: &HostRecord,
        channel_id: &str,
        args: &Map<String, Value>,
    ) -> Result<RunRecord, ProviderError> {
        let run_id = required_str(args, "run_id")?;
        self.visible_run(host, channel_id, run_id).await
    }

    async fn visible_run(
        &self,
        host: &HostRecord,
        channel_id: &str,
        run_id: &str,
    ) -> Result<RunRecord, ProviderError> {
        let run = self
            .hosts
            .run(run_id)
            .await
            .map_err(|e| map_err(e.into()))?;
        match run {
            Some(r)
                if r.tenant_id == host.tenant_id
                    && (r.host_id == host.id || r.channel_id.as_deref() == Some(channel_id)) =>
            {
                Ok(r)
            }
            _ => Err(map_err(AgentHostRefusal::new(
                AgentHostRefusalCode::RunNotFound,
                "no such run on this channel",
            ))),
        }
    }

    async fn host_status(&self, host: &HostRecord) -> Result<Value, ProviderError> {
        let agents = self
            .hosts
            .agents(&host.id)
            .await
            .map_err(|e| map_err(e.into()))?;
        let runs = self
            .hosts
            .live_runs(&host.id)
            .await
            .map_err(|e| map_err(e.into()))?;
        Ok(json!({
            "name": host.name,
            "status": host.status.as_str(),
            "hostname": host.hostname,
            "agent_version": host.agent_version,
            "adapters": host.adapters,
            "last_seen_at": host.last_seen_at,
            "metrics": host.metrics,
            "agents": agents.iter().map(|a| json!({
                "agent_id": a.agent_id,
                "runtime": a.runtime,
                "model": a.model,
                "tools": a.tools,
                "max_turns": a.max_turns,
                "supports": a.supports,
            })).collect::<Vec<_>>(),
            "active_runs": runs.iter().map(|r| json!({"run_id": r.id, "agent_id": r.agent_id, "state": r.state.as_str()})).collect::<Vec<_>>(),
        }))
    }

    async fn run_start(
        &self,
        call: &ToolCall<'_>,
        host: &HostRecord,
    ) -> Result<Value, ProviderError> {
        let args = call.arguments;
        let goal = required_str(args, "goal")?.to_owned();
        if goal.len() > 16384 {
            return Err(ProviderError::invalid("goal is longer than 16384 bytes"));
        }
        let agent_id = match str_arg(args, "agent_id")? {
            Some(a) => a.to_owned(),
            None => {
                let agents = self
                    .hosts
                    .agents(&host.id)
                    .await
                    .map_err(|e| map_err(e.into()))?;
                match agents.as_slice() {
                    [one] => one.agent_id.clone(),
                    [] => {
                        return Err(ProviderError::new(
                            ProviderErrorKind::Rejected,
                            AgentHostRefusalCode::AgentNotFound,
                            "the host has declared no agents yet",
                        ));
                    }
                    _ => {
                        return Err(ProviderError::invalid(
                            "the host has several agents: pass agent_id (see host_status)",
                        ));
                    }
                }
            }
        };
        let context_bundle: ContextBundle = object_arg(args, "context_bundle")?;
        let constraints: RunConstraints = object_arg(args, "constraints")?;
        if constraints
            .timeout_seconds
            .is_some_and(|t| t == 0 || t > 86_400)
        {
            return Err(ProviderError::invalid(
                "constraints.timeout_seconds must be within 1..=86400",
            ));
        }
        let run = self
            .hosts
            .start_run(
                host,
                NewRun {
                    agent_id,
                    goal,
                    context_bundle,
                    constraints,
                    channel_id: Some(call.binding.channel_id.clone()),
                    parent_run_id: None,
                },
            )
            .await
            .map_err(map_err)?;
        let mut v = self.run_view(&run, false).await?;
        if host.status != HostStatus::Online {
            v["note"] = json!("the host is not online; the run starts when it reconnects");
        }
        Ok(v)
    }

    async fn run_view(
        &self,
        run: &RunRecord,
        with_artifacts: bool,
    ) -> Result<Value, ProviderError> {
        let mut v = json!({
            "run_id": run.id,
            "state": run.state.as_str(),
            "agent_id": run.agent_id,
            "summary": run.summary,
            "error": run.error_code.as_ref().map(|c| json!({"code": c, "message": run.error_message})),
            "event_count": run.event_count,
            "done": run.state.is_terminal(),
        });
        if let Some(p) = &run.parent_run_id {
            v["parent_run_id"] = json!(p);
        }
        if with_artifacts {
            let listed = self
                .hosts
                .run_artifacts(&run.id)
                .await
                .map_err(|e| map_err(e.into()))?;
            // Bytes PUT straight to object storage are noticed here.
            let mut arts = Vec::with_capacity(listed.len());
            for a in listed {
                if a.uploaded_at.is_some() {
                    arts.push(a);
                } else if let Some(up) = self
                    .hosts
                    .uploaded_artifact(&a.id)
                    .await
                    .map_err(|e| map_err(e.into()))?
                {
                    arts.push(up);
                }
            }
            v["artifacts"] = json!(arts
                .iter()
                .map(|a| json!({"artifact_id": a.id, "name": a.name, "content_type": a.content_type, "size_bytes": a.size_bytes}))
                .collect::<Vec<_>>());
        }
        Ok(v)
    }

    async fn run_wait(
        &self,
        call: &ToolCall<'_>,
        host: &HostRecord,
    ) -> Result<Value, ProviderError> {
        let mut run = self
            .run_of(host, &call.binding.channel_id, call.arguments)
            .await?;
        let wait = call
            .arguments
            .get("timeout_seconds")
            .and_then(Value::as_u64)
            .map_or(Duration::from_secs(25), Duration::from_secs)
            .min(self.max_wait);
        let deadline = tokio::time::Instant::now() + wait;
        let mut bells = self.hosts.run_bells(&run.id).await;
        let mut cursor = run.event_count;
        loop {
            // Progress for events that arrived since the call started (or the last look).
            let events = self
                .hosts
                .run_events(&run.id, cursor, 200)
                .await
                .map_err(|e| map_err(e.into()))?;
            for e in &events {
                cursor = e.seq;
                let text = event_text(&e.kind, &e.payload);
                let pct = e
                    .payload
                    .get("percent")
                    .and_then(Value::as_f64)
                    .map(|p| p / 100.0);
                call.progress.progress(run.state.as_str(), &text, pct);
            }
            if run.state.is_terminal() || tokio::time::Instant::now() >= deadline {
                break;
            }
            let tick = tokio::time::sleep(
                Duration::from_millis(500).min(deadline - tokio::time::Instant::now()),
            );
            match bells.as_mut() {
                Some(b) => {
                    tokio::select! {
                        _ = b.next() => {}
                        _ = tick => {}
                    }
                }
                None => tick.await,
            }
            run = self
                .visible_run(host, &call.binding.channel_id, &run.id)
                .await?;
        }
        self.run_view(&run, run.state.is_terminal()).await
    }

    async fn run_events(
        &self,
        call: &ToolCall<'_>,
        host: &HostRecord,
    ) -> Result<Value, ProviderError> {
        let run = self
            .run_of(host, &call.binding.channel_id, call.arguments)
            .await?;
        let after = call
            .arguments
            .get("after_seq")
            .and_then(Value::as_i64)
            .unwrap_or(0)
            .max(0);
        let limit = call
            .arguments
            .get("limit")
            .and_then(Value::as_u64)
            .unwrap_or(100)
            .clamp(1, 500) as u32;
        let events = self
            .hosts
            .run_events(&run.id, after, limit)
            .await
            .map_err(|e| map_err(e.into()))?;
        let next = events.last().map_or(after, |e| e.seq);
        Ok(json!({
            "run_id": run.id,
            "state": run.state.as_str(),
            "events": events.iter().map(|e| json!({
                "seq": e.seq,
                "event": e.kind,
                "timestamp": e.timestamp,
                "payload": e.payload,
            })).collect::<Vec<_>>(),
            "next_after_seq": next,
            "more": next < run.event_count,
        }))
    }

    async fn run_handoff(
        &self,
        call: &ToolCall<'_>,
        host: &HostRecord,
    ) -> Result<Value, ProviderError> {
        let args = call.arguments;
        let run = self.run_of(host, &call.binding.channel_id, args).await?;
        let to = required_str(args, "to_agent_id")?;
        let list = |k: &str| -> Result<Vec<String>, ProviderError> {
            match args.get(k) {
                None | Some(Value::Null) => Ok(vec![]),
                Some(v) => serde_json::from_value(v.clone()).map_err(|_| {
                    ProviderError::invalid(format!("{k} must be an array of strings"))
                }),
            }
        };
        let bundle = HandoffBundle {
            objective: str_arg(args, "objective")?.unwrap_or(&run.goal).to_owned(),
            progress: str_arg(args, "progress")?.unwrap_or_default().to_owned(),
            decisions: list("decisions")?,
            artifacts: list("artifacts")?,
            open_questions: list("open_questions")?,
        };
        let new = self
            .hosts
            .handoff(&run, to, &bundle, true)
            .await
            .map_err(map_err)?;
        let mut v = self.run_view(&new, false).await?;
        v["from_run_id"] = json!(run.id);
        Ok(v)
    }

    async fn artifact_fetch(
        &self,
        call: &ToolCall<'_>,
        host: &HostRecord,
    ) -> Result<Value, ProviderError> {
        let id = required_str(call.arguments, "artifact_id")?;
        let not_found = || {
            ProviderError::new(
                ProviderErrorKind::Rejected,
                switchyard_core::provider::ProviderCode::ArtifactNotFound,
                "no such artifact on this channel's host",
            )
        };
        let art = self
            .hosts
            .uploaded_artifact(id)
            .await
            .map_err(|e| map_err(e.into()))?
            .filter(|a| a.tenant_id == host.tenant_id)
            .ok_or_else(not_found)?;
        // Artifacts of handed-off runs may live on another host of the tenant; the run must
        // at least belong to this channel's host or descend from one of its runs.
        let run = self
            .hosts
            .run(&art.run_id)
            .await
            .map_err(|e| map_err(e.into()))?
            .ok_or_else(not_found)?;
        if run.host_id != host.id
            && run.channel_id.as_deref() != Some(call.binding.channel_id.as_str())
        {
            return Err(not_found());
        }
        let body = self
            .hosts
            .artifact_bytes(&art)
            .await
            .map_err(|e| map_err(e.into()))?;
        let item = self
            .services
            .store_inbound_file(
                &call.binding.channel_id,
                &art.name,
                Some(&art.content_type),
                body,
            )
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "artifact copy into channel files failed");
                ProviderError::new(
                    ProviderErrorKind::Transient,
                    ErrorCode::Unavailable,
                    "file storage is unavailable",
                )
            })?;
        Ok(json!({
            "artifact_id": art.id,
            "file_ref": item.file_ref,
            "download_url": item.download_url,
            "filename": item.filename,
            "mime_type": item.mime_type,
            "byte_size": item.byte_size,
            "expires_at": item.expires_at,
        }))
    }
}

/// One line of progress text for an event.
fn event_text(kind: &str, payload: &Value) -> String {
    let s = |k: &str| payload.get(k).and_then(Value::as_str);
    let detail = match kind {
        "thinking" => s("text"),
        "tool_call" => s("command").or(s("tool")),
        "tool_result" => s("output"),
        "progress" | "warning" | "error" => s("message"),
        "completion" => s("summary"),
        "approval_request" => s("action"),
        _ => None,
    };
    let mut t = match detail {
        Some(d) => format!("{kind}: {d}"),
        None => kind.to_owned(),
    };
    if t.len() > 500 {
        let mut end = 500;
        while !t.is_char_boundary(end) {
            end -= 1;
        }
        t.truncate(end);
    }
    t
}

fn map_err(e: AgentHostRefusal) -> ProviderError {
    let kind = match e.code {
        AgentHostRefusalCode::InvalidArguments => ProviderErrorKind::InvalidInput,
        AgentHostRefusalCode::Unavailable => ProviderErrorKind::Transient,
        AgentHostRefusalCode::Internal => ProviderErrorKind::Internal,
        AgentHostRefusalCode::HostRevoked => ProviderErrorKind::Unauthorized,
        _ => ProviderErrorKind::Rejected,
    };
    let code = match e.code {
        AgentHostRefusalCode::Unavailable => ErrorCode::Unavailable.into(),
        other => switchyard_core::provider::ProviderCode::AgentHost(other),
    };
    ProviderError::new(kind, code, e.message)
}

fn required_str<'a>(args: &'a Map<String, Value>, name: &str) -> Result<&'a str, ProviderError> {
    args.get(name)
        .and_then(Value::as_str)
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| {
            ProviderError::invalid(format!("{name} is required and must be a non-empty string"))
        })
}

fn str_arg<'a>(args: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, ProviderError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ProviderError::invalid(format!("{name} must be a string"))),
    }
}

fn object_arg<T: serde::de::DeserializeOwned + Default>(
    args: &Map<String, Value>,
    name: &str,
) -> Result<T, ProviderError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(T::default()),
        Some(v @ Value::Object(_)) => serde_json::from_value(v.clone())
            .map_err(|e| ProviderError::invalid(format!("{name}: {e}"))),
        Some(_) => Err(ProviderError::invalid(format!("{name} must be an object"))),
    }
}

fn normalise_code(code: &str) -> String {
    code.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_uppercase())
        .collect()
}

#[async_trait]
impl Provider for AgentHostProvider {
    fn card(&self) -> &Card {
        &self.card
    }

    fn skill(&self) -> Option<&str> {
        Some(&self.skill)
    }

    fn prefix(&self) -> &'static str {
        PREFIX
    }

    async fn auth_start(&self, req: AuthRequest<'_>) -> Result<AuthStep, ProviderError> {
        if req.flow.id != FLOW_PAIRING {
            return Err(ProviderError::new(
                ProviderErrorKind::InvalidInput,
                ErrorCode::UnknownAuthFlow,
                "unknown auth flow",
            ));
        }
        let field = |k: &str| {
            req.input
                .get(k)
                .and_then(Value::as_str)
                .map(str::trim)
                .unwrap_or_default()
        };
        let (name, code) = (field(FIELD_HOST_NAME), field(FIELD_PAIRING_CODE));
        if name.is_empty() || code.is_empty() {
            return Ok(AuthStep::Failed {
                code: "invalid_input".into(),
                message: "host_name and pairing_code are required".into(),
            });
        }
        let host = self
            .hosts
            .host_named(req.tenant_id, name)
            .await
            .map_err(|e| map_err(e.into()))?;
        // One answer for an unknown host and a wrong code: names are not probed this way.
        let matches = host.as_ref().is_some_and(|h| {
            use subtle::ConstantTimeEq;
            let (a, b) = (normalise_code(&h.pairing_code), normalise_code(code));
            a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
        });
        let Some(host) = host.filter(|h| {
            matches && h.status != HostStatus::Revoked && h.status != HostStatus::Enrolling
        }) else {
            return Ok(AuthStep::Failed {
                code: "pairing_failed".into(),
                message: "unknown host or wrong pairing code".into(),
            });
        };
        Ok(AuthStep::Authenticated {
            credentials: json!({"host_id": host.id}),
            view: TargetView {
                display_name: host.name.clone(),
                account_hint: host.hostname.clone(),
            },
            binding_key: Some(binding_key(&host.id)),
        })
    }

    async fn bound_status(&self, credentials: &Value) -> ConnectionStatus {
        status_of(&self.hosts, credentials).await
    }

    async fn invoke_tool(&self, call: ToolCall<'_>) -> Result<Value, ProviderError> {
        let host = self.bound_host(call.binding).await?;
        match call.tool_id {
            TOOL_HOST_STATUS => self.host_status(&host).await,
            TOOL_RUN_START => self.run_start(&call, &host).await,
            TOOL_RUN_WAIT => self.run_wait(&call, &host).await,
            TOOL_RUN_EVENTS => self.run_events(&call, &host).await,
            TOOL_RUN_CANCEL => {
                let run = self
                    .run_of(&host, &call.binding.channel_id, call.arguments)
                    .await?;
                let run = self.hosts.cancel_run(&run).await.map_err(map_err)?;
                let mut v = self.run_view(&run, false).await?;
                v["cancel_requested"] =
                    json!(run.cancel_requested_at.is_some() || run.state.is_terminal());
                Ok(v)
            }
            TOOL_RUN_HANDOFF => self.run_handoff(&call, &host).await,
            TOOL_ARTIFACT_FETCH => self.artifact_fetch(&call, &host).await,
            _ => Err(ProviderError::new(
                ProviderErrorKind::InvalidInput,
                ErrorCode::UnknownTool,
                "unknown tool",
            )),
        }
    }

    async fn deliver(&self, msg: OutboundMessage<'_>) -> Result<(), ProviderError> {
        let _ = msg;
        Err(ProviderError::rejected(
            "an agent host channel carries no chat messages",
        ))
    }

    fn ingress(&self) -> Option<axum::Router> {
        self.gateway.clone()
    }
}

/// The Descriptor status of the host a binding's credentials name.
async fn status_of(hosts: &Hosts, credentials: &Value) -> ConnectionStatus {
    let id = credentials
        .get("host_id")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match hosts.host(id).await {
        Ok(Some(h)) => connection_status(h.status),
        _ => ConnectionStatus::Error,
    }
}
