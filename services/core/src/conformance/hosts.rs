//! Conformance suite for [`HostStore`]: what every durable store (SQLite, Postgres) must do
//! with remote agent hosts, their runs, event logs, artifacts and approvals.
//!
//! Each `pub async fn` here is one case, run like the [`Store`] suite's (see
//! [`store_conformance_tests!`](crate::store_conformance_tests)) on a fresh, migrated store.
//! Every case uses its own random ids and tenant, and sweeps (`mark_hosts_lost`, `stale_runs`,
//! `expire_approvals`, `purge_runs`) put the rows meant to be swept far in the past
//! ([`AGES_AGO`]), sweep with cutoffs there and assert on their own rows only.

use std::sync::Arc;

use serde_json::json;
use switchyard_protocol::hosts::RunState;

use crate::error::ErrorKind;
use crate::hoststore::*;
use crate::ids::{new_id, now_ms};
use crate::model::Tenant;
use crate::store::Store;

/// A time long before anything a live system writes: sweep tests live here.
const AGES_AGO: i64 = 1_000_000;
const HOUR: i64 = 3_600_000;

// -- fixtures ------------------------------------------------------------------------------------

async fn tenant(s: &dyn Store) -> Tenant {
    let t = Tenant {
        id: new_id("ten"),
        name: new_id("name"),
        created_at: now_ms(),
    };
    s.create_tenant(&t).await.expect("create tenant");
    t
}

fn host_rec(tenant_id: &str, name: &str, created_at: i64) -> HostRecord {
    HostRecord {
        id: new_id("host"),
        tenant_id: tenant_id.to_owned(),
        name: name.to_owned(),
        status: HostStatus::Enrolling,
        cert_fingerprint: None,
        cert_pem: None,
        pairing_code: new_id("pair"),
        hostname: None,
        agent_version: None,
        adapters: Vec::new(),
        pod_id: None,
        session_id: None,
        connected_at: None,
        last_seen_at: None,
        metrics: json!({}),
        config: json!({"max_concurrent_runs": 2}),
        created_at,
        revoked_at: None,
    }
}

fn enrollment_rec(h: &HostRecord, expires_at: i64) -> EnrollmentRecord {
    EnrollmentRecord {
        token_hash: new_id("tokhash"),
        host_id: h.id.clone(),
        tenant_id: h.tenant_id.clone(),
        created_at: h.created_at,
        expires_at,
        used_at: None,
    }
}

/// An enrolling host of `tenant_id` created at `created_at`, with an unused token.
async fn enrolled_at(s: &dyn Store, tenant_id: &str, created_at: i64) -> HostRecord {
    let h = host_rec(tenant_id, &new_id("name"), created_at);
    s.insert_enrollment(&h, &enrollment_rec(&h, created_at + HOUR))
        .await
        .expect("insert enrollment");
    h
}

/// A host of a fresh tenant with a certificate (status `offline`).
async fn certified(s: &dyn Store) -> HostRecord {
    let t = tenant(s).await;
    certified_of(s, &t.id).await
}

async fn certified_of(s: &dyn Store, tenant_id: &str) -> HostRecord {
    let h = enrolled_at(s, tenant_id, now_ms()).await;
    s.set_host_certificate(&h.id, &new_id("fp"), "-----BEGIN CERTIFICATE-----")
        .await
        .expect("set certificate");
    get_host(s, &h.id).await
}

async fn get_host(s: &dyn Store, id: &str) -> HostRecord {
    s.get_host(id)
        .await
        .expect("get host")
        .expect("host exists")
}

async fn connect(s: &dyn Store, h: &HostRecord, session: &str, now: i64) -> bool {
    s.host_connected(
        &h.id,
        "pod-a",
        session,
        "build-01",
        "1.2.3",
        &["claude_code".to_owned(), "codex".to_owned()],
        now,
    )
    .await
    .expect("host connected")
}

fn run_rec(h: &HostRecord, state: RunState, at: i64) -> RunRecord {
    RunRecord {
        id: new_id("run"),
        tenant_id: h.tenant_id.clone(),
        host_id: h.id.clone(),
        agent_id: "coder".to_owned(),
        channel_id: None,
        state,
        goal: "fix the build".to_owned(),
        context_bundle: json!({"repo": "switchyard", "files": ["a.rs"]}),
        constraints: json!({"max_turns": 20}),
        parent_run_id: None,
        attempts: 0,
        dispatched_at: None,
        not_before: None,
        cancel_requested_at: None,
        cancel_sent_at: None,
        error_code: None,
        error_message: None,
        summary: None,
        last_host_seq: 0,
        event_count: 0,
        created_at: at,
        updated_at: at,
        finished_at: None,
    }
}

async fn insert_run(s: &dyn Store, r: RunRecord) -> RunRecord {
    s.insert_run(&r).await.expect("insert run");
    r
}

fn event_rec(
    run_id: &str,
    host_seq: Option<i64>,
    kind: &str,
    payload: serde_json::Value,
) -> RunEventRecord {
    RunEventRecord {
        run_id: run_id.to_owned(),
        seq: 0,
        host_seq,
        kind: kind.to_owned(),
        timestamp: "2026-01-01T00:00:00Z".to_owned(),
        payload,
        received_at: now_ms(),
    }
}

fn artifact_rec(r: &RunRecord, created_at: i64) -> ArtifactRecord {
    let id = new_id("art");
    ArtifactRecord {
        object_key: format!("artifacts/{id}"),
        id,
        run_id: r.id.clone(),
        tenant_id: r.tenant_id.clone(),
        host_id: r.host_id.clone(),
        name: "patch.diff".to_owned(),
        content_type: "text/x-diff".to_owned(),
        size_bytes: 100,
        uploaded_at: None,
        created_at,
    }
}

fn approval_rec(r: &RunRecord, created_at: i64, expires_at: i64) -> ApprovalRecord {
    ApprovalRecord {
        id: new_id("appr"),
        tenant_id: r.tenant_id.clone(),
        host_id: r.host_id.clone(),
        run_id: r.id.clone(),
        action: "git push --force".to_owned(),
        risk_level: "high".to_owned(),
        status: ApprovalStatus::Pending,
        decided_by: None,
        reason: None,
        created_at,
        expires_at,
        decided_at: None,
        delivered_at: None,
    }
}

/// A run of a fresh certified host, plus that host.
async fn a_run(s: &dyn Store) -> (HostRecord, RunRecord) {
    let h = certified(s).await;
    let r = insert_run(s, run_rec(&h, RunState::Running, now_ms())).await;
    (h, r)
}

fn ids<T>(items: &[T], id: impl Fn(&T) -> &str) -> Vec<String> {
    items.iter().map(|i| id(i).to_owned()).collect()
}

// -- enrollment and hosts ------------------------------------------------------------------------

pub async fn enrollment(s: &dyn Store) {
    let t = tenant(s).await;
    let now = now_ms();
    let h = host_rec(&t.id, "build-box", now);
    let e = enrollment_rec(&h, now + HOUR);
    s.insert_enrollment(&h, &e)
        .await
        .expect("insert enrollment");

    assert_eq!(s.get_host(&h.id).await.expect("get"), Some(h.clone()));
    assert_eq!(
        s.find_host(&t.id, "build-box").await.expect("find"),
        Some(h.clone())
    );
    assert_eq!(s.find_host(&t.id, "other").await.expect("find other"), None);
    assert_eq!(
        s.get_host(&new_id("host")).await.expect("get unknown"),
        None
    );

    let used = s
        .consume_enrollment(&e.token_hash, now + 1)
        .await
        .expect("consume")
        .expect("an unused, unexpired token is consumed");
    assert_eq!(
        used,
        EnrollmentRecord {
            used_at: Some(now + 1),
            ..e.clone()
        }
    );
    assert_eq!(
        s.consume_enrollment(&e.token_hash, now + 2)
            .await
            .expect("consume again"),
        None,
        "a token is consumed once"
    );
    assert_eq!(
        s.consume_enrollment(&new_id("tokhash"), now)
            .await
            .expect("consume unknown"),
        None
    );

    let second = enrolled_at(s, &t.id, now + 10).await;
    assert_eq!(
        ids(&s.list_hosts(&t.id).await.expect("list"), |h| &h.id),
        vec![h.id.clone(), second.id.clone()],
        "oldest first"
    );
    assert!(
        s.list_hosts(&new_id("ten"))
            .await
            .expect("list other tenant")
            .is_empty()
    );
}

pub async fn expired_enrollment_is_refused(s: &dyn Store) {
    let t = tenant(s).await;
    let now = now_ms();
    let h = host_rec(&t.id, &new_id("name"), now - HOUR);
    let e = enrollment_rec(&h, now);
    s.insert_enrollment(&h, &e)
        .await
        .expect("insert enrollment");
    assert_eq!(
        s.consume_enrollment(&e.token_hash, now)
            .await
            .expect("consume at expiry"),
        None,
        "a token is valid only before expires_at"
    );
    assert_eq!(
        s.consume_enrollment(&e.token_hash, now + HOUR)
            .await
            .expect("consume after expiry"),
        None
    );
    assert_eq!(
        s.consume_enrollment(&e.token_hash, now - 1)
            .await
            .expect("consume before expiry")
            .map(|e| e.used_at),
        Some(Some(now - 1)),
        "refusals left the token unused"
    );
}

pub async fn host_names_are_unique_per_tenant(s: &dyn Store) {
    let t = tenant(s).await;
    let other = tenant(s).await;
    let now = now_ms();
    let h = host_rec(&t.id, "ci", now);
    s.insert_enrollment(&h, &enrollment_rec(&h, now + HOUR))
        .await
        .expect("first");

    let dup = host_rec(&t.id, "ci", now);
    let dup_token = enrollment_rec(&dup, now + HOUR);
    let err = s
        .insert_enrollment(&dup, &dup_token)
        .await
        .expect_err("same name in the same tenant");
    assert_eq!(err.kind, ErrorKind::Conflict, "{err}");
    assert_eq!(s.get_host(&dup.id).await.expect("get"), None);
    assert_eq!(
        s.consume_enrollment(&dup_token.token_hash, now)
            .await
            .expect("consume"),
        None,
        "host and token are inserted together or not at all"
    );

    let elsewhere = host_rec(&other.id, "ci", now);
    s.insert_enrollment(&elsewhere, &enrollment_rec(&elsewhere, now + HOUR))
        .await
        .expect("the same name in another tenant");

    let orphan = host_rec(&new_id("ten"), "ci", now);
    let err = s
        .insert_enrollment(&orphan, &enrollment_rec(&orphan, now + HOUR))
        .await
        .expect_err("unknown tenant");
    assert_eq!(err.kind, ErrorKind::NotFound, "{err}");
}

pub async fn certificates(s: &dyn Store) {
    let t = tenant(s).await;
    let h = enrolled_at(s, &t.id, now_ms()).await;
    let fp = new_id("fp");
    s.set_host_certificate(&h.id, &fp, "PEM-1")
        .await
        .expect("set certificate");
    let got = get_host(s, &h.id).await;
    assert_eq!(got.status, HostStatus::Offline, "enrolling -> offline");
    assert_eq!(got.cert_fingerprint.as_deref(), Some(fp.as_str()));
    assert_eq!(got.cert_pem.as_deref(), Some("PEM-1"));
    assert_eq!(
        s.host_by_fingerprint(&fp).await.expect("by fingerprint"),
        Some(got)
    );
    assert_eq!(
        s.host_by_fingerprint(&new_id("fp"))
            .await
            .expect("unknown fingerprint"),
        None
    );

    let other = enrolled_at(s, &t.id, now_ms()).await;
    let err = s
        .set_host_certificate(&other.id, &fp, "PEM-2")
        .await
        .expect_err("fingerprints are unique");
    assert_eq!(err.kind, ErrorKind::Conflict, "{err}");
    assert_eq!(get_host(s, &other.id).await, other, "unchanged");

    let err = s
        .set_host_certificate(&new_id("host"), &new_id("fp"), "PEM")
        .await
        .expect_err("unknown host");
    assert_eq!(err.kind, ErrorKind::NotFound, "{err}");

    // A renewal of an online host keeps it online.
    assert!(connect(s, &h, "sess-1", now_ms()).await);
    let renewed = new_id("fp");
    s.set_host_certificate(&h.id, &renewed, "PEM-3")
        .await
        .expect("renew");
    let got = get_host(s, &h.id).await;
    assert_eq!(got.status, HostStatus::Online);
    assert_eq!(got.cert_fingerprint.as_deref(), Some(renewed.as_str()));
    assert_eq!(s.host_by_fingerprint(&fp).await.expect("old"), None);

    s.revoke_host(&h.id, now_ms()).await.expect("revoke");
    let err = s
        .set_host_certificate(&h.id, &new_id("fp"), "PEM-4")
        .await
        .expect_err("revoked");
    assert_eq!(err.kind, ErrorKind::Conflict, "{err}");
}

pub async fn connect_seen_disconnect(s: &dyn Store) {
    let h = certified(s).await;
    let t0 = now_ms();
    assert!(connect(s, &h, "sess-1", t0).await);
    let got = get_host(s, &h.id).await;
    assert_eq!(
        got,
        HostRecord {
            status: HostStatus::Online,
            hostname: Some("build-01".to_owned()),
            agent_version: Some("1.2.3".to_owned()),
            adapters: vec!["claude_code".to_owned(), "codex".to_owned()],
            pod_id: Some("pod-a".to_owned()),
            session_id: Some("sess-1".to_owned()),
            connected_at: Some(t0),
            last_seen_at: Some(t0),
            ..h.clone()
        }
    );

    let metrics = json!({"cpu": 0.5, "active_runs": 1});
    s.host_seen(&h.id, "sess-1", Some(&metrics), t0 + 10)
        .await
        .expect("seen with metrics");
    s.host_seen(&h.id, "sess-1", None, t0 + 20)
        .await
        .expect("seen without metrics");
    let got = get_host(s, &h.id).await;
    assert_eq!(got.last_seen_at, Some(t0 + 20));
    assert_eq!(got.metrics, metrics, "kept when none are given");

    s.host_disconnected(&h.id, "sess-old", t0 + 30)
        .await
        .expect("disconnect of another session");
    assert_eq!(
        get_host(s, &h.id).await,
        got,
        "another session changes nothing"
    );

    // A reconnect on another pod replaces the session; the old one closing is then stale.
    assert!(connect(s, &h, "sess-2", t0 + 40).await);
    s.host_disconnected(&h.id, "sess-1", t0 + 50)
        .await
        .expect("stale disconnect");
    let got = get_host(s, &h.id).await;
    assert_eq!(
        (got.status, got.session_id.as_deref()),
        (HostStatus::Online, Some("sess-2"))
    );

    s.host_disconnected(&h.id, "sess-2", t0 + 60)
        .await
        .expect("disconnect");
    let got = get_host(s, &h.id).await;
    assert_eq!(got.status, HostStatus::Offline);
    assert_eq!((got.pod_id, got.session_id), (None, None));
    assert_eq!(got.connected_at, Some(t0 + 40));

    assert!(
        !s.host_connected(&new_id("host"), "pod-a", "s", "h", "v", &[], t0)
            .await
            .expect("connect unknown"),
        "an unknown host cannot connect"
    );
    s.host_seen(&new_id("host"), "s", None, t0)
        .await
        .expect("seen unknown");
    s.host_disconnected(&new_id("host"), "s", t0)
        .await
        .expect("disconnect unknown");
}

pub async fn revoke(s: &dyn Store) {
    let h = certified(s).await;
    let t0 = now_ms();
    assert!(connect(s, &h, "sess-1", t0).await);
    let revoked = s.revoke_host(&h.id, t0 + 1).await.expect("revoke");
    assert_eq!(revoked.status, HostStatus::Revoked);
    assert_eq!(revoked.revoked_at, Some(t0 + 1));
    assert_eq!(
        (revoked.pod_id.as_deref(), revoked.session_id.as_deref()),
        (None, None)
    );
    assert_eq!(get_host(s, &h.id).await, revoked);

    let again = s.revoke_host(&h.id, t0 + 2).await.expect("revoke again");
    assert_eq!(
        again, revoked,
        "idempotent: the first revocation time stays"
    );

    assert!(
        !connect(s, &h, "sess-2", t0 + 3).await,
        "a revoked host cannot connect"
    );
    s.host_seen(&h.id, "sess-1", Some(&json!({"cpu": 1})), t0 + 4)
        .await
        .expect("seen");
    s.host_disconnected(&h.id, "sess-1", t0 + 5)
        .await
        .expect("disconnect");
    assert_eq!(get_host(s, &h.id).await, revoked, "revoked is terminal");

    let err = s
        .revoke_host(&new_id("host"), t0)
        .await
        .expect_err("unknown host");
    assert_eq!(err.kind, ErrorKind::NotFound, "{err}");
}

pub async fn host_config(s: &dyn Store) {
    let h = certified(s).await;
    let config = json!({"max_concurrent_runs": 4, "allowed_tools": ["bash"]});
    s.set_host_config(&h.id, &config).await.expect("set config");
    let got = get_host(s, &h.id).await;
    assert_eq!(got, HostRecord { config, ..h });
}

pub async fn mark_hosts_lost(s: &dyn Store) {
    let t = tenant(s).await;
    let now = now_ms();
    let cutoff = AGES_AGO + 100;

    let stale_online = enrolled_at(s, &t.id, AGES_AGO - 500).await;
    s.set_host_certificate(&stale_online.id, &new_id("fp"), "PEM")
        .await
        .expect("cert");
    assert!(connect(s, &stale_online, "sess-so", AGES_AGO).await);

    let stale_offline = enrolled_at(s, &t.id, AGES_AGO - 500).await;
    s.set_host_certificate(&stale_offline.id, &new_id("fp"), "PEM")
        .await
        .expect("cert");
    assert!(connect(s, &stale_offline, "sess-sf", AGES_AGO - 10).await);
    s.host_disconnected(&stale_offline.id, "sess-sf", AGES_AGO)
        .await
        .expect("disconnect");

    // Certified long ago and never connected: never seen, created before the cutoff.
    let never_seen = enrolled_at(s, &t.id, AGES_AGO - 500).await;
    s.set_host_certificate(&never_seen.id, &new_id("fp"), "PEM")
        .await
        .expect("cert");

    let at_cutoff = enrolled_at(s, &t.id, AGES_AGO - 500).await;
    s.set_host_certificate(&at_cutoff.id, &new_id("fp"), "PEM")
        .await
        .expect("cert");
    assert!(connect(s, &at_cutoff, "sess-c", cutoff).await);

    let fresh = enrolled_at(s, &t.id, AGES_AGO - 500).await;
    s.set_host_certificate(&fresh.id, &new_id("fp"), "PEM")
        .await
        .expect("cert");
    assert!(connect(s, &fresh, "sess-f", now).await);

    let enrolling = enrolled_at(s, &t.id, AGES_AGO - 500).await;

    let revoked = enrolled_at(s, &t.id, AGES_AGO - 500).await;
    s.set_host_certificate(&revoked.id, &new_id("fp"), "PEM")
        .await
        .expect("cert");
    assert!(connect(s, &revoked, "sess-r", AGES_AGO).await);
    s.revoke_host(&revoked.id, AGES_AGO).await.expect("revoke");

    let lost = s.mark_hosts_lost(cutoff, now).await.expect("mark lost");
    let mine: Vec<&HostRecord> = lost.iter().filter(|h| h.tenant_id == t.id).collect();
    let mut got: Vec<String> = mine.iter().map(|h| h.id.clone()).collect();
    got.sort();
    let mut want = vec![
        stale_online.id.clone(),
        stale_offline.id.clone(),
        never_seen.id.clone(),
    ];
    want.sort();
    assert_eq!(got, want, "only stale online or offline hosts are lost");
    for h in &mine {
        assert_eq!(h.status, HostStatus::Lost, "returned after the change");
        assert_eq!((h.pod_id.as_deref(), h.session_id.as_deref()), (None, None));
        assert_eq!(get_host(s, &h.id).await, **h);
    }
    for (h, status) in [
        (&at_cutoff, HostStatus::Online),
        (&fresh, HostStatus::Online),
        (&enrolling, HostStatus::Enrolling),
        (&revoked, HostStatus::Revoked),
    ] {
        assert_eq!(get_host(s, &h.id).await.status, status, "{}", h.id);
    }

    let again = s
        .mark_hosts_lost(cutoff, now)
        .await
        .expect("mark lost again");
    assert!(
        again.iter().all(|h| h.tenant_id != t.id),
        "lost hosts are not lost again"
    );
}

pub async fn a_lost_host_resumes_on_its_session(s: &dyn Store) {
    let t = tenant(s).await;
    let cutoff = AGES_AGO + 100;
    let h = enrolled_at(s, &t.id, AGES_AGO - 500).await;
    s.set_host_certificate(&h.id, &new_id("fp"), "PEM")
        .await
        .expect("cert");
    let session = new_id("sess");
    assert!(connect(s, &h, &session, AGES_AGO).await);
    let lost = s
        .mark_hosts_lost(cutoff, now_ms())
        .await
        .expect("mark lost");
    assert!(lost.iter().any(|l| l.id == h.id));

    s.host_seen(&h.id, "another-session", None, AGES_AGO + 10)
        .await
        .expect("seen on another session");
    let got = get_host(s, &h.id).await;
    assert_eq!(
        got.status,
        HostStatus::Lost,
        "only its own session resumes it"
    );
    assert_eq!(got.last_seen_at, Some(AGES_AGO + 10));

    s.host_seen(&h.id, &session, None, AGES_AGO + 20)
        .await
        .expect("seen on its session");
    let got = get_host(s, &h.id).await;
    assert_eq!(
        got.status,
        HostStatus::Online,
        "a late heartbeat resumes it"
    );
    assert_eq!(
        (got.pod_id.as_deref(), got.session_id.as_deref()),
        (Some("pod-a"), Some(session.as_str()))
    );
    assert_eq!(got.last_seen_at, Some(AGES_AGO + 20));

    // Lost again, then the session closes: nothing is left to resume.
    let lost = s
        .mark_hosts_lost(cutoff, now_ms())
        .await
        .expect("mark lost");
    assert!(lost.iter().any(|l| l.id == h.id));
    s.host_disconnected(&h.id, &session, AGES_AGO + 30)
        .await
        .expect("disconnect");
    s.host_seen(&h.id, &session, None, AGES_AGO + 40)
        .await
        .expect("seen after close");
    let got = get_host(s, &h.id).await;
    assert_eq!(got.status, HostStatus::Lost);
    assert_eq!((got.pod_id, got.session_id), (None, None));
}

pub async fn agents(s: &dyn Store) {
    let t = tenant(s).await;
    let a = certified_of(s, &t.id).await;
    let b = certified_of(s, &t.id).await;
    let now = now_ms();
    let agent = |h: &HostRecord, id: &str, at: i64| AgentRecord {
        host_id: h.id.clone(),
        tenant_id: h.tenant_id.clone(),
        agent_id: id.to_owned(),
        runtime: "claude_code".to_owned(),
        model: "sonnet".to_owned(),
        tools: vec!["bash".to_owned(), "edit".to_owned()],
        max_turns: 40,
        supports: vec!["approvals".to_owned()],
        updated_at: at,
    };

    let first = vec![agent(&a, "reviewer", now), agent(&a, "coder", now)];
    s.replace_agents(&a.id, &first).await.expect("replace");
    assert_eq!(
        s.list_agents(&a.id).await.expect("list"),
        vec![first[1].clone(), first[0].clone()],
        "by agent id"
    );

    let second = vec![agent(&a, "coder", now + 10)];
    s.replace_agents(&a.id, &second)
        .await
        .expect("replace again");
    assert_eq!(
        s.list_agents(&a.id).await.expect("list"),
        second,
        "replaced, not merged"
    );
    assert_eq!(
        s.find_agent(&t.id, "reviewer").await.expect("find gone"),
        None
    );
    assert_eq!(
        s.find_agent(&t.id, "coder").await.expect("find"),
        Some(second[0].clone())
    );

    // Declared later by another host of the tenant: that one wins.
    let on_b = agent(&b, "coder", now + 20);
    s.replace_agents(&b.id, std::slice::from_ref(&on_b))
        .await
        .expect("replace on b");
    assert_eq!(
        s.find_agent(&t.id, "coder").await.expect("find"),
        Some(on_b)
    );
    assert_eq!(
        s.find_agent(&new_id("ten"), "coder")
            .await
            .expect("other tenant"),
        None
    );

    s.replace_agents(&a.id, &[]).await.expect("clear");
    assert!(s.list_agents(&a.id).await.expect("list").is_empty());
}

// -- runs ----------------------------------------------------------------------------------------

pub async fn runs_insert_and_compare_and_set(s: &dyn Store) {
    let h = certified(s).await;
    let now = now_ms();
    let r = insert_run(
        s,
        RunRecord {
            channel_id: Some(new_id("cch")),
            ..run_rec(&h, RunState::Queued, now)
        },
    )
    .await;
    assert_eq!(s.get_run(&r.id).await.expect("get"), Some(r.clone()));
    assert_eq!(s.get_run(&new_id("run")).await.expect("get unknown"), None);

    let err = s.insert_run(&r).await.expect_err("duplicate id");
    assert_eq!(err.kind, ErrorKind::Conflict, "{err}");
    let err = s
        .insert_run(&RunRecord {
            host_id: new_id("host"),
            ..run_rec(&h, RunState::Queued, now)
        })
        .await
        .expect_err("unknown host");
    assert_eq!(err.kind, ErrorKind::NotFound, "{err}");

    let dispatched = RunRecord {
        state: RunState::Dispatched,
        attempts: 1,
        dispatched_at: Some(now + 1),
        updated_at: now + 1,
        ..r.clone()
    };
    assert!(
        !s.update_run(&dispatched, RunState::Running, r.updated_at)
            .await
            .expect("update with a wrong expectation"),
        "compare and set: the state is not Running"
    );
    assert_eq!(
        s.get_run(&r.id).await.expect("get"),
        Some(r.clone()),
        "unchanged"
    );
    assert!(
        !s.update_run(&dispatched, RunState::Queued, r.updated_at - 1)
            .await
            .expect("update from an older version"),
        "compare and set: the row changed since that version"
    );
    assert!(
        s.update_run(&dispatched, RunState::Queued, r.updated_at)
            .await
            .expect("update")
    );
    assert_eq!(
        s.get_run(&r.id).await.expect("get"),
        Some(dispatched.clone())
    );
    assert!(
        !s.update_run(&dispatched, RunState::Queued, r.updated_at)
            .await
            .expect("the same update again"),
        "a second writer with the same expectation loses"
    );
    // Two writers that read the same version of a run in the same state: the second loses
    // although the state did not move.
    let first = RunRecord {
        cancel_requested_at: Some(now + 2),
        updated_at: now + 2,
        ..dispatched.clone()
    };
    let second = RunRecord {
        attempts: 2,
        updated_at: now + 2,
        ..dispatched.clone()
    };
    assert!(
        s.update_run(&first, RunState::Dispatched, dispatched.updated_at)
            .await
            .expect("first writer")
    );
    assert!(
        !s.update_run(&second, RunState::Dispatched, dispatched.updated_at)
            .await
            .expect("second writer"),
        "a stale writer of the same state loses"
    );
    assert_eq!(s.get_run(&r.id).await.expect("get"), Some(first.clone()));
    let dispatched = first;

    // Every field is written.
    let finished = RunRecord {
        state: RunState::Failed,
        goal: "fix the build, then the tests".to_owned(),
        context_bundle: json!({"repo": "switchyard", "files": []}),
        constraints: json!({"max_turns": 5}),
        parent_run_id: Some(new_id("run")),
        attempts: 3,
        not_before: Some(now + 60_000),
        cancel_requested_at: Some(now + 2),
        cancel_sent_at: Some(now + 3),
        error_code: Some("host_lost".to_owned()),
        error_message: Some("the host went away".to_owned()),
        summary: Some("partial".to_owned()),
        updated_at: now + 4,
        finished_at: Some(now + 4),
        channel_id: None,
        ..dispatched.clone()
    };
    assert!(
        s.update_run(&finished, RunState::Dispatched, dispatched.updated_at)
            .await
            .expect("finish")
    );
    assert_eq!(s.get_run(&r.id).await.expect("get"), Some(finished));

    assert!(
        !s.update_run(&run_rec(&h, RunState::Queued, now), RunState::Queued, now)
            .await
            .expect("update unknown"),
        "an unknown run is not written"
    );
}

pub async fn host_runs(s: &dyn Store) {
    let h = certified(s).await;
    let other = certified(s).await;
    let now = now_ms();
    let queued = insert_run(s, run_rec(&h, RunState::Queued, now + 2)).await;
    let running = insert_run(s, run_rec(&h, RunState::Running, now + 1)).await;
    let waiting = insert_run(s, run_rec(&h, RunState::AwaitingApproval, now + 3)).await;
    insert_run(s, run_rec(&h, RunState::Completed, now)).await;
    insert_run(s, run_rec(&other, RunState::Running, now)).await;

    let on_host = [
        RunState::Dispatched,
        RunState::Accepted,
        RunState::Running,
        RunState::AwaitingApproval,
    ];
    assert_eq!(
        s.host_runs(&h.id, &on_host).await.expect("host runs"),
        vec![running.clone(), waiting.clone()],
        "oldest first, only the asked states"
    );
    assert_eq!(
        ids(
            &s.host_runs(&h.id, &[RunState::Queued, RunState::Running])
                .await
                .expect("host runs"),
            |r| &r.id
        ),
        vec![running.id.clone(), queued.id.clone()]
    );
    assert!(s.host_runs(&h.id, &[]).await.expect("no states").is_empty());
    assert!(
        s.host_runs(&new_id("host"), &on_host)
            .await
            .expect("unknown host")
            .is_empty()
    );
}

pub async fn channel_runs(s: &dyn Store) {
    let h = certified(s).await;
    let channel = new_id("cch");
    let now = now_ms();
    let mut made = Vec::new();
    for i in 0..3 {
        made.push(
            insert_run(
                s,
                RunRecord {
                    channel_id: Some(channel.clone()),
                    ..run_rec(&h, RunState::Completed, now + i)
                },
            )
            .await,
        );
    }
    insert_run(
        s,
        RunRecord {
            channel_id: Some(new_id("cch")),
            ..run_rec(&h, RunState::Running, now + 5)
        },
    )
    .await;
    insert_run(s, run_rec(&h, RunState::Running, now + 6)).await;

    assert_eq!(
        s.channel_runs(&channel, 10).await.expect("channel runs"),
        vec![made[2].clone(), made[1].clone(), made[0].clone()],
        "newest first"
    );
    assert_eq!(
        ids(&s.channel_runs(&channel, 2).await.expect("limited"), |r| &r
            .id),
        vec![made[2].id.clone(), made[1].id.clone()]
    );
    assert!(
        s.channel_runs(&new_id("cch"), 10)
            .await
            .expect("unknown channel")
            .is_empty()
    );
}

pub async fn stale_runs(s: &dyn Store) {
    let h = certified(s).await;
    let cutoff = AGES_AGO + 100;
    let older = insert_run(s, run_rec(&h, RunState::Dispatched, AGES_AGO - 50)).await;
    let old = insert_run(s, run_rec(&h, RunState::Accepted, AGES_AGO)).await;
    let other_state = insert_run(s, run_rec(&h, RunState::Running, AGES_AGO)).await;
    let at_cutoff = insert_run(s, run_rec(&h, RunState::Dispatched, cutoff)).await;
    let fresh = insert_run(s, run_rec(&h, RunState::Dispatched, now_ms())).await;

    let states = [RunState::Dispatched, RunState::Accepted];
    let got = s
        .stale_runs(&states, cutoff, 1000)
        .await
        .expect("stale runs");
    let mine: Vec<String> = got
        .iter()
        .filter(|r| r.host_id == h.id)
        .map(|r| r.id.clone())
        .collect();
    assert_eq!(mine, vec![older.id.clone(), old.id.clone()], "oldest first");
    for r in [&other_state, &at_cutoff, &fresh] {
        assert!(!got.iter().any(|g| g.id == r.id), "{} is not stale", r.id);
    }
    assert!(
        got.windows(2).all(|w| w[0].updated_at <= w[1].updated_at),
        "ordered by updated_at"
    );
    assert_eq!(
        s.stale_runs(&states, cutoff, 1)
            .await
            .expect("limited")
            .len(),
        1
    );
    assert!(
        s.stale_runs(&[], cutoff, 1000)
            .await
            .expect("no states")
            .is_empty()
    );
}

pub async fn run_events(s: &dyn Store) {
    let (_, r) = a_run(s).await;
    let append = |host_seq: Option<i64>, kind: &str| {
        let e = event_rec(
            &r.id,
            host_seq,
            kind,
            json!({"host_seq": host_seq, "kind": kind}),
        );
        async move { s.append_run_event(&e).await.expect("append") }
    };

    assert_eq!(append(Some(1), "thinking").await, Some(1));
    assert_eq!(append(Some(2), "tool_call").await, Some(2));
    assert_eq!(append(Some(3), "tool_result").await, Some(3));
    assert_eq!(
        append(Some(2), "tool_call").await,
        None,
        "a replay is dropped"
    );
    assert_eq!(
        append(Some(3), "tool_result").await,
        None,
        "so is the last one"
    );
    assert_eq!(
        append(None, "handoff").await,
        Some(4),
        "server notes carry no host seq"
    );
    assert_eq!(
        append(Some(7), "output").await,
        Some(5),
        "an event that arrives before an earlier lost one is kept"
    );
    let got = s.get_run(&r.id).await.expect("get").expect("run");
    assert_eq!(
        (got.event_count, got.last_host_seq),
        (5, 3),
        "the ack stays below the gap"
    );
    assert_eq!(
        append(Some(5), "output").await,
        Some(6),
        "a gap is filled late"
    );
    assert_eq!(
        append(Some(7), "output").await,
        None,
        "a replay above the ack is still a replay"
    );
    assert_eq!(append(Some(4), "output").await, Some(7));
    let got = s.get_run(&r.id).await.expect("get").expect("run");
    assert_eq!((got.event_count, got.last_host_seq), (7, 5));
    assert_eq!(append(Some(6), "output").await, Some(8));
    let got = s.get_run(&r.id).await.expect("get").expect("run");
    assert_eq!(
        (got.event_count, got.last_host_seq),
        (8, 7),
        "filling the last gap acks everything stored"
    );

    let events = s.run_events(&r.id, 0, 100).await.expect("events");
    assert_eq!(
        events
            .iter()
            .map(|e| (e.seq, e.host_seq, e.kind.as_str()))
            .collect::<Vec<_>>(),
        vec![
            (1, Some(1), "thinking"),
            (2, Some(2), "tool_call"),
            (3, Some(3), "tool_result"),
            (4, None, "handoff"),
            (5, Some(7), "output"),
            (6, Some(5), "output"),
            (7, Some(4), "output"),
            (8, Some(6), "output"),
        ]
    );
    let first = &events[0];
    let sent = event_rec(
        &r.id,
        Some(1),
        "thinking",
        json!({"host_seq": 1, "kind": "thinking"}),
    );
    assert_eq!(
        (first.run_id.as_str(), &first.timestamp, &first.payload),
        (r.id.as_str(), &sent.timestamp, &sent.payload)
    );
    assert_eq!(
        s.run_events(&r.id, 2, 2)
            .await
            .expect("page")
            .iter()
            .map(|e| e.seq)
            .collect::<Vec<_>>(),
        vec![3, 4]
    );
    assert!(s.run_events(&r.id, 8, 100).await.expect("tail").is_empty());

    // A run written from a copy read before the appends keeps the log's counters.
    assert!(
        s.update_run(
            &RunRecord {
                updated_at: r.updated_at + 1,
                ..r.clone()
            },
            RunState::Running,
            r.updated_at
        )
        .await
        .expect("update")
    );
    let got = s.get_run(&r.id).await.expect("get").expect("run");
    assert_eq!((got.event_count, got.last_host_seq), (8, 7));
    assert_eq!(append(Some(8), "completion").await, Some(9));

    let err = s
        .append_run_event(&event_rec(&new_id("run"), Some(1), "thinking", json!({})))
        .await
        .expect_err("unknown run");
    assert_eq!(err.kind, ErrorKind::NotFound, "{err}");
}

/// A host artifact counts its declared size in its tenant's stored bytes, files included.
pub async fn artifacts_count_in_stored_bytes(s: &dyn Store) {
    let (_, r) = a_run(s).await;
    let now = now_ms();
    let big = ArtifactRecord {
        size_bytes: 1000,
        ..artifact_rec(&r, now)
    };
    s.insert_artifact_within(&big, 1500).await.expect("fits");
    assert_eq!(
        s.tenant_stored_bytes(&r.tenant_id).await.expect("bytes"),
        1000
    );
    let err = s
        .insert_artifact_within(
            &ArtifactRecord {
                size_bytes: 600,
                ..artifact_rec(&r, now)
            },
            1500,
        )
        .await
        .expect_err("past the quota");
    assert_eq!(err.kind, ErrorKind::LimitExceeded, "{err}");
    s.insert_artifact_within(&artifact_rec(&r, now), 0)
        .await
        .expect("0 is no limit");
    assert_eq!(
        s.tenant_stored_bytes(&r.tenant_id).await.expect("bytes"),
        1100
    );
}

pub async fn artifacts(s: &dyn Store) {
    let (_, r) = a_run(s).await;
    let now = now_ms();
    let a = artifact_rec(&r, now + 1);
    let b = artifact_rec(&r, now);
    s.insert_artifact(&a).await.expect("insert");
    s.insert_artifact(&b).await.expect("insert");
    assert_eq!(s.get_artifact(&a.id).await.expect("get"), Some(a.clone()));
    assert_eq!(s.get_artifact(&new_id("art")).await.expect("unknown"), None);

    let err = s.insert_artifact(&a).await.expect_err("duplicate");
    assert_eq!(err.kind, ErrorKind::Conflict, "{err}");
    let err = s
        .insert_artifact(&ArtifactRecord {
            run_id: new_id("run"),
            ..artifact_rec(&r, now)
        })
        .await
        .expect_err("unknown run");
    assert_eq!(err.kind, ErrorKind::NotFound, "{err}");

    s.artifact_uploaded(&a.id, 4096, now + 5)
        .await
        .expect("uploaded");
    let uploaded = ArtifactRecord {
        size_bytes: 4096,
        uploaded_at: Some(now + 5),
        ..a.clone()
    };
    assert_eq!(
        s.get_artifact(&a.id).await.expect("get"),
        Some(uploaded.clone())
    );
    let err = s
        .artifact_uploaded(&new_id("art"), 1, now)
        .await
        .expect_err("unknown artifact");
    assert_eq!(err.kind, ErrorKind::NotFound, "{err}");

    assert_eq!(
        s.run_artifacts(&r.id).await.expect("run artifacts"),
        vec![b, uploaded],
        "oldest first"
    );
}

// -- approvals -----------------------------------------------------------------------------------

pub async fn approvals_are_decided_once(s: &dyn Store) {
    let (h, r) = a_run(s).await;
    let now = now_ms();
    let a = approval_rec(&r, now, now + HOUR);
    let b = approval_rec(&r, now + 1, now + HOUR);
    s.insert_approval(&a).await.expect("insert");
    s.insert_approval(&b).await.expect("insert");
    assert_eq!(s.get_approval(&a.id).await.expect("get"), Some(a.clone()));
    assert_eq!(
        s.get_approval(&new_id("appr")).await.expect("unknown"),
        None
    );
    let err = s.insert_approval(&a).await.expect_err("duplicate");
    assert_eq!(err.kind, ErrorKind::Conflict, "{err}");
    let err = s
        .insert_approval(&ApprovalRecord {
            run_id: new_id("run"),
            ..approval_rec(&r, now, now + HOUR)
        })
        .await
        .expect_err("unknown run");
    assert_eq!(err.kind, ErrorKind::NotFound, "{err}");

    let granted = s
        .decide_approval(
            &a.id,
            ApprovalStatus::Granted,
            "alice",
            Some("looks fine"),
            now + 10,
        )
        .await
        .expect("grant")
        .expect("a pending approval is decided");
    assert_eq!(
        granted,
        ApprovalRecord {
            status: ApprovalStatus::Granted,
            decided_by: Some("alice".to_owned()),
            reason: Some("looks fine".to_owned()),
            decided_at: Some(now + 10),
            ..a.clone()
        }
    );
    assert_eq!(
        s.decide_approval(&a.id, ApprovalStatus::Denied, "bob", None, now + 11)
            .await
            .expect("second decision"),
        None,
        "decided once"
    );
    assert_eq!(
        s.get_approval(&a.id).await.expect("get"),
        Some(granted.clone())
    );
    assert_eq!(
        s.decide_approval(&new_id("appr"), ApprovalStatus::Granted, "bob", None, now)
            .await
            .expect("unknown"),
        None
    );
    assert!(
        s.decide_approval(&b.id, ApprovalStatus::Pending, "bob", None, now)
            .await
            .is_err(),
        "a decision is granted or denied"
    );

    let denied = s
        .decide_approval(&b.id, ApprovalStatus::Denied, "bob", None, now + 12)
        .await
        .expect("deny")
        .expect("pending");
    assert_eq!(denied.status, ApprovalStatus::Denied);
    assert_eq!(denied.reason, None);

    let pending = approval_rec(&r, now + 2, now + HOUR);
    s.insert_approval(&pending).await.expect("insert");
    assert_eq!(
        s.list_approvals(&h.tenant_id, None)
            .await
            .expect("list all"),
        vec![granted.clone(), denied.clone(), pending.clone()],
        "oldest first"
    );
    assert_eq!(
        s.list_approvals(&h.tenant_id, Some(ApprovalStatus::Pending))
            .await
            .expect("list pending"),
        vec![pending]
    );
    assert_eq!(
        s.list_approvals(&h.tenant_id, Some(ApprovalStatus::Granted))
            .await
            .expect("list granted"),
        vec![granted]
    );
    assert!(
        s.list_approvals(&new_id("ten"), None)
            .await
            .expect("other tenant")
            .is_empty()
    );
}

pub async fn expire_approvals(s: &dyn Store) {
    let (_, r) = a_run(s).await;
    let cutoff = AGES_AGO + 100;
    let old = approval_rec(&r, AGES_AGO - 100, AGES_AGO);
    let at_cutoff = approval_rec(&r, AGES_AGO - 100, cutoff);
    let decided = approval_rec(&r, AGES_AGO - 100, AGES_AGO);
    for a in [&old, &at_cutoff, &decided] {
        s.insert_approval(a).await.expect("insert");
    }
    s.decide_approval(
        &decided.id,
        ApprovalStatus::Granted,
        "alice",
        None,
        AGES_AGO - 1,
    )
    .await
    .expect("decide")
    .expect("pending");

    assert_eq!(
        s.decide_approval(
            &at_cutoff.id,
            ApprovalStatus::Granted,
            "alice",
            None,
            cutoff
        )
        .await
        .expect("decide at expiry"),
        None,
        "an approval is decided only before expires_at"
    );

    let expired = s.expire_approvals(cutoff).await.expect("expire");
    let mine: Vec<&ApprovalRecord> = expired.iter().filter(|a| a.run_id == r.id).collect();
    assert_eq!(
        mine,
        vec![&ApprovalRecord {
            status: ApprovalStatus::Expired,
            decided_at: Some(cutoff),
            ..old.clone()
        }],
        "only pending approvals that expired before now"
    );
    assert_eq!(
        s.get_approval(&old.id).await.expect("get"),
        Some(mine[0].clone())
    );
    assert_eq!(
        s.get_approval(&at_cutoff.id)
            .await
            .expect("get")
            .map(|a| a.status),
        Some(ApprovalStatus::Pending)
    );
    assert_eq!(
        s.get_approval(&decided.id)
            .await
            .expect("get")
            .map(|a| a.status),
        Some(ApprovalStatus::Granted)
    );
    assert_eq!(
        s.decide_approval(
            &old.id,
            ApprovalStatus::Granted,
            "alice",
            None,
            AGES_AGO - 1
        )
        .await
        .expect("decide expired"),
        None,
        "an expired approval stays expired"
    );
    assert!(
        s.expire_approvals(cutoff)
            .await
            .expect("expire again")
            .iter()
            .all(|a| a.run_id != r.id)
    );
}

pub async fn undelivered_decisions(s: &dyn Store) {
    let (h, r) = a_run(s).await;
    let now = now_ms();
    let granted = approval_rec(&r, now, now + HOUR);
    let pending = approval_rec(&r, now + 1, now + HOUR);
    let expired = approval_rec(&r, AGES_AGO - 100, AGES_AGO);
    for a in [&granted, &pending, &expired] {
        s.insert_approval(a).await.expect("insert");
    }
    let granted = s
        .decide_approval(&granted.id, ApprovalStatus::Granted, "alice", None, now + 5)
        .await
        .expect("grant")
        .expect("pending");
    s.expire_approvals(AGES_AGO + 100).await.expect("expire");
    let expired = s
        .get_approval(&expired.id)
        .await
        .expect("get")
        .expect("approval");

    let mut got = s.undelivered_decisions(&h.id).await.expect("undelivered");
    got.sort_by(|a, b| a.id.cmp(&b.id));
    let mut want = vec![granted.clone(), expired.clone()];
    want.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(got, want, "decided and expired approvals, not pending ones");

    s.mark_approval_delivered(&granted.id, now + 6)
        .await
        .expect("delivered");
    s.mark_approval_delivered(&granted.id, now + 7)
        .await
        .expect("delivered again");
    assert_eq!(
        s.get_approval(&granted.id)
            .await
            .expect("get")
            .and_then(|a| a.delivered_at),
        Some(now + 6),
        "the first delivery time stays"
    );
    assert_eq!(
        s.undelivered_decisions(&h.id).await.expect("undelivered"),
        vec![expired]
    );
    s.mark_approval_delivered(&new_id("appr"), now)
        .await
        .expect("unknown");
    assert!(
        s.undelivered_decisions(&new_id("host"))
            .await
            .expect("unknown host")
            .is_empty()
    );
}

// -- purge ---------------------------------------------------------------------------------------

pub async fn purge_runs(s: &dyn Store) {
    let h = certified(s).await;
    let now = now_ms();
    let cutoff = AGES_AGO + 100;
    let finished = |state: RunState, at: i64| RunRecord {
        finished_at: Some(at),
        ..run_rec(&h, state, now)
    };
    let old = insert_run(s, finished(RunState::Completed, AGES_AGO)).await;
    let old_failed = insert_run(s, finished(RunState::Failed, AGES_AGO + 50)).await;
    let at_cutoff = insert_run(s, finished(RunState::Cancelled, cutoff)).await;
    let live = insert_run(s, run_rec(&h, RunState::Running, now)).await;

    let mut keys = Vec::new();
    for r in [&old, &old_failed, &at_cutoff, &live] {
        s.append_run_event(&event_rec(&r.id, Some(1), "output", json!({})))
            .await
            .expect("append");
        let a = artifact_rec(r, now);
        s.insert_artifact(&a).await.expect("artifact");
        let p = approval_rec(r, now, now + HOUR);
        s.insert_approval(&p).await.expect("approval");
        keys.push((r.id.clone(), a, p));
    }
    let extra = artifact_rec(&old, now);
    s.insert_artifact(&extra).await.expect("second artifact");

    let purge = s.purge_runs(cutoff).await.expect("purge");
    assert!(purge.runs >= 2, "{purge:?}");
    let mut want: Vec<String> = vec![
        keys[0].1.object_key.clone(),
        keys[1].1.object_key.clone(),
        extra.object_key.clone(),
    ];
    want.sort();
    let mut got: Vec<String> = purge
        .object_keys
        .iter()
        .filter(|k| want.contains(k))
        .cloned()
        .collect();
    got.sort();
    assert_eq!(got, want, "the purged artifacts' object keys");
    for kept in [&keys[2].1, &keys[3].1] {
        assert!(!purge.object_keys.contains(&kept.object_key));
    }

    for (run_id, artifact, approval) in &keys[..2] {
        assert_eq!(s.get_run(run_id).await.expect("get run"), None);
        assert!(
            s.run_events(run_id, 0, 10)
                .await
                .expect("events")
                .is_empty()
        );
        assert!(s.run_artifacts(run_id).await.expect("artifacts").is_empty());
        assert_eq!(s.get_artifact(&artifact.id).await.expect("artifact"), None);
        assert_eq!(s.get_approval(&approval.id).await.expect("approval"), None);
    }
    assert_eq!(s.get_artifact(&extra.id).await.expect("artifact"), None);
    for (run_id, artifact, approval) in &keys[2..] {
        assert!(s.get_run(run_id).await.expect("get run").is_some());
        assert_eq!(s.run_events(run_id, 0, 10).await.expect("events").len(), 1);
        assert!(
            s.get_artifact(&artifact.id)
                .await
                .expect("artifact")
                .is_some()
        );
        assert!(
            s.get_approval(&approval.id)
                .await
                .expect("approval")
                .is_some()
        );
    }

    let again = s.purge_runs(cutoff).await.expect("purge again");
    assert!(again.object_keys.iter().all(|k| !want.contains(k)));
}

// -- concurrency ---------------------------------------------------------------------------------

/// Two hosts racing with one token (or one token replayed): exactly one enrolls.
pub async fn enrollment_is_consumed_once_under_concurrency(store: &Arc<dyn Store>) {
    let t = tenant(&**store).await;
    let now = now_ms();
    let h = host_rec(&t.id, &new_id("name"), now);
    let e = enrollment_rec(&h, now + HOUR);
    store.insert_enrollment(&h, &e).await.expect("insert");
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            let hash = e.token_hash.clone();
            tokio::spawn(async move { store.consume_enrollment(&hash, now + i).await })
        })
        .collect();
    let mut winners = 0;
    for t in tasks {
        if t.await.expect("task").expect("consume").is_some() {
            winners += 1;
        }
    }
    assert_eq!(winners, 1, "exactly one concurrent consumer wins");
}

/// Appends racing on one run get every seq exactly once, each task's events in its order.
pub async fn concurrent_appends(store: &Arc<dyn Store>) {
    const TASKS: usize = 8;
    const EACH: usize = 25;
    let (_, r) = a_run(&**store).await;
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let store = store.clone();
            let run_id = r.id.clone();
            tokio::spawn(async move {
                let mut seqs = Vec::with_capacity(EACH);
                for i in 0..EACH {
                    let e = event_rec(&run_id, None, "output", json!({"task": task, "i": i}));
                    let seq = store.append_run_event(&e).await?;
                    seqs.push(seq);
                }
                Ok::<_, crate::error::BackendError>(seqs)
            })
        })
        .collect();
    for t in tasks {
        let seqs = t
            .await
            .expect("task")
            .expect("no append fails under contention");
        assert!(seqs.iter().all(Option::is_some), "nothing is a replay");
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "a task's events in its order"
        );
    }

    let total = (TASKS * EACH) as i64;
    let events = store.run_events(&r.id, 0, 1000).await.expect("events");
    assert_eq!(
        events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=total).collect::<Vec<_>>(),
        "seqs are 1..=n without gaps or duplicates"
    );
    for task in 0..TASKS {
        let mine: Vec<u64> = events
            .iter()
            .filter(|e| e.payload["task"] == json!(task))
            .filter_map(|e| e.payload["i"].as_u64())
            .collect();
        assert_eq!(mine, (0..EACH as u64).collect::<Vec<_>>(), "task {task}");
    }
    let got = store.get_run(&r.id).await.expect("get").expect("run");
    assert_eq!((got.event_count, got.last_host_seq), (total, 0));
}

// -- operator console pages ----------------------------------------------------------------------

/// Hosts in id order, runs newest first and pending approvals oldest first, across tenants.
/// This test's runs and approvals live in the far future, where no other behaviour writes.
pub async fn console_pages(s: &dyn Store) {
    let t = tenant(s).await;
    let mut hosts = Vec::new();
    for i in 0..3 {
        hosts.push(enrolled_at(s, &t.id, now_ms() + i).await);
    }
    let mut sorted = ids(&hosts, |h| &h.id);
    sorted.sort();
    let before_first = &sorted[0][..sorted[0].len() - 1];
    let page = s.page_hosts(Some(before_first), 2).await.expect("hosts");
    assert_eq!(page.len(), 2);
    assert!(page[0].id <= sorted[0] && page[0].id < page[1].id);
    let after = s.page_hosts(Some(&sorted[1]), 50).await.expect("hosts");
    assert!(after.iter().all(|h| h.id > sorted[1]));
    assert!(after.iter().any(|h| h.id == sorted[2]));

    const FUTURE: i64 = 4_000_000_000_000;
    let h = &hosts[0];
    let mut runs = Vec::new();
    for i in 0..4 {
        // Two runs share a time: the id breaks the tie.
        let at = FUTURE + [0, 1, 1, 2][i];
        runs.push(insert_run(s, run_rec(h, RunState::Running, at)).await);
    }
    let mut newest_first = runs.clone();
    newest_first.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
    let p1 = s.page_runs(Some((FUTURE + 10, "")), 3).await.expect("runs");
    assert_eq!(ids(&p1, |r| &r.id), ids(&newest_first[..3], |r| &r.id));
    let last = &p1[2];
    let p2 = s
        .page_runs(Some((last.created_at, &last.id)), 1)
        .await
        .expect("runs");
    assert_eq!(p2[0].id, newest_first[3].id);
    assert!(s.page_runs(None, 1).await.expect("runs")[0].created_at >= FUTURE + 2);

    let mut approvals = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        let a = approval_rec(r, FUTURE + i as i64, FUTURE + HOUR);
        s.insert_approval(&a).await.expect("approval");
        approvals.push(a);
    }
    s.decide_approval(
        &approvals[1].id,
        ApprovalStatus::Granted,
        "alice",
        None,
        FUTURE,
    )
    .await
    .expect("decide")
    .expect("pending");
    let pend = s
        .page_approvals(ApprovalStatus::Pending, Some((FUTURE - 1, "")), 2)
        .await
        .expect("approvals");
    assert_eq!(
        ids(&pend, |a| &a.id),
        [approvals[0].id.clone(), approvals[2].id.clone()]
    );
    let more = s
        .page_approvals(
            ApprovalStatus::Pending,
            Some((pend[1].created_at, &pend[1].id)),
            10,
        )
        .await
        .expect("approvals");
    assert_eq!(more[0].id, approvals[3].id);
    let granted = s
        .page_approvals(ApprovalStatus::Granted, Some((FUTURE - 1, "")), 10)
        .await
        .expect("approvals");
    assert_eq!(granted[0].decided_by.as_deref(), Some("alice"));
    // Leave no pending approval in the far future for other suites' sweeps to trip on.
    for a in [&approvals[0], &approvals[2], &approvals[3]] {
        s.decide_approval(&a.id, ApprovalStatus::Denied, "cleanup", None, FUTURE)
            .await
            .expect("decide");
    }
}

/// The console's search on runs: by tenant, by state and by run id prefix, newest first
/// with the page's cursor.
pub async fn console_search_runs(s: &dyn Store) {
    use crate::model::ConsoleFilter;
    const FUTURE: i64 = 4_100_000_000_000;
    let t1 = tenant(s).await;
    let t2 = tenant(s).await;
    let h1 = enrolled_at(s, &t1.id, now_ms()).await;
    let h2 = enrolled_at(s, &t2.id, now_ms()).await;
    let p = new_id("rsrch");
    let mut runs = Vec::new();
    for (i, (h, state)) in [
        (&h1, RunState::Running),
        (&h2, RunState::Running),
        (&h1, RunState::Completed),
        (&h2, RunState::Queued),
    ]
    .into_iter()
    .enumerate()
    {
        let mut r = run_rec(h, state, FUTURE + i as i64);
        r.id = format!("{p}-{i}");
        runs.push(insert_run(s, r).await);
    }
    let find = |f: ConsoleFilter, before: Option<(i64, String)>, limit: u32| async move {
        let found = s
            .search_runs(
                &f,
                before.as_ref().map(|(at, id)| (*at, id.as_str())),
                limit,
            )
            .await
            .expect("search runs");
        ids(&found, |r| &r.id)
    };
    let want = |is: &[usize]| is.iter().map(|&i| runs[i].id.clone()).collect::<Vec<_>>();
    let prefix = |tenant: Option<&str>, state: Option<&str>| ConsoleFilter {
        tenant_id: tenant.map(str::to_owned),
        status: state.map(str::to_owned),
        id_prefix: Some(p.clone()),
        ..ConsoleFilter::default()
    };
    assert_eq!(
        find(prefix(None, None), None, 50).await,
        want(&[3, 2, 1, 0])
    );
    assert_eq!(
        find(prefix(Some(&t1.id), None), None, 50).await,
        want(&[2, 0])
    );
    assert_eq!(
        find(prefix(None, Some("running")), None, 50).await,
        want(&[1, 0])
    );
    assert_eq!(
        find(prefix(Some(&t2.id), Some("queued")), None, 50).await,
        want(&[3])
    );
    let exact = ConsoleFilter {
        id_prefix: Some(runs[2].id.clone()),
        ..ConsoleFilter::default()
    };
    assert_eq!(find(exact, None, 50).await, want(&[2]));
    // One at a time through the cursor.
    let first = find(prefix(None, Some("running")), None, 1).await;
    assert_eq!(first, want(&[1]));
    assert_eq!(
        find(
            prefix(None, Some("running")),
            Some((runs[1].created_at, runs[1].id.clone())),
            1
        )
        .await,
        want(&[0])
    );
}
