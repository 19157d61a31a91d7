//! Control plane: Card, Skill, /health and API-key checks (C-01..C-08, C-17, K-01..K-15, S-01, S-04).

use serde_json::Value;
use switchyard_e2e::*;
use switchyard_protocol::Card;
use switchyard_protocol::card::{skill_name, tool_id_valid};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn card_is_public_schema_valid_and_follows_the_rules() {
    let pod = Pod::start(PodOptions::default()).await;
    // C-01: no Authorization header at all.
    let resp = reqwest::get(format!("{}/connector-card.json", pod.base_url()))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json")
    );
    let raw: Value = resp.json().await.unwrap();
    assert!(raw.is_object());

    let sim = pod.sim_with_key(None);
    let card = sim.card().await.unwrap();
    assert_eq!(card, raw);
    if let Err(e) = schemas::validate_card(&card) {
        panic!("card schema violations: {e:?}");
    }
    let typed: Card = serde_json::from_value(card.clone()).unwrap();
    assert_eq!(
        typed.violations(),
        Vec::<String>::new(),
        "prose rules of the Card"
    );

    // K-01, K-02
    assert_eq!(card["schema"], "xagent.connector/v1");
    assert_eq!(card["protocol_version"], "3.0");
    assert!(!card["build"]["build_time"].as_str().unwrap().is_empty());
    assert_eq!(card["connector_card_id"], CARD_ID);
    assert!(!card["connector"]["name"].as_str().unwrap().is_empty());
    assert!(!card["connector"]["version"].as_str().unwrap().is_empty());
    // K-03, K-04, IM1-01, IM2-01
    assert_eq!(card["supports"]["target_types"], serde_json::json!(["im"]));
    let profiles = card["supports"]["profiles"].as_array().unwrap();
    assert!(profiles.iter().any(|p| p == IM_V2) && profiles.iter().any(|p| p == IM_V1));
    // K-06
    assert!(matches!(
        card["supports"]["user_channel_mode"].as_str(),
        Some("single" | "multiple")
    ));

    // K-05, K-07, K-08, K-09, K-15: tools
    let skill = skill_name(CARD_ID);
    assert_eq!(skill, "connector-im-webhook");
    let tools = card["tools"].as_array().unwrap();
    assert!(!tools.is_empty());
    let mut ids = std::collections::HashSet::new();
    for t in tools {
        let id = t["tool_id"].as_str().unwrap();
        assert!(tool_id_valid(id), "K-07 {id}");
        assert!(ids.insert(id), "K-07 unique {id}");
        assert_eq!(t["profile"], IM_V2, "K-05 IM tools use im.v2");
        let s = &t["input_schema"];
        assert_eq!(s["type"], "object", "K-08");
        assert_eq!(
            s["properties"]["connector_channel_id"]["type"], "string",
            "K-08"
        );
        assert!(
            s["required"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r == "connector_channel_id"),
            "K-08"
        );
        assert!(s["properties"].get("connector_card_id").is_none(), "K-09");
        assert_eq!(
            t["related_skill_ids"],
            serde_json::json!([skill.clone()]),
            "K-15"
        );
    }
    assert!(ids.contains(TOOL_SEND) && ids.contains(TOOL_FILE_SEND));

    // K-12, K-13: auth flows
    for f in card["auth_flows"].as_array().unwrap() {
        assert!(f["id"].is_string() && f["title"].is_string() && f["target_type"] == "im");
        assert!(matches!(f["type"].as_str(), Some("form" | "qr_login")));
        if f["type"] == "form" {
            let fields = f["fields"].as_array().unwrap();
            assert!(!fields.is_empty(), "K-12 a form has fields");
            for field in fields {
                if field["input_type"] == "password" {
                    assert_eq!(field["secret"], true, "K-13");
                    assert!(field.get("default_value").is_none(), "K-13");
                }
            }
        }
    }
    // K-14
    assert_eq!(card["security"]["api_key_required"], true);

    // K-10 / S-04: no deployment URL, no key in the public Card.
    let text = card.to_string();
    assert!(!text.contains("127.0.0.1") && !text.contains(pod.api_key()) && !text.contains("sy_"));

    // C-02, C-08, K-15: the Skill is public, Markdown, named like the Card's skill ids.
    let resp = reqwest::get(format!("{}/skill.md", pod.base_url()))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/markdown")
    );
    let md = resp.text().await.unwrap();
    let header = md
        .strip_prefix("---\n")
        .and_then(|r| r.split_once("\n---\n"))
        .map(|(h, _)| h)
        .expect("front matter");
    assert!(
        header.lines().any(|l| l == format!("name: {skill}")),
        "K-15 skill name"
    );
    assert!(
        !md.contains(pod.api_key()) && !md.contains("sy_") && !md.contains("127.0.0.1"),
        "C-08"
    );
    for id in &ids {
        assert!(md.contains(id), "IM1-08 the Skill names current tool {id}");
    }
    assert_schema_clean(&sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_equals_the_card() {
    let pod = Pod::start(PodOptions::default()).await;
    let sim = pod.sim();
    let card = sim.card().await.unwrap();
    let (status, body) = sim.health().await.unwrap();
    assert_eq!(status, 200);
    let h = body.expect("json health");
    assert_eq!(h["status"], "ok");
    assert_eq!(h["connector_card_id"], card["connector_card_id"], "C-04");
    assert_eq!(h["protocol_version"], card["protocol_version"], "C-05");
    assert_eq!(h["protocol_version"], "3.0", "C-05");
    assert_eq!(
        h["connector_card_version"], card["connector"]["version"],
        "C-06"
    );
    assert_eq!(h["build"], card["build"], "C-07");
    for k in ["version", "git_tag", "git_rev", "build_time"] {
        assert!(h["build"][k].is_string(), "C-07 build.{k}");
    }
    assert_eq!(h["build"]["version"], env!("CARGO_PKG_VERSION"));
    assert_schema_clean(&sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_live_under_the_prefix() {
    // C-17: xAgent appends fixed paths to a Base URL that has a path prefix.
    let pod = Pod::start(PodOptions::default()).await;
    let root = reqwest::get(format!("{}/connector-card.json", pod.root_url()))
        .await
        .unwrap();
    assert_eq!(
        root.status(),
        404,
        "nothing is served outside a connector prefix"
    );
    let ok = reqwest::get(format!("{}/connector-card.json", pod.base_url()))
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let trailing = Sim::new(&format!("{}/", pod.base_url()), Some(pod.api_key())).unwrap();
    assert_eq!(
        trailing.health().await.unwrap().0,
        200,
        "a trailing slash on the Base URL is harmless"
    );
}

/// C-03 for one key: /health, /ws and /files/uploads all refuse it with 401 or 403.
async fn assert_refused(pod: &Pod, key: Option<&str>) {
    let sim = pod.sim_with_key(key);
    let (status, _) = sim.health().await.unwrap();
    assert!(
        matches!(status, 401 | 403),
        "/health with {key:?}: {status}"
    );
    match sim.connect().await {
        Err(e) => assert!(
            matches!(e.status(), Some(401 | 403)),
            "/ws with {key:?}: {e}"
        ),
        Ok(_) => panic!("/ws accepted {key:?}"),
    }
    let (status, _) = sim
        .upload("cch_any", "a.txt", "text/plain", &b"x"[..])
        .await
        .unwrap();
    assert!(
        matches!(status, 401 | 403),
        "/files/uploads with {key:?}: {status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_is_required_and_checked() {
    let pod = Pod::start(PodOptions::default()).await;
    assert_refused(&pod, None).await;
    assert_refused(&pod, Some("wrong")).await;
    assert_refused(&pod, Some("sy_0123abcd_notthesecret")).await;
    // A well-formed key of this tenant with one character changed.
    let mut forged = pod.api_key().to_owned();
    let last = forged.pop().unwrap();
    forged.push(if last == '0' { '1' } else { '0' });
    assert_refused(&pod, Some(&forged)).await;

    // A second key works until it is revoked (while the pod serves).
    let (key_id, key) = pod.create_key(&pod.tenant.id).await;
    assert_eq!(pod.sim_with_key(Some(&key)).health().await.unwrap().0, 200);
    pod.revoke_key(&key_id).await;
    assert_refused(&pod, Some(&key)).await;
    // The first key is unaffected.
    assert_eq!(pod.sim().health().await.unwrap().0, 200);
    assert_not_logged(pod.api_key());
    assert_not_logged(&key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_tenant_is_a_separate_identity() {
    let pod = Pod::start(PodOptions::default()).await;
    let b = pod.create_tenant("tenant-b").await;
    let sim_a = pod.sim();
    let sim_b = pod.sim_with_key(Some(&b.api_key));
    assert_eq!(
        sim_b.health().await.unwrap().0,
        200,
        "a second tenant's key works on the same prefix"
    );

    let (conn_a, id_a) = hello(&sim_a, None, &[IM_V2]).await;
    let (conn_b, id_b) = hello(&sim_b, None, &[IM_V2]).await;
    assert_ne!(id_a, id_b, "each tenant has its own connector_id");
    // Presenting A's connector_id with B's key does not make B the owner of A's runtime.
    let (_conn_b2, id_b2) = hello(&sim_b, Some(&id_a), &[IM_V2]).await;
    assert_eq!(
        id_b2, id_b,
        "the key identifies the tenant, not the presented connector_id"
    );

    let (ch_a, _) = open(&conn_a, None).await;
    let err = conn_b.open_channel(Some(&ch_a)).await.unwrap();
    assert_eq!(err.kind, "error");
    assert_eq!(
        err.error_code(),
        Some("connector_channel_not_owned"),
        "S-03 channel ids are not credentials"
    );
    let err = conn_b.descriptor_get(&ch_a).await.unwrap();
    assert_eq!(err.error_code(), Some("connector_channel_not_owned"));
    // A's channel is still fine for A.
    let d = conn_a
        .descriptor_get(&ch_a)
        .await
        .unwrap()
        .expect_kind("connection.descriptor.get.ack")
        .unwrap();
    assert_eq!(
        d.str_at("/connection_descriptor/connection/connector_id"),
        Some(id_a.as_str())
    );
    assert_schema_clean(&sim_a);
    assert_schema_clean(&sim_b);
}

/// Alerts use `rate()` on these series, so they exist (at zero) with their `# HELP` from the
/// first scrape, before any event; the build is identified by `switchyard_build_info`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_described_and_registered_at_start() {
    let pod = Pod::start(PodOptions::default()).await;
    let body = reqwest::get(format!("{}/metrics", pod.metrics_url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for needle in [
        "# HELP switchyard_ingress_refused_total",
        "switchyard_ingress_refused_total{reason=\"pod_backlog\"}",
        "switchyard_ingress_refused_total{reason=\"channel_full\"}",
        "# HELP switchyard_limits_hit_total",
        "switchyard_limits_hit_total{limit=\"socket_send_queue\"}",
        "switchyard_limits_hit_total{limit=\"commit_backlog\"}",
        "# HELP switchyard_commit_queue_depth",
        "# HELP switchyard_doorbell_failures_total",
        "switchyard_build_info{",
    ] {
        assert!(body.contains(needle), "missing {needle:?} in:\n{body}");
    }
}
