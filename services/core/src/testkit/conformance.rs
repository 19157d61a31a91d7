//! Conformance suite for [`Provider`]: what every provider must do, whatever its target.
//!
//! Each `pub async fn` here is one case; a provider crate runs every case as a test of its
//! own with [`provider_conformance_tests!`](crate::provider_conformance_tests), each on a
//! fresh [`ProviderHarness`] (a provider on one pod of a fresh cluster, with its fake
//! target). A case that needs what a provider does not have (a hook answering `None`) says
//! so on stdout and passes without checking anything else.

use async_trait::async_trait;
use serde_json::{Map, Value, json};
use switchyard_protocol::card::{AuthFlow, AuthFlowType, skill_name};
use switchyard_protocol::error::ErrorCode;

use super::pod::public_step;
use super::{ProviderPod, WAIT, captured_logs, eventually, init_logs};
use crate::provider::{AuthStep, Provider, ProviderError, ProviderErrorKind};

/// A provider under test, built fresh for each case by the provider's crate.
#[async_trait]
pub trait ProviderHarness: Sized + Send + Sync + 'static {
    type Provider: Provider;

    /// A fresh provider on one pod of a fresh cluster, its background loops running, and the
    /// fake target it talks to.
    async fn start() -> Self;

    fn pod(&self) -> &ProviderPod<Self::Provider>;

    /// What the protocol's JSON Schema `xagent.connector/v1` finds wrong with `card` (the
    /// provider crate passes it to the schema validator its tests use, so core does not
    /// depend on the simulator).
    fn card_schema_errors(card: &Value) -> Vec<String>;

    /// Binds `channel_id` against the fake target as a user would, through the pod's auth
    /// calls (so what the provider answered is kept); returns the secret strings of the
    /// credentials (tokens, signing secrets), which nothing may show.
    async fn bind(&self, channel_id: &str) -> Vec<String>;

    /// The arguments of a call of a tool the provider promises not to repeat at the target
    /// for the same idempotency key, on the bound `channel_id`; None when it has none.
    fn idempotent_call(&self, channel_id: &str) -> Option<(String, Value)> {
        let _ = channel_id;
        None
    }

    /// How many sends the fake target has taken (the idempotency case counts them).
    async fn target_sends(&self) -> usize {
        0
    }

    /// Makes the target deliver its inbound event `n` of the bound `channel_id` to the
    /// provider (a webhook post, an update to poll); the same `n` is the same event, as the
    /// target repeats it. It returns once the provider answered the delivery, or once it is
    /// queued where an ordered poller takes events one after the other (the case waits for
    /// a later event). None when the provider receives nothing.
    async fn deliver_inbound(&self, channel_id: &str, n: u32) -> Option<()> {
        let _ = (channel_id, n);
        None
    }
}

fn skip(case: &str, reason: &str) {
    println!("provider conformance: {case} skipped: {reason}");
}

/// The Card passes the protocol's prose rules (`Card::violations`) and its JSON Schema.
pub async fn card_is_valid<H: ProviderHarness>() {
    let h = H::start().await;
    let card = h.pod().provider.card();
    assert_eq!(card.violations(), Vec::<String>::new(), "Card rules");
    let as_json = serde_json::to_value(card).expect("the Card serializes");
    let errors = H::card_schema_errors(&as_json);
    assert!(
        errors.is_empty(),
        "the Card fails xagent.connector/v1: {errors:#?}"
    );
}

/// The Skill opens with a front matter naming it after the Card and describing it, and
/// names every tool of the Card.
pub async fn skill_follows_the_rules<H: ProviderHarness>() {
    let h = H::start().await;
    let provider = &h.pod().provider;
    let Some(skill) = provider.skill() else {
        skip("skill_follows_the_rules", "the provider has no Skill");
        return;
    };
    let card = provider.card();
    let header = skill
        .strip_prefix("---\n")
        .and_then(|r| r.split_once("\n---\n"))
        .map(|(h, _)| h)
        .expect("the Skill opens with a `---` front matter");
    let name = format!("name: {}", skill_name(&card.connector_card_id));
    assert!(header.lines().any(|l| l == name), "{name:?} in {header:?}");
    assert!(
        header.lines().any(|l| l
            .strip_prefix("description:")
            .is_some_and(|d| !d.trim().is_empty())),
        "a non-empty description in {header:?}"
    );
    for t in &card.tools {
        assert!(skill.contains(&t.tool_id), "the Skill names {}", t.tool_id);
    }
}

/// The mount prefix is one lowercase path segment (`/telegram`), which the edge can nest.
pub async fn prefix_is_one_segment<H: ProviderHarness>() {
    let h = H::start().await;
    let prefix = h.pod().provider.prefix();
    let segment = prefix.strip_prefix('/').unwrap_or("");
    assert!(
        segment.starts_with(|c: char| c.is_ascii_lowercase())
            && segment
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
        "prefix {prefix:?} is not one lowercase segment"
    );
    let _ = axum::Router::<()>::new().nest(prefix, axum::Router::new());
}

/// The wire code of a refused auth start; panics when it was not a refusal or panicked.
async fn refused_code<H: ProviderHarness>(
    h: &H,
    flow: &AuthFlow,
    input: Map<String, Value>,
) -> String {
    let pod = h.pod();
    // In a task of its own, so that a panic is reported as this case's failure.
    let provider = pod.provider.clone();
    let (f, i) = (flow.clone(), input.clone());
    let answer = tokio::spawn(async move {
        provider
            .auth_start(crate::provider::AuthRequest {
                tenant_id: super::TENANT,
                channel_id: "cch_conformance_auth",
                auth_session_id: "auth_conformance",
                flow: &f,
                input: &i,
            })
            .await
    })
    .await;
    let answer = match answer {
        Ok(a) => a,
        Err(e) => panic!("auth_start of {} panicked on {input:?}: {e}", flow.id),
    };
    // Kept for the secrets case, as a client would see it.
    pod.shown.lock().unwrap().push(match &answer {
        Ok(step) => public_step(step),
        Err(e) => e.to_string(),
    });
    let code = match answer {
        Ok(AuthStep::Failed { code, .. }) => code,
        Err(ProviderError { kind, code, .. }) => {
            assert_eq!(kind, ProviderErrorKind::InvalidInput, "{code}");
            code.to_string()
        }
        Ok(step) => panic!("auth_start of {} accepted {input:?}: {step:?}", flow.id),
    };
    assert!(
        code.starts_with(|c: char| c.is_ascii_lowercase())
            && code
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
        "{code:?} is not a wire code"
    );
    code
}

/// A flow the Card does not declare is refused as `unknown_auth_flow`; a form flow refuses
/// missing, mistyped and oversized fields with a failure, the same code each time, never a
/// panic.
pub async fn auth_start_refuses_bad_input<H: ProviderHarness>() {
    let h = H::start().await;
    let card = h.pod().provider.card().clone();
    let undeclared = AuthFlow {
        id: "conformance_undeclared_flow".into(),
        target_type: card.supports.target_types[0].clone(),
        flow_type: AuthFlowType::Form,
        title: "Undeclared".into(),
        description: None,
        fields: card
            .auth_flows
            .iter()
            .flat_map(|f| f.fields.clone())
            .collect(),
    };
    assert_eq!(
        refused_code(&h, &undeclared, Map::new()).await,
        ErrorCode::UnknownAuthFlow.as_str()
    );
    let forms: Vec<&AuthFlow> = card
        .auth_flows
        .iter()
        .filter(|f| f.flow_type == AuthFlowType::Form && f.fields.iter().any(|x| x.required))
        .collect();
    if forms.is_empty() {
        skip(
            "auth_start_refuses_bad_input (form input)",
            "the Card has no form flow with required fields",
        );
        return;
    }
    for flow in forms {
        let with = |v: Value| -> Map<String, Value> {
            flow.fields
                .iter()
                .map(|f| (f.name.clone(), v.clone()))
                .collect()
        };
        for input in [
            Map::new(),
            with(json!(12345)),
            with(json!(["a"])),
            with(json!("x".repeat(64 * 1024))),
        ] {
            let first = refused_code(&h, flow, input.clone()).await;
            let again = refused_code(&h, flow, input).await;
            assert_eq!(first, again, "the same input, another code");
        }
    }
}

/// A tool the Card does not declare is refused as `unknown_tool`, as invalid input.
pub async fn unknown_tool_is_refused<H: ProviderHarness>() {
    let h = H::start().await;
    let ch = "cch_conformance_tool";
    h.bind(ch).await;
    let err = h
        .pod()
        .tool(
            ch,
            "conformance_undeclared_tool",
            json!({"connector_channel_id": ch}),
            "idem_unknown",
        )
        .await
        .expect_err("an undeclared tool is refused");
    assert_eq!(
        (err.kind, err.code.as_str()),
        (
            ProviderErrorKind::InvalidInput,
            ErrorCode::UnknownTool.as_str()
        ),
        "{err}"
    );
}

/// The same call with the same idempotency key reaches the target once and answers the same.
pub async fn tool_calls_are_idempotent<H: ProviderHarness>() {
    let h = H::start().await;
    let ch = "cch_conformance_idem";
    h.bind(ch).await;
    let Some((tool, args)) = h.idempotent_call(ch) else {
        skip(
            "tool_calls_are_idempotent",
            "the provider declares no idempotent tool",
        );
        return;
    };
    let before = h.target_sends().await;
    let first = h
        .pod()
        .tool(ch, &tool, args.clone(), "idem_conformance")
        .await;
    let again = h.pod().tool(ch, &tool, args, "idem_conformance").await;
    let first = first.unwrap_or_else(|e| panic!("{tool}: {e}"));
    assert_eq!(
        again.ok(),
        Some(first),
        "{tool}: the repeat answers the same"
    );
    assert_eq!(
        h.target_sends().await - before,
        1,
        "{tool}: the repeat reached the target"
    );
}

/// An inbound event the target delivers twice is stored once: the provider derives the
/// same message id from it (or drops the repeat itself).
pub async fn ingress_dedupes<H: ProviderHarness>() {
    let h = H::start().await;
    let ch = "cch_conformance_in";
    h.bind(ch).await;
    let cluster = h.pod().cluster().clone();
    let stored = || -> Vec<String> {
        cluster
            .inbound()
            .into_iter()
            .filter(|(c, _)| c == ch)
            .map(|(_, m)| m.message_id)
            .collect()
    };
    // Binding may have taken a message already (a first contact).
    let before = stored().len();
    if h.deliver_inbound(ch, 1).await.is_none() {
        skip(
            "ingress_dedupes",
            "the provider receives no inbound messages",
        );
        return;
    }
    h.deliver_inbound(ch, 1).await;
    // A later event: once it is stored, both copies of the first were handled.
    h.deliver_inbound(ch, 2).await;
    let ids = eventually(WAIT, "the second event stored", || async {
        let ids = stored();
        (ids.len() >= before + 2).then_some(ids)
    })
    .await;
    let new = &ids[before..];
    assert_eq!(new.len(), 2, "one message per event: {new:?}");
    assert_ne!(new[0], new[1], "two events, two message ids");
}

/// The secrets of a binding appear in nothing the provider shows or logs: the Card, the
/// Skill, auth answers, tool results and errors, delivery errors, the log.
pub async fn secrets_never_shown<H: ProviderHarness>() {
    init_logs();
    let h = H::start().await;
    let ch = "cch_conformance_secrets";
    let secrets = h.bind(ch).await;
    assert!(
        !secrets.is_empty(),
        "the harness names the binding's secrets"
    );
    let pod = h.pod();
    let card = pod.provider.card().clone();
    let _ = pod
        .tool(
            ch,
            "conformance_undeclared_tool",
            json!({"connector_channel_id": ch}),
            "idem_secrets_unknown",
        )
        .await;
    if let Some((tool, args)) = h.idempotent_call(ch) {
        let _ = pod.tool(ch, &tool, args, "idem_secrets").await;
    }
    // Every declared tool with arguments it cannot take.
    for t in &card.tools {
        let _ = pod
            .tool(
                ch,
                &t.tool_id,
                json!({"connector_channel_id": ch, "text": 7}),
                "idem_secrets_bad",
            )
            .await;
    }
    let _ = pod
        .deliver(ch, "msg_conformance_secrets", Some("hello"), &[])
        .await;
    // Form flows given the secrets beside fields they cannot take.
    for flow in card
        .auth_flows
        .iter()
        .filter(|f| f.flow_type == AuthFlowType::Form)
    {
        let input: Map<String, Value> = flow
            .fields
            .iter()
            .map(|f| {
                let v = if f.secret {
                    json!(secrets[0])
                } else {
                    json!("?")
                };
                (f.name.clone(), v)
            })
            .collect();
        let _ = pod
            .try_auth(flow, "cch_conformance_secrets_2", "auth_secrets", &input)
            .await;
    }
    let mut shown = vec![
        serde_json::to_string(&card).expect("the Card serializes"),
        pod.provider.skill().unwrap_or_default().to_owned(),
    ];
    shown.extend(pod.shown.lock().unwrap().iter().cloned());
    shown.extend(
        pod.cluster()
            .steps
            .lock()
            .unwrap()
            .iter()
            .map(|(_, s)| public_step(s)),
    );
    shown.extend(
        pod.cluster()
            .sessions()
            .iter()
            .map(|s| format!("{:?} {:?} {}", s.qr_code_text, s.qr_code_image, s.message)),
    );
    for secret in &secrets {
        for text in &shown {
            assert!(!text.contains(secret.as_str()), "a secret in {text:?}");
        }
        assert!(
            !captured_logs().contains(secret.as_str()),
            "a secret in the log"
        );
    }
}

/// Expands to one `#[tokio::test]` per case of the provider suite, in a module
/// `provider_conformance`, each on a fresh `$harness` (a type implementing
/// [`ProviderHarness`](crate::testkit::conformance::ProviderHarness)).
///
/// ```ignore
/// struct Telegram { pod: Pod, fake: FakeTelegram }
/// #[async_trait::async_trait]
/// impl ProviderHarness for Telegram { ... }
/// switchyard_core::provider_conformance_tests!(Telegram);
/// ```
#[macro_export]
macro_rules! provider_conformance_tests {
    ($harness:ty) => {
        mod provider_conformance {
            use super::*;
            $crate::__provider_conformance_cases! { $harness: card_is_valid,
                skill_follows_the_rules, prefix_is_one_segment, auth_start_refuses_bad_input,
                unknown_tool_is_refused, tool_calls_are_idempotent, ingress_dedupes,
                secrets_never_shown,
            }
        }
    };
}

/// The test functions behind [`provider_conformance_tests!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __provider_conformance_cases {
    ($harness:ty: $($case:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::testkit::conformance::$case::<$harness>().await
            }
        )*
    };
}
