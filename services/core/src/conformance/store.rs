//! Conformance suite for [`Store`]: what every durable store (SQLite, Postgres) must do.
//!
//! Each `pub async fn` here is one case, except the fixtures a backend's own tests may share
//! (`connector`, `channel_of`, `message`, `item`). A backend's tests run every case as a test
//! of its own with [`store_conformance_tests!`](crate::store_conformance_tests), each on a
//! fresh, empty store: [`schema`] checks that it starts at version 0 and migrates it, every other case gets
//! it migrated. Cases use their own random ids all the same, and sweeps (`reap_dead_pods`,
//! `purge_*`, `expired_*`, `stale_unbound_channels`) put the rows meant to be swept far in the
//! past ([`AGES_AGO`]), sweep with cutoffs there, assert on their own rows only and count with
//! `>=`, so a case also holds on a store that others share.

use std::sync::Arc;

use serde_json::json;
use switchyard_protocol::ConnectionStatus;

use crate::error::ErrorKind;
use crate::ids::{new_id, now_ms};
use crate::model::*;
use crate::store::{SCHEMA_VERSION, Store};

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

async fn connector_with(
    s: &dyn Store,
    tenant_id: &str,
    offline_since: Option<i64>,
) -> ConnectorRecord {
    let c = ConnectorRecord {
        id: new_id("conn"),
        tenant_id: tenant_id.to_owned(),
        card_id: new_id("card"),
        created_at: now_ms(),
        offline_since,
    };
    s.insert_connector(&c).await.expect("insert connector");
    c
}

/// A tenant with one connector_id.
pub async fn connector(s: &dyn Store) -> ConnectorRecord {
    let t = tenant(s).await;
    connector_with(s, &t.id, None).await
}

fn channel_rec(c: &ConnectorRecord, updated_at: i64) -> ChannelRecord {
    ChannelRecord {
        id: new_id("cch"),
        tenant_id: c.tenant_id.clone(),
        connector_id: c.id.clone(),
        card_id: c.card_id.clone(),
        route_socket: None,
        profiles: vec!["xagent.im.v2".to_owned()],
        status: ConnectionStatus::Created,
        view: json!({"display": "new"}),
        binding: None,
        binding_key: None,
        created_at: updated_at,
        updated_at,
    }
}

/// A new channel of connector `c`.
pub async fn channel_of(s: &dyn Store, c: &ConnectorRecord) -> ChannelRecord {
    let ch = channel_rec(c, now_ms());
    s.insert_channel(&ch).await.expect("insert channel");
    ch
}

/// A channel of a fresh tenant and connector_id.
async fn channel(s: &dyn Store) -> ChannelRecord {
    let c = connector(s).await;
    channel_of(s, &c).await
}

/// A new message of `channel_id` with a fresh id.
pub fn message(channel_id: &str, created_at: i64, expires_at: i64) -> OutboxRecord {
    let message_id = new_id("msg");
    OutboxRecord {
        seq: 0,
        channel_id: channel_id.to_owned(),
        payload: json!({"message_id": message_id, "text": "hello"}),
        message_id,
        created_at,
        expires_at,
        attempts: 0,
        state: OutboxState::Pending,
        last_error: None,
    }
}

/// A message accepted now, expiring in an hour, with a two-hour dedupe window.
async fn enqueue(s: &dyn Store, channel_id: &str, cap: u32) -> (OutboxRecord, EnqueueOutcome) {
    let now = now_ms();
    let m = message(channel_id, now, now + HOUR);
    let out = s
        .enqueue_outbox(&m, cap, now + 2 * HOUR)
        .await
        .expect("enqueue");
    (m, out)
}

async fn pending_ids(s: &dyn Store, channel_id: &str, now: i64) -> Vec<String> {
    let recs = s
        .pending_outbox(channel_id, 0, now, 1000)
        .await
        .expect("pending outbox");
    recs.into_iter().map(|r| r.message_id).collect()
}

fn claim_rec(
    channel_id: &str,
    key: &str,
    fingerprint: &str,
    created_at: i64,
    expires_at: i64,
) -> IdempotencyRecord {
    IdempotencyRecord {
        scope: "msg".to_owned(),
        channel_id: channel_id.to_owned(),
        key: key.to_owned(),
        fingerprint: fingerprint.to_owned(),
        state: ClaimState::InProgress,
        outcome: None,
        created_at,
        expires_at,
    }
}

fn file_rec(ch: &ChannelRecord, expires_at: i64) -> FileRecord {
    let file_ref = new_id("fref");
    FileRecord {
        storage_key: format!("files/{file_ref}"),
        file_ref,
        tenant_id: ch.tenant_id.clone(),
        channel_id: ch.id.clone(),
        direction: FileDirection::Inbound,
        filename: "photo.jpg".to_owned(),
        mime_type: "image/jpeg".to_owned(),
        file_type: "image".to_owned(),
        byte_size: 1234,
        created_at: expires_at - HOUR,
        expires_at,
    }
}

fn auth_rec(channel_id: &str, status: AuthStatus, expires_at: i64) -> AuthSessionRecord {
    AuthSessionRecord {
        id: new_id("auth"),
        channel_id: channel_id.to_owned(),
        flow_id: "qr".to_owned(),
        status,
        state: Some(b"sealed provider state".to_vec()),
        public: json!({"qr_code_text": "https://example.invalid/qr", "poll_interval_ms": 2000}),
        created_at: expires_at - HOUR,
        expires_at,
    }
}

async fn offline_since(s: &dyn Store, connector_id: &str) -> Option<i64> {
    s.get_connector(connector_id)
        .await
        .expect("get connector")
        .expect("connector exists")
        .offline_since
}

async fn socket(s: &dyn Store, connector_id: &str, pod_id: &str) -> String {
    let id = new_id("sock");
    let rec = SocketRecord {
        id: id.clone(),
        connector_id: connector_id.to_owned(),
        pod_id: pod_id.to_owned(),
        opened_at: now_ms(),
    };
    s.register_socket(&rec).await.expect("register socket");
    id
}

/// A pod with a fresh heartbeat: no sweep in this suite reaches it.
async fn live_pod(s: &dyn Store) -> String {
    let pod = new_id("pod");
    s.pod_heartbeat(&pod, now_ms())
        .await
        .expect("pod heartbeat");
    pod
}

fn sorted<T: Clone, K: Ord>(v: &[T], key: impl Fn(&T) -> K) -> Vec<T> {
    let mut v = v.to_vec();
    v.sort_by_key(key);
    v
}

// -- schema, tenants, keys -----------------------------------------------------------------------

pub async fn schema(s: &dyn Store) {
    assert_eq!(
        s.schema_version().await.expect("schema version"),
        0,
        "a fresh store has no schema"
    );
    s.migrate().await.expect("migrate");
    assert_eq!(
        s.schema_version().await.expect("schema version"),
        SCHEMA_VERSION
    );
    s.migrate()
        .await
        .expect("migrating a current schema is a no-op");
    assert_eq!(
        s.schema_version().await.expect("schema version"),
        SCHEMA_VERSION
    );
    s.ping().await.expect("ping");
}

pub async fn tenants(s: &dyn Store) {
    let t = tenant(s).await;
    assert_eq!(s.get_tenant(&t.id).await.expect("get"), Some(t.clone()));
    assert_eq!(
        s.find_tenant(&t.id).await.expect("find by id"),
        Some(t.clone())
    );
    assert_eq!(
        s.find_tenant(&t.name).await.expect("find by name"),
        Some(t.clone())
    );
    assert_eq!(
        s.get_tenant(&new_id("ten")).await.expect("get unknown"),
        None
    );
    assert_eq!(
        s.find_tenant(&new_id("ten")).await.expect("find unknown"),
        None
    );
    assert!(s.list_tenants().await.expect("list").contains(&t));

    let same_id = Tenant {
        name: new_id("name"),
        ..t.clone()
    };
    let err = s
        .create_tenant(&same_id)
        .await
        .expect_err("duplicate tenant id");
    assert_eq!(err.kind, ErrorKind::Conflict);
    let same_name = Tenant {
        id: new_id("ten"),
        ..t.clone()
    };
    let err = s
        .create_tenant(&same_name)
        .await
        .expect_err("duplicate tenant name");
    assert_eq!(
        err.kind,
        ErrorKind::Conflict,
        "names are unique so find_tenant is unambiguous"
    );
}

pub async fn api_keys(s: &dyn Store) {
    let t = tenant(s).await;
    let other = tenant(s).await;
    let key = |tenant_id: &str| ApiKeyRecord {
        id: new_id("key"),
        tenant_id: tenant_id.to_owned(),
        secret_hash: crate::ids::random_secret(32),
        created_at: now_ms(),
        revoked_at: None,
    };
    let (k1, k2, k3) = (key(&t.id), key(&t.id), key(&other.id));
    for k in [&k1, &k2, &k3] {
        s.insert_api_key(k).await.expect("insert api key");
    }
    assert_eq!(s.get_api_key(&k1.id).await.expect("get"), Some(k1.clone()));
    assert_eq!(
        s.get_api_key(&new_id("key")).await.expect("get unknown"),
        None
    );
    let listed = s.list_api_keys(&t.id).await.expect("list");
    assert_eq!(
        sorted(&listed, |k| k.id.clone()),
        sorted(&[k1.clone(), k2.clone()], |k| k.id.clone())
    );
    assert!(
        s.list_api_keys(&new_id("ten"))
            .await
            .expect("list unknown")
            .is_empty()
    );

    let err = s.insert_api_key(&k1).await.expect_err("duplicate key id");
    assert_eq!(err.kind, ErrorKind::Conflict);

    let at = now_ms();
    s.revoke_api_key(&k1.id, at).await.expect("revoke");
    assert_eq!(
        s.get_api_key(&k1.id)
            .await
            .expect("get")
            .and_then(|k| k.revoked_at),
        Some(at)
    );
    assert_eq!(
        s.get_api_key(&k2.id)
            .await
            .expect("get")
            .and_then(|k| k.revoked_at),
        None
    );
    let err = s
        .revoke_api_key(&new_id("key"), at)
        .await
        .expect_err("revoke unknown");
    assert_eq!(err.kind, ErrorKind::NotFound);
}

// -- connector_ids, sockets, pods ----------------------------------------------------------------

pub async fn tenant_quotas(s: &dyn Store) {
    let t = tenant(s).await;
    let q = TenantQuota {
        tenant_id: t.id.clone(),
        sockets: Some(3),
        channels: None,
        stored_bytes: Some(0),
        requests_per_second: Some(50),
        updated_at: now_ms(),
    };
    s.set_tenant_quota(&q).await.expect("set quota");
    let all = s.tenant_quotas().await.expect("list quotas");
    assert_eq!(all.iter().find(|x| x.tenant_id == t.id), Some(&q));
    // A second set replaces every column, a None included.
    let q2 = TenantQuota {
        sockets: None,
        channels: Some(10),
        ..q.clone()
    };
    s.set_tenant_quota(&q2).await.expect("replace quota");
    let all = s.tenant_quotas().await.expect("list quotas");
    assert_eq!(all.iter().filter(|x| x.tenant_id == t.id).count(), 1);
    assert_eq!(all.iter().find(|x| x.tenant_id == t.id), Some(&q2));
}

pub async fn tenant_usage_counts(s: &dyn Store) {
    let c = connector(s).await;
    let other = channel(s).await;
    let pod = live_pod(s).await;
    for _ in 0..3 {
        socket(s, &c.id, &pod).await;
    }
    let mut channels = Vec::new();
    for _ in 0..4 {
        channels.push(channel_of(s, &c).await);
    }
    let t = &c.tenant_id;
    assert_eq!(s.count_tenant_sockets(t, 100).await.expect("sockets"), 3);
    assert_eq!(s.count_tenant_sockets(t, 2).await.expect("bounded"), 2);
    assert_eq!(s.count_tenant_channels(t, 100).await.expect("channels"), 4);
    assert_eq!(s.count_tenant_channels(t, 3).await.expect("bounded"), 3);
    assert_eq!(s.tenant_stored_bytes(t).await.expect("no files"), 0);
    for (i, ch) in channels.iter().take(2).enumerate() {
        let f = FileRecord {
            byte_size: 1000 * (i as u64 + 1),
            ..file_rec(ch, now_ms() + HOUR)
        };
        s.insert_file(&f).await.expect("insert file");
    }
    let foreign = FileRecord {
        byte_size: 7,
        ..file_rec(&other, now_ms() + HOUR)
    };
    s.insert_file(&foreign).await.expect("insert foreign file");
    assert_eq!(s.tenant_stored_bytes(t).await.expect("bytes"), 3000);
    assert_eq!(
        s.count_tenant_channels(&other.tenant_id, 100)
            .await
            .expect("other tenant"),
        1
    );
}

pub async fn connectors(s: &dyn Store) {
    let t = tenant(s).await;
    let c = connector_with(s, &t.id, None).await;
    assert_eq!(s.get_connector(&c.id).await.expect("get"), Some(c.clone()));
    assert_eq!(
        s.connector_for(&t.id, &c.card_id)
            .await
            .expect("connector_for"),
        Some(c.clone())
    );
    assert_eq!(
        s.connector_for(&t.id, &new_id("card"))
            .await
            .expect("other card"),
        None
    );
    assert_eq!(
        s.get_connector(&new_id("conn")).await.expect("get unknown"),
        None
    );

    let twin = ConnectorRecord {
        id: new_id("conn"),
        ..c.clone()
    };
    let err = s
        .insert_connector(&twin)
        .await
        .expect_err("second connector_id for the same tenant and Card");
    assert_eq!(err.kind, ErrorKind::Conflict);
    assert_eq!(
        s.connector_for(&t.id, &c.card_id)
            .await
            .expect("connector_for"),
        Some(c.clone())
    );

    let other = tenant(s).await;
    let theirs = ConnectorRecord {
        id: new_id("conn"),
        tenant_id: other.id.clone(),
        ..c.clone()
    };
    s.insert_connector(&theirs)
        .await
        .expect("same Card, another tenant");
    assert_eq!(
        s.connector_for(&other.id, &c.card_id)
            .await
            .expect("connector_for"),
        Some(theirs)
    );
}

/// Rows that belong to another row need it to exist.
pub async fn references_must_exist(s: &dyn Store) {
    let orphan = ChannelRecord {
        connector_id: new_id("conn"),
        ..channel_rec(&connector(s).await, now_ms())
    };
    let err = s
        .insert_channel(&orphan)
        .await
        .expect_err("channel of an unknown connector_id");
    assert_eq!(err.kind, ErrorKind::NotFound);

    let now = now_ms();
    let m = message(&new_id("cch"), now, now + HOUR);
    let err = s
        .enqueue_outbox(&m, 10, now + HOUR)
        .await
        .expect_err("enqueue to an unknown channel");
    assert_eq!(err.kind, ErrorKind::NotFound);
}

pub async fn sockets_and_offline_time(s: &dyn Store) {
    let t = tenant(s).await;
    let c = connector_with(s, &t.id, Some(now_ms() - HOUR)).await;
    let pod = live_pod(s).await;

    let s1 = socket(s, &c.id, &pod).await;
    assert_eq!(
        offline_since(s, &c.id).await,
        None,
        "hello clears the offline time"
    );
    let s2 = socket(s, &c.id, &pod).await;

    let t1 = now_ms();
    s.unregister_socket(&s1, t1).await.expect("unregister");
    assert_eq!(
        offline_since(s, &c.id).await,
        None,
        "another socket remains"
    );

    s.unregister_socket(&s2, t1 + 5)
        .await
        .expect("unregister last");
    assert_eq!(
        offline_since(s, &c.id).await,
        Some(t1 + 5),
        "the last socket went"
    );

    s.unregister_socket(&s2, t1 + 9)
        .await
        .expect("unregistering twice is harmless");
    s.unregister_socket(&new_id("sock"), t1 + 9)
        .await
        .expect("unknown socket");
    assert_eq!(
        offline_since(s, &c.id).await,
        Some(t1 + 5),
        "offline time is not moved"
    );

    socket(s, &c.id, &pod).await;
    assert_eq!(
        offline_since(s, &c.id).await,
        None,
        "a new hello clears it again"
    );
}

pub async fn remove_pod(s: &dyn Store) {
    let draining = new_id("pod");
    s.pod_heartbeat(&draining, AGES_AGO)
        .await
        .expect("heartbeat");
    let other = live_pod(s).await;
    let only_here = connector(s).await;
    let also_elsewhere = connector(s).await;
    socket(s, &only_here.id, &draining).await;
    socket(s, &also_elsewhere.id, &draining).await;
    let remaining = socket(s, &also_elsewhere.id, &other).await;

    let now = now_ms();
    s.remove_pod(&draining, now).await.expect("remove pod");
    assert_eq!(offline_since(s, &only_here.id).await, Some(now));
    assert_eq!(offline_since(s, &also_elsewhere.id).await, None);

    // Its socket went with the pod: unregistering the other one makes the connector offline.
    s.unregister_socket(&remaining, now + 1)
        .await
        .expect("unregister");
    assert_eq!(offline_since(s, &also_elsewhere.id).await, Some(now + 1));

    // The pod row went too: a sweep that would reach its old heartbeat does not report it.
    let reaped = s.reap_dead_pods(AGES_AGO + 1, now).await.expect("reap");
    assert!(!reaped.contains(&draining));
}

pub async fn reap_dead_pods(s: &dyn Store) {
    let dead = new_id("pod");
    s.pod_heartbeat(&dead, AGES_AGO).await.expect("heartbeat");
    let live = live_pod(s).await;
    let never_beat = new_id("pod");

    let on_dead = connector(s).await;
    let on_both = connector(s).await;
    let on_orphan = connector(s).await;
    let on_live = connector(s).await;
    socket(s, &on_dead.id, &dead).await;
    socket(s, &on_both.id, &dead).await;
    let live_socket = socket(s, &on_both.id, &live).await;
    socket(s, &on_orphan.id, &never_beat).await;
    socket(s, &on_live.id, &live).await;

    let now = now_ms();
    let reaped = s.reap_dead_pods(AGES_AGO + 1, now).await.expect("reap");
    assert!(reaped.contains(&dead));
    assert!(!reaped.contains(&live));
    assert_eq!(offline_since(s, &on_dead.id).await, Some(now));
    assert_eq!(
        offline_since(s, &on_orphan.id).await,
        Some(now),
        "sockets of a pod without a row are reaped"
    );
    assert_eq!(offline_since(s, &on_both.id).await, None);
    assert_eq!(offline_since(s, &on_live.id).await, None);

    s.unregister_socket(&live_socket, now + 1)
        .await
        .expect("unregister");
    assert_eq!(
        offline_since(s, &on_both.id).await,
        Some(now + 1),
        "the dead pod's socket is gone"
    );

    let again = s
        .reap_dead_pods(AGES_AGO + 1, now)
        .await
        .expect("reap again");
    assert!(!again.contains(&dead));

    // A heartbeat keeps a pod out of reach of a later cutoff.
    let beating = new_id("pod");
    s.pod_heartbeat(&beating, AGES_AGO)
        .await
        .expect("heartbeat");
    s.pod_heartbeat(&beating, AGES_AGO + 10)
        .await
        .expect("heartbeat");
    assert!(
        !s.reap_dead_pods(AGES_AGO + 5, now)
            .await
            .expect("reap")
            .contains(&beating)
    );
    assert!(
        s.reap_dead_pods(AGES_AGO + 11, now)
            .await
            .expect("reap")
            .contains(&beating)
    );
}

pub async fn expired_connectors(s: &dyn Store) {
    let t = tenant(s).await;
    let old = connector_with(s, &t.id, Some(AGES_AGO)).await;
    let at_cutoff = connector_with(s, &t.id, Some(AGES_AGO + 100)).await;
    let online = connector_with(s, &t.id, None).await;
    let recent = connector_with(s, &t.id, Some(now_ms())).await;

    let expired = s
        .expired_connectors(AGES_AGO + 100)
        .await
        .expect("expired connectors");
    assert!(expired.contains(&old));
    for c in [&at_cutoff, &online, &recent] {
        assert!(
            !expired.iter().any(|e| e.id == c.id),
            "{} is not expired",
            c.id
        );
    }
}

pub async fn offline_clocks_restart_only_when_all_pods_are_gone(s: &dyn Store) {
    // Other behaviours keep pods alive in this shared store, so "no live pod" is simulated
    // with a cutoff in the future of every heartbeat.
    let c = connector(s).await;
    let pod = live_pod(s).await;
    let sock = socket(s, &c.id, &pod).await;
    let now = now_ms();
    s.unregister_socket(&sock, now - HOUR)
        .await
        .expect("unregister");
    assert_eq!(offline_since(s, &c.id).await, Some(now - HOUR));
    assert_eq!(
        s.restart_offline_clocks(now, now - HOUR)
            .await
            .expect("live pods"),
        0
    );
    assert_eq!(
        offline_since(s, &c.id).await,
        Some(now - HOUR),
        "a live pod keeps the clock"
    );
    let later = now + 10 * HOUR;
    assert!(
        s.restart_offline_clocks(later, later)
            .await
            .expect("no live pod")
            >= 1
    );
    assert_eq!(
        offline_since(s, &c.id).await,
        Some(later),
        "the clock restarts at start-up"
    );
    // Put it back in the past so other sweeps sharing this store are not disturbed.
    s.register_socket(&SocketRecord {
        id: new_id("sock"),
        connector_id: c.id.clone(),
        pod_id: pod.clone(),
        opened_at: now,
    })
    .await
    .expect("register");
}

pub async fn delete_connector_cascades(s: &dyn Store) {
    let c = connector(s).await;
    let ch1 = channel_of(s, &c).await;
    let ch2 = channel_of(s, &c).await;
    let keep = channel_of(s, &connector_with(s, &c.tenant_id, None).await).await;
    let pod = live_pod(s).await;
    let sock = socket(s, &c.id, &pod).await;

    let now = now_ms();
    let auth = auth_rec(&ch1.id, AuthStatus::Pending, now + HOUR);
    s.insert_auth_session(&auth)
        .await
        .expect("insert auth session");
    let (m, _) = enqueue(s, &ch1.id, 10).await;
    let (kept_msg, _) = enqueue(s, &keep.id, 10).await;
    let claim = claim_rec(&ch1.id, "k1", "fp", now, now + HOUR);
    assert_eq!(s.claim(&claim).await.expect("claim"), Claim::New);
    let f1 = file_rec(&ch1, now + HOUR);
    let f2 = file_rec(&ch2, now + HOUR);
    let kept_file = file_rec(&keep, now + HOUR);
    for f in [&f1, &f2, &kept_file] {
        s.insert_file(f).await.expect("insert file");
    }

    // Online (a socket is registered): the janitor's delete does nothing.
    assert_eq!(
        s.delete_connector(&c.id, now + HOUR)
            .await
            .expect("delete online"),
        None
    );
    assert!(s.get_channel(&ch1.id).await.expect("get").is_some());
    s.unregister_socket(&sock, now).await.expect("unregister");
    // Offline, but not before the cutoff: kept.
    assert_eq!(
        s.delete_connector(&c.id, now).await.expect("delete recent"),
        None
    );
    let cascade = s
        .delete_connector(&c.id, now + 1)
        .await
        .expect("delete connector")
        .expect("offline connector deleted");
    assert_eq!(
        sorted(&cascade.channels, |c| c.id.clone()),
        sorted(&[ch1.clone(), ch2.clone()], |c| c.id.clone())
    );
    assert_eq!(
        sorted(&cascade.files, |f| f.file_ref.clone()),
        sorted(&[f1.clone(), f2.clone()], |f| f.file_ref.clone())
    );

    assert_eq!(s.get_connector(&c.id).await.expect("get"), None);
    assert_eq!(
        s.connector_for(&c.tenant_id, &c.card_id)
            .await
            .expect("connector_for"),
        None
    );
    assert!(s.list_channels(&c.id).await.expect("list").is_empty());
    assert_eq!(s.get_channel(&ch1.id).await.expect("get"), None);
    assert_eq!(s.get_auth_session(&auth.id).await.expect("get"), None);
    assert_eq!(s.get_file(&f1.file_ref).await.expect("get"), None);
    assert_eq!(s.get_file(&f2.file_ref).await.expect("get"), None);
    assert_eq!(s.count_pending(&ch1.id).await.expect("count"), 0);

    // Brought back under the same ids, nothing of the old state shows through.
    s.insert_connector(&c).await.expect("reinsert connector");
    s.insert_channel(&ch1).await.expect("reinsert channel");
    assert_eq!(
        s.enqueue_outbox(&m, 10, now + HOUR)
            .await
            .expect("enqueue")
            .label(),
        "stored",
        "seen-records went"
    );
    assert_eq!(
        s.claim(&claim).await.expect("claim"),
        Claim::New,
        "claims went"
    );
    s.register_socket(&SocketRecord {
        id: sock.clone(),
        connector_id: c.id.clone(),
        pod_id: pod.clone(),
        opened_at: now,
    })
    .await
    .expect("register");
    s.unregister_socket(&sock, now + 7)
        .await
        .expect("unregister");
    assert_eq!(
        offline_since(s, &c.id).await,
        Some(now + 7),
        "a fresh socket row, not the old one"
    );

    // Another connector_id's state is untouched.
    assert_eq!(
        s.get_channel(&keep.id).await.expect("get"),
        Some(keep.clone())
    );
    assert_eq!(
        s.get_file(&kept_file.file_ref).await.expect("get"),
        Some(kept_file)
    );
    assert_eq!(
        pending_ids(s, &keep.id, now).await,
        vec![kept_msg.message_id]
    );

    assert_eq!(
        s.delete_connector(&new_id("conn"), now + HOUR)
            .await
            .expect("delete unknown"),
        None
    );
}

// -- channels ------------------------------------------------------------------------------------

pub async fn channels_insert_get_list(s: &dyn Store) {
    let c = connector(s).await;
    let mut bound = channel_rec(&c, now_ms());
    bound.binding = Some(vec![0, 1, 2, 255]);
    bound.binding_key = Some(new_id("bk"));
    bound.status = ConnectionStatus::Connected;
    bound.route_socket = Some(new_id("sock"));
    bound.profiles = vec!["xagent.im.v2".to_owned(), "xagent.device.v1".to_owned()];
    s.insert_channel(&bound).await.expect("insert");
    let plain = channel_of(s, &c).await;

    assert_eq!(
        s.get_channel(&bound.id).await.expect("get"),
        Some(bound.clone())
    );
    assert_eq!(
        s.get_channel(&new_id("cch")).await.expect("get unknown"),
        None
    );
    let listed = s.list_channels(&c.id).await.expect("list");
    assert_eq!(
        sorted(&listed, |c| c.id.clone()),
        sorted(&[bound.clone(), plain], |c| c.id.clone())
    );

    let err = s
        .insert_channel(&bound)
        .await
        .expect_err("duplicate channel id");
    assert_eq!(err.kind, ErrorKind::Conflict);
}

pub async fn channel_routes(s: &dyn Store) {
    let ch = channel(s).await;
    let (a, b) = (new_id("sock"), new_id("sock"));
    let t = ch.updated_at;
    let profiles = vec!["xagent.im.v1".to_owned(), "xagent.im.v2".to_owned()];

    s.set_channel_route(&ch.id, Some(&a), &profiles, t + 1)
        .await
        .expect("route");
    let want = ChannelRecord {
        route_socket: Some(a.clone()),
        profiles: profiles.clone(),
        updated_at: t + 1,
        ..ch.clone()
    };
    assert_eq!(
        s.get_channel(&ch.id).await.expect("get"),
        Some(want.clone())
    );

    s.clear_channel_route_if(&ch.id, &b, t + 2)
        .await
        .expect("clear for another socket");
    assert_eq!(
        s.get_channel(&ch.id).await.expect("get"),
        Some(want.clone()),
        "routed elsewhere: untouched"
    );

    s.clear_channel_route_if(&ch.id, &a, t + 3)
        .await
        .expect("clear");
    let cleared = ChannelRecord {
        route_socket: None,
        updated_at: t + 3,
        ..want
    };
    assert_eq!(s.get_channel(&ch.id).await.expect("get"), Some(cleared));

    s.set_channel_route(&ch.id, Some(&b), &[], t + 4)
        .await
        .expect("route");
    s.set_channel_route(&ch.id, None, &profiles, t + 5)
        .await
        .expect("close");
    let got = s.get_channel(&ch.id).await.expect("get").expect("channel");
    assert_eq!(
        (got.route_socket, got.profiles, got.updated_at),
        (None, profiles, t + 5)
    );
}

pub async fn channel_binding_and_status(s: &dyn Store) {
    let mut ch = channel(s).await;
    ch.route_socket = Some(new_id("sock"));
    s.set_channel_route(
        &ch.id,
        ch.route_socket.as_deref(),
        &ch.profiles,
        ch.updated_at,
    )
    .await
    .expect("route");
    let t = ch.updated_at;
    let key = new_id("bk");

    let view = json!({"display": "bot @acme", "chat": "team"});
    s.set_channel_binding(
        &ch.id,
        Some(b"ciphertext"),
        Some(&key),
        ConnectionStatus::Connected,
        &view,
        t + 1,
    )
    .await
    .expect("bind");
    let bound = ChannelRecord {
        binding: Some(b"ciphertext".to_vec()),
        binding_key: Some(key.clone()),
        status: ConnectionStatus::Connected,
        view: view.clone(),
        updated_at: t + 1,
        ..ch.clone()
    };
    assert_eq!(
        s.get_channel(&ch.id).await.expect("get"),
        Some(bound.clone())
    );

    let degraded_view = json!({"display": "bot @acme", "warning": "rate limited"});
    s.set_channel_status(&ch.id, ConnectionStatus::Degraded, &degraded_view, t + 2)
        .await
        .expect("status");
    let degraded = ChannelRecord {
        status: ConnectionStatus::Degraded,
        view: degraded_view,
        updated_at: t + 2,
        ..bound
    };
    assert_eq!(
        s.get_channel(&ch.id).await.expect("get"),
        Some(degraded.clone()),
        "the binding is kept"
    );

    let revoked_view = json!({});
    s.set_channel_binding(
        &ch.id,
        None,
        None,
        ConnectionStatus::Revoked,
        &revoked_view,
        t + 3,
    )
    .await
    .expect("unbind");
    let unbound = ChannelRecord {
        binding: None,
        binding_key: None,
        status: ConnectionStatus::Revoked,
        view: revoked_view,
        updated_at: t + 3,
        ..degraded
    };
    assert_eq!(s.get_channel(&ch.id).await.expect("get"), Some(unbound));
}

pub async fn find_channel_by_binding_key(s: &dyn Store) {
    let c = connector(s).await;
    let key = new_id("bk");
    let view = json!({});
    let bound = channel_of(s, &c).await;
    s.set_channel_binding(
        &bound.id,
        Some(b"x"),
        Some(&key),
        ConnectionStatus::Connected,
        &view,
        now_ms(),
    )
    .await
    .expect("bind");
    // Unbound but still carrying a key: not a binding.
    let unbound_key = new_id("bk");
    let half = channel_of(s, &c).await;
    s.set_channel_binding(
        &half.id,
        None,
        Some(&unbound_key),
        ConnectionStatus::Created,
        &view,
        now_ms(),
    )
    .await
    .expect("set key only");
    // The same key at another tenant's connector_id for the same Card.
    let other_tenant = tenant(s).await;
    let theirs_conn = ConnectorRecord {
        id: new_id("conn"),
        tenant_id: other_tenant.id.clone(),
        ..c.clone()
    };
    s.insert_connector(&theirs_conn)
        .await
        .expect("insert connector");
    let theirs = channel_of(s, &theirs_conn).await;
    s.set_channel_binding(
        &theirs.id,
        Some(b"y"),
        Some(&key),
        ConnectionStatus::Connected,
        &view,
        now_ms(),
    )
    .await
    .expect("bind");

    let found = s
        .find_channel_by_binding_key(&c.tenant_id, &c.card_id, &key)
        .await
        .expect("find");
    assert_eq!(found.map(|c| c.id), Some(bound.id));
    let found = s
        .find_channel_by_binding_key(&other_tenant.id, &c.card_id, &key)
        .await
        .expect("find");
    assert_eq!(found.map(|c| c.id), Some(theirs.id));
    assert_eq!(
        s.find_channel_by_binding_key(&c.tenant_id, &new_id("card"), &key)
            .await
            .expect("other card"),
        None
    );
    assert_eq!(
        s.find_channel_by_binding_key(&c.tenant_id, &c.card_id, &unbound_key)
            .await
            .expect("unbound"),
        None
    );
    assert_eq!(
        s.find_channel_by_binding_key(&c.tenant_id, &c.card_id, &new_id("bk"))
            .await
            .expect("unknown"),
        None
    );
}

pub async fn bound_channels(s: &dyn Store) {
    let c = connector(s).await;
    let view = json!({});
    let mine = channel_of(s, &c).await;
    s.set_channel_binding(
        &mine.id,
        Some(b"x"),
        Some(&new_id("bk")),
        ConnectionStatus::Connected,
        &view,
        now_ms(),
    )
    .await
    .expect("bind");
    channel_of(s, &c).await;
    let other_tenant = tenant(s).await;
    let theirs_conn = ConnectorRecord {
        id: new_id("conn"),
        tenant_id: other_tenant.id,
        ..c.clone()
    };
    s.insert_connector(&theirs_conn)
        .await
        .expect("insert connector");
    let theirs = channel_of(s, &theirs_conn).await;
    s.set_channel_binding(
        &theirs.id,
        Some(b"y"),
        None,
        ConnectionStatus::Offline,
        &view,
        now_ms(),
    )
    .await
    .expect("bind");
    let other_card = channel(s).await;
    s.set_channel_binding(
        &other_card.id,
        Some(b"z"),
        None,
        ConnectionStatus::Connected,
        &view,
        now_ms(),
    )
    .await
    .expect("bind");

    let got = s.bound_channels(&c.card_id).await.expect("bound channels");
    let mut ids: Vec<String> = got.into_iter().map(|c| c.id).collect();
    ids.sort();
    assert_eq!(
        ids,
        sorted(&[mine.id, theirs.id], |id| id.clone()),
        "bound channels of the Card across tenants"
    );
}

pub async fn stale_unbound_channels(s: &dyn Store) {
    let c = connector(s).await;
    let insert = |ch: ChannelRecord| async move {
        s.insert_channel(&ch).await.expect("insert channel");
        ch
    };
    let stale = insert(channel_rec(&c, AGES_AGO)).await;
    let routed = insert(ChannelRecord {
        route_socket: Some(new_id("sock")),
        ..channel_rec(&c, AGES_AGO)
    })
    .await;
    let bound = insert(ChannelRecord {
        binding: Some(b"x".to_vec()),
        status: ConnectionStatus::Connected,
        ..channel_rec(&c, AGES_AGO)
    })
    .await;
    let at_cutoff = insert(channel_rec(&c, AGES_AGO + 100)).await;
    let fresh = channel_of(s, &c).await;

    let found = s
        .stale_unbound_channels(AGES_AGO + 100)
        .await
        .expect("stale unbound");
    assert!(found.contains(&stale));
    for ch in [&routed, &bound, &at_cutoff, &fresh] {
        assert!(
            !found.iter().any(|f| f.id == ch.id),
            "{} is not stale garbage",
            ch.id
        );
    }
}

pub async fn delete_channel_cascades(s: &dyn Store) {
    let c = connector(s).await;
    let ch = channel_of(s, &c).await;
    let keep = channel_of(s, &c).await;
    let now = now_ms();
    let auth = auth_rec(&ch.id, AuthStatus::Scanned, now + HOUR);
    s.insert_auth_session(&auth)
        .await
        .expect("insert auth session");
    let (m, _) = enqueue(s, &ch.id, 10).await;
    let (kept_msg, _) = enqueue(s, &keep.id, 10).await;
    let claim = claim_rec(&ch.id, "k", "fp", now, now + HOUR);
    s.claim(&claim).await.expect("claim");
    let (f1, f2, kept_file) = (
        file_rec(&ch, now + HOUR),
        file_rec(&ch, now + 2 * HOUR),
        file_rec(&keep, now + HOUR),
    );
    for f in [&f1, &f2, &kept_file] {
        s.insert_file(f).await.expect("insert file");
    }

    let files = s.delete_channel(&ch.id).await.expect("delete channel");
    assert_eq!(
        sorted(&files, |f| f.file_ref.clone()),
        sorted(&[f1.clone(), f2.clone()], |f| f.file_ref.clone())
    );
    assert_eq!(s.get_channel(&ch.id).await.expect("get"), None);
    assert!(
        !s.list_channels(&c.id)
            .await
            .expect("list")
            .iter()
            .any(|x| x.id == ch.id)
    );
    assert_eq!(s.get_auth_session(&auth.id).await.expect("get"), None);
    assert_eq!(s.get_file(&f1.file_ref).await.expect("get"), None);
    assert_eq!(s.count_pending(&ch.id).await.expect("count"), 0);

    s.insert_channel(&ch).await.expect("reinsert channel");
    assert_eq!(
        s.enqueue_outbox(&m, 10, now + HOUR)
            .await
            .expect("enqueue")
            .label(),
        "stored",
        "seen-records went"
    );
    assert_eq!(
        s.claim(&claim).await.expect("claim"),
        Claim::New,
        "claims went"
    );

    assert_eq!(
        s.get_channel(&keep.id).await.expect("get"),
        Some(keep.clone())
    );
    assert_eq!(
        s.get_file(&kept_file.file_ref).await.expect("get"),
        Some(kept_file)
    );
    assert_eq!(
        pending_ids(s, &keep.id, now).await,
        vec![kept_msg.message_id]
    );

    assert!(
        s.delete_channel(&new_id("cch"))
            .await
            .expect("delete unknown")
            .is_empty()
    );
}

// -- auth sessions -------------------------------------------------------------------------------

/// A step is written only while the session is unfinished: once it ended (canceled on
/// another pod, say), a late step changes nothing.
pub async fn auth_session_steps_only_while_open(s: &dyn Store) {
    let ch = channel(s).await;
    let exp = now_ms() + HOUR;
    let rec = auth_rec(&ch.id, AuthStatus::Pending, exp);
    s.insert_auth_session(&rec).await.expect("insert");
    let scanned = AuthSessionRecord {
        status: AuthStatus::Scanned,
        public: serde_json::json!({"message": "scanned"}),
        ..rec.clone()
    };
    assert!(s.update_open_auth_session(&scanned).await.expect("update"));
    assert_eq!(
        s.get_auth_session(&rec.id).await.expect("get"),
        Some(scanned.clone())
    );
    let canceled = AuthSessionRecord {
        status: AuthStatus::Canceled,
        state: None,
        ..scanned.clone()
    };
    assert!(s.update_open_auth_session(&canceled).await.expect("cancel"));
    let late = AuthSessionRecord {
        status: AuthStatus::Authenticated,
        ..scanned
    };
    assert!(!s.update_open_auth_session(&late).await.expect("late step"));
    assert_eq!(
        s.get_auth_session(&rec.id).await.expect("get"),
        Some(canceled)
    );
    let unknown = auth_rec(&ch.id, AuthStatus::Pending, exp);
    assert!(!s.update_open_auth_session(&unknown).await.expect("unknown"));
}

pub async fn auth_sessions(s: &dyn Store) {
    let ch = channel(s).await;
    let other = channel(s).await;
    let exp = now_ms() + HOUR;
    let open: Vec<AuthSessionRecord> = [
        AuthStatus::Pending,
        AuthStatus::Scanned,
        AuthStatus::QrRefreshRequired,
    ]
    .into_iter()
    .map(|st| auth_rec(&ch.id, st, exp))
    .collect();
    let closed: Vec<AuthSessionRecord> = [
        AuthStatus::Authenticated,
        AuthStatus::Expired,
        AuthStatus::Failed,
        AuthStatus::Canceled,
    ]
    .into_iter()
    .map(|st| auth_rec(&ch.id, st, exp))
    .collect();
    for a in open.iter().chain(&closed) {
        s.insert_auth_session(a).await.expect("insert auth session");
    }
    s.insert_auth_session(&auth_rec(&other.id, AuthStatus::Pending, exp))
        .await
        .expect("insert");
    let no_state = AuthSessionRecord {
        state: None,
        ..auth_rec(&other.id, AuthStatus::Expired, exp)
    };
    s.insert_auth_session(&no_state).await.expect("insert");

    assert_eq!(
        s.get_auth_session(&open[0].id).await.expect("get"),
        Some(open[0].clone())
    );
    assert_eq!(
        s.get_auth_session(&no_state.id).await.expect("get"),
        Some(no_state)
    );
    assert_eq!(
        s.get_auth_session(&new_id("auth"))
            .await
            .expect("get unknown"),
        None
    );
    let got = s.open_auth_sessions(&ch.id).await.expect("open");
    assert_eq!(
        sorted(&got, |a| a.id.clone()),
        sorted(&open, |a| a.id.clone())
    );

    let updated = AuthSessionRecord {
        status: AuthStatus::Authenticated,
        state: None,
        public: json!({"message": "done"}),
        expires_at: exp + 5,
        ..open[0].clone()
    };
    s.update_auth_session(&updated).await.expect("update");
    assert_eq!(
        s.get_auth_session(&updated.id).await.expect("get"),
        Some(updated.clone())
    );
    let got = s.open_auth_sessions(&ch.id).await.expect("open");
    assert_eq!(
        sorted(&got, |a| a.id.clone()),
        sorted(&open[1..], |a| a.id.clone())
    );

    let err = s
        .insert_auth_session(&updated)
        .await
        .expect_err("duplicate auth session id");
    assert_eq!(err.kind, ErrorKind::Conflict);
}

pub async fn purge_auth_sessions(s: &dyn Store) {
    let ch = channel(s).await;
    let old = auth_rec(&ch.id, AuthStatus::Pending, AGES_AGO);
    let at_cutoff = auth_rec(&ch.id, AuthStatus::Failed, AGES_AGO + 100);
    let live = auth_rec(&ch.id, AuthStatus::Pending, now_ms() + HOUR);
    for a in [&old, &at_cutoff, &live] {
        s.insert_auth_session(a).await.expect("insert auth session");
    }
    assert!(s.purge_auth_sessions(AGES_AGO + 100).await.expect("purge") >= 1);
    assert_eq!(s.get_auth_session(&old.id).await.expect("get"), None);
    assert_eq!(
        s.get_auth_session(&at_cutoff.id).await.expect("get"),
        Some(at_cutoff)
    );
    assert_eq!(s.get_auth_session(&live.id).await.expect("get"), Some(live));
}

// -- outbox --------------------------------------------------------------------------------------

pub async fn enqueue_dedupes(s: &dyn Store) {
    let ch = channel(s).await;
    let now = now_ms();
    let m = message(&ch.id, now, now + HOUR);
    let seen_until = now + 2 * HOUR;
    assert_eq!(
        s.enqueue_outbox(&m, 10, seen_until)
            .await
            .expect("enqueue")
            .label(),
        "stored"
    );

    let stored = s.pending_outbox(&ch.id, 0, now, 10).await.expect("pending");
    assert_eq!(stored.len(), 1);
    assert!(stored[0].seq > 0, "the store assigns seq");
    assert_eq!(
        stored[0],
        OutboxRecord {
            seq: stored[0].seq,
            ..m.clone()
        }
    );

    let again = OutboxRecord {
        payload: json!({"other": true}),
        created_at: now + 1,
        ..m.clone()
    };
    assert_eq!(
        s.enqueue_outbox(&again, 10, seen_until)
            .await
            .expect("enqueue"),
        EnqueueOutcome::Duplicate
    );
    assert_eq!(s.count_pending(&ch.id).await.expect("count"), 1);

    assert!(s.ack_outbox(&ch.id, &m.message_id).await.expect("ack"));
    let after_ack = OutboxRecord {
        created_at: now + 10,
        ..m.clone()
    };
    assert_eq!(
        s.enqueue_outbox(&after_ack, 10, seen_until)
            .await
            .expect("enqueue"),
        EnqueueOutcome::Duplicate,
        "the seen-record outlives the acked message"
    );
    let after_window = OutboxRecord {
        created_at: seen_until,
        expires_at: seen_until + HOUR,
        ..m.clone()
    };
    assert_eq!(
        s.enqueue_outbox(&after_window, 10, seen_until + 2 * HOUR)
            .await
            .expect("enqueue")
            .label(),
        "stored",
        "past the dedupe window the id is new again"
    );

    // A dedupe window shorter than the message's life: the outbox row itself still dedupes.
    let short = message(&ch.id, now, now + HOUR);
    assert_eq!(
        s.enqueue_outbox(&short, 10, now + 1)
            .await
            .expect("enqueue")
            .label(),
        "stored"
    );
    let later = OutboxRecord {
        created_at: now + 5,
        ..short.clone()
    };
    assert_eq!(
        s.enqueue_outbox(&later, 10, now + HOUR)
            .await
            .expect("enqueue"),
        EnqueueOutcome::Duplicate
    );

    // The same message id in another channel is another message.
    let elsewhere = channel(s).await;
    let there = OutboxRecord {
        channel_id: elsewhere.id.clone(),
        ..m.clone()
    };
    assert_eq!(
        s.enqueue_outbox(&there, 10, seen_until)
            .await
            .expect("enqueue")
            .label(),
        "stored"
    );
}

pub async fn enqueue_respects_cap(s: &dyn Store) {
    let ch = channel(s).await;
    let (m1, o1) = enqueue(s, &ch.id, 2).await;
    let (m2, o2) = enqueue(s, &ch.id, 2).await;
    let (m3, o3) = enqueue(s, &ch.id, 2).await;
    assert_eq!(
        (o1.label(), o2.label(), o3),
        ("stored", "stored", EnqueueOutcome::Full)
    );
    assert_eq!(s.count_pending(&ch.id).await.expect("count"), 2);

    // Refused when full leaves no seen-record behind: the retry is accepted once there is room.
    assert!(s.ack_outbox(&ch.id, &m1.message_id).await.expect("ack"));
    assert_eq!(
        s.enqueue_outbox(&m3, 2, m3.created_at + HOUR)
            .await
            .expect("enqueue")
            .label(),
        "stored"
    );
    assert_eq!(enqueue(s, &ch.id, 2).await.1, EnqueueOutcome::Full);

    // Failed messages do not hold capacity.
    assert!(
        s.fail_outbox(&ch.id, &m2.message_id, "rejected")
            .await
            .expect("fail")
    );
    assert_eq!(s.count_pending(&ch.id).await.expect("count"), 1);
    assert_eq!(enqueue(s, &ch.id, 2).await.1.label(), "stored");

    // Neither do expired ones waiting for the purge.
    let other = channel(s).await;
    let now = now_ms();
    let short = message(&other.id, now, now + 10);
    assert_eq!(
        s.enqueue_outbox(&short, 1, now + 10)
            .await
            .expect("enqueue")
            .label(),
        "stored"
    );
    let next = message(&other.id, now + 10, now + HOUR);
    assert_eq!(
        s.enqueue_outbox(&next, 1, now + HOUR)
            .await
            .expect("enqueue")
            .label(),
        "stored"
    );
}

pub async fn outbox_backlog(s: &dyn Store) {
    let ch = channel(s).await;
    let now = now_ms();
    let (before, _) = s.outbox_backlog(now, u64::MAX).await.expect("backlog");
    let mut ids = Vec::new();
    for i in 0..4 {
        let m = message(&ch.id, now - 60_000 + i, now + HOUR);
        assert_eq!(
            s.enqueue_outbox(&m, 100, now + HOUR)
                .await
                .expect("enqueue")
                .label(),
            "stored"
        );
        ids.push(m.message_id);
    }
    // Expired messages waiting for the purge are not backlog.
    let gone = message(&ch.id, now - 2 * HOUR, now - HOUR);
    s.enqueue_outbox(&gone, 100, now + HOUR)
        .await
        .expect("enqueue");
    let (n, oldest) = s.outbox_backlog(now, u64::MAX).await.expect("backlog");
    assert!(n >= before + 4, "{n} pending after 4 more than {before}");
    let oldest = oldest.expect("an oldest pending message");
    // The store is shared with the other cases, whose pending rows may be older by seq:
    // the oldest pending message is the first one waiting, never one from the future.
    assert!(
        oldest <= now,
        "the oldest pending message was created by now"
    );
    assert_eq!(
        s.outbox_backlog(now, 2).await.expect("capped").0,
        2,
        "counted up to the cap"
    );
    assert!(s.ack_outbox(&ch.id, &ids[0]).await.expect("ack"));
    assert!(
        s.fail_outbox(&ch.id, &ids[1], "rejected")
            .await
            .expect("fail")
    );
    let (after, _) = s.outbox_backlog(now, u64::MAX).await.expect("backlog");
    assert!(
        after <= n - 2,
        "acked and failed messages leave the backlog"
    );
}

pub async fn pending_outbox_order_and_filters(s: &dyn Store) {
    let ch = channel(s).await;
    let other = channel(s).await;
    let now = now_ms();
    let mut msgs = Vec::new();
    for i in 0..5 {
        let m = message(&ch.id, now + i, now + HOUR);
        assert_eq!(
            s.enqueue_outbox(&m, 100, now + HOUR)
                .await
                .expect("enqueue")
                .label(),
            "stored"
        );
        enqueue(s, &other.id, 100).await;
        msgs.push(m.message_id);
    }
    let all = s
        .pending_outbox(&ch.id, 0, now, 100)
        .await
        .expect("pending");
    assert_eq!(
        all.iter().map(|r| r.message_id.clone()).collect::<Vec<_>>(),
        msgs,
        "oldest first, own channel only"
    );
    assert!(all.windows(2).all(|w| w[0].seq < w[1].seq), "seq increases");

    let after = s
        .pending_outbox(&ch.id, all[1].seq, now, 100)
        .await
        .expect("pending after");
    assert_eq!(
        after
            .iter()
            .map(|r| r.message_id.clone())
            .collect::<Vec<_>>(),
        msgs[2..].to_vec()
    );
    let first_two = s
        .pending_outbox(&ch.id, 0, now, 2)
        .await
        .expect("pending limited");
    assert_eq!(
        first_two
            .iter()
            .map(|r| r.message_id.clone())
            .collect::<Vec<_>>(),
        msgs[..2].to_vec()
    );

    assert!(
        s.fail_outbox(&ch.id, &msgs[2], "undeliverable")
            .await
            .expect("fail")
    );
    let ids = pending_ids(s, &ch.id, now).await;
    assert!(!ids.contains(&msgs[2]), "failed messages are not pending");

    let short = message(&ch.id, now, now + 50);
    assert_eq!(
        s.enqueue_outbox(&short, 100, now + 50)
            .await
            .expect("enqueue")
            .label(),
        "stored"
    );
    assert!(
        pending_ids(s, &ch.id, now + 49)
            .await
            .contains(&short.message_id)
    );
    assert!(
        !pending_ids(s, &ch.id, now + 50)
            .await
            .contains(&short.message_id),
        "expired at expires_at"
    );
    assert_eq!(s.count_pending(&ch.id).await.expect("count"), 5);
}

pub async fn ack_fail_and_attempts(s: &dyn Store) {
    let ch = channel(s).await;
    let (m, _) = enqueue(s, &ch.id, 10).await;
    let now = m.created_at;
    let ch_id = ch.id.as_str();
    let get = |id: String| async move {
        let recs = s.pending_outbox(ch_id, 0, now, 100).await.expect("pending");
        recs.into_iter().find(|r| r.message_id == id)
    };

    s.record_attempt(&ch.id, &m.message_id, Some("timeout"))
        .await
        .expect("attempt");
    let r = get(m.message_id.clone()).await.expect("pending");
    assert_eq!((r.attempts, r.last_error.as_deref()), (1, Some("timeout")));
    s.record_attempt(&ch.id, &m.message_id, None)
        .await
        .expect("attempt");
    let r = get(m.message_id.clone()).await.expect("pending");
    assert_eq!((r.attempts, r.last_error.as_deref()), (2, None));
    s.record_attempt(&ch.id, &new_id("msg"), Some("x"))
        .await
        .expect("attempt on unknown message");

    assert!(
        s.fail_outbox(&ch.id, &m.message_id, "rejected")
            .await
            .expect("fail")
    );
    assert!(
        !s.fail_outbox(&ch.id, &m.message_id, "again")
            .await
            .expect("fail twice"),
        "no longer pending"
    );
    assert_eq!(get(m.message_id.clone()).await, None);
    assert_eq!(s.count_pending(&ch.id).await.expect("count"), 0);
    assert!(
        s.ack_outbox(&ch.id, &m.message_id)
            .await
            .expect("ack a failed message")
    );

    let (m2, _) = enqueue(s, &ch.id, 10).await;
    assert!(s.ack_outbox(&ch.id, &m2.message_id).await.expect("ack"));
    assert!(
        !s.ack_outbox(&ch.id, &m2.message_id)
            .await
            .expect("ack twice")
    );
    assert_eq!(get(m2.message_id.clone()).await, None);
    assert!(
        !s.fail_outbox(&ch.id, &m2.message_id, "gone")
            .await
            .expect("fail acked")
    );
    assert!(
        !s.ack_outbox(&new_id("cch"), &m2.message_id)
            .await
            .expect("ack unknown channel")
    );
}

pub async fn purge_outbox(s: &dyn Store) {
    let ch = channel(s).await;
    let old = message(&ch.id, AGES_AGO - 100, AGES_AGO);
    let old_failed = message(&ch.id, AGES_AGO - 100, AGES_AGO + 50);
    let at_cutoff_later = message(&ch.id, AGES_AGO - 100, AGES_AGO + 101);
    let live = message(&ch.id, now_ms(), now_ms() + HOUR);
    for m in [&old, &old_failed, &at_cutoff_later] {
        assert_eq!(
            s.enqueue_outbox(m, 10, m.expires_at)
                .await
                .expect("enqueue")
                .label(),
            "stored"
        );
    }
    assert_eq!(
        s.enqueue_outbox(&live, 10, live.expires_at + HOUR)
            .await
            .expect("enqueue")
            .label(),
        "stored"
    );
    assert!(
        s.fail_outbox(&ch.id, &old_failed.message_id, "rejected")
            .await
            .expect("fail")
    );

    assert!(s.purge_outbox(AGES_AGO + 100).await.expect("purge") >= 2);
    let left = pending_ids(s, &ch.id, 0).await;
    assert_eq!(
        sorted(&left, |id| id.clone()),
        sorted(
            &[at_cutoff_later.message_id.clone(), live.message_id.clone()],
            |id| id.clone()
        )
    );
    assert!(
        !s.ack_outbox(&ch.id, &old_failed.message_id)
            .await
            .expect("ack"),
        "the failed message was purged"
    );

    // The seen-record went with it (it would still say Duplicate at its creation time)...
    assert_eq!(
        s.enqueue_outbox(&old, 10, old.expires_at)
            .await
            .expect("enqueue")
            .label(),
        "stored"
    );
    // ...while a live one stays after its message is acked.
    assert!(s.ack_outbox(&ch.id, &live.message_id).await.expect("ack"));
    let retry = OutboxRecord {
        created_at: live.created_at + 1,
        ..live.clone()
    };
    assert_eq!(
        s.enqueue_outbox(&retry, 10, live.expires_at)
            .await
            .expect("enqueue"),
        EnqueueOutcome::Duplicate
    );
}

// -- idempotency ---------------------------------------------------------------------------------

pub async fn claims(s: &dyn Store) {
    let ch = channel(s).await;
    let now = now_ms();
    let first = claim_rec(&ch.id, &new_id("k"), "fp-1", now, now + HOUR);
    assert_eq!(s.claim(&first).await.expect("claim"), Claim::New);

    let retry = IdempotencyRecord {
        fingerprint: "fp-2".to_owned(),
        created_at: now + 1,
        ..first.clone()
    };
    assert_eq!(
        s.claim(&retry).await.expect("claim"),
        Claim::Existing(first.clone()),
        "the stored claim wins"
    );

    let outcome = json!({"status": "ok", "result": {"sent": 1}});
    s.finish_claim("msg", &ch.id, &first.key, &outcome)
        .await
        .expect("finish");
    let done = IdempotencyRecord {
        state: ClaimState::Done,
        outcome: Some(outcome),
        ..first.clone()
    };
    assert_eq!(
        s.claim(&retry).await.expect("claim"),
        Claim::Existing(done.clone())
    );

    s.release_claim("msg", &ch.id, &first.key)
        .await
        .expect("release");
    assert_eq!(
        s.claim(&retry).await.expect("claim"),
        Claim::Existing(done),
        "a finished claim is not released"
    );

    let second = claim_rec(&ch.id, &new_id("k"), "fp", now, now + HOUR);
    assert_eq!(s.claim(&second).await.expect("claim"), Claim::New);
    s.release_claim("msg", &ch.id, &second.key)
        .await
        .expect("release");
    assert_eq!(
        s.claim(&second).await.expect("claim"),
        Claim::New,
        "released: the retry runs"
    );
    s.release_claim("msg", &ch.id, &new_id("k"))
        .await
        .expect("release unknown");

    let tool = IdempotencyRecord {
        scope: "tool".to_owned(),
        ..first.clone()
    };
    assert_eq!(
        s.claim(&tool).await.expect("claim"),
        Claim::New,
        "scopes are separate"
    );
    let other = channel(s).await;
    let there = IdempotencyRecord {
        channel_id: other.id.clone(),
        ..first.clone()
    };
    assert_eq!(
        s.claim(&there).await.expect("claim"),
        Claim::New,
        "channels are separate"
    );
}

pub async fn expired_claims_are_replaced(s: &dyn Store) {
    let ch = channel(s).await;
    let now = now_ms();
    let old = claim_rec(&ch.id, &new_id("k"), "old", now, now + 10);
    assert_eq!(s.claim(&old).await.expect("claim"), Claim::New);
    s.finish_claim("msg", &ch.id, &old.key, &json!({"old": true}))
        .await
        .expect("finish");

    let before_expiry = IdempotencyRecord {
        fingerprint: "new".to_owned(),
        created_at: now + 9,
        ..old.clone()
    };
    assert!(matches!(
        s.claim(&before_expiry).await.expect("claim"),
        Claim::Existing(_)
    ));

    let fresh = IdempotencyRecord {
        fingerprint: "new".to_owned(),
        created_at: now + 10,
        expires_at: now + HOUR,
        ..old.clone()
    };
    assert_eq!(
        s.claim(&fresh).await.expect("claim"),
        Claim::New,
        "expired at expires_at"
    );
    let probe = IdempotencyRecord {
        created_at: now + 11,
        ..fresh.clone()
    };
    assert_eq!(
        s.claim(&probe).await.expect("claim"),
        Claim::Existing(fresh),
        "the new claim replaced the old"
    );
}

pub async fn purge_claims(s: &dyn Store) {
    let ch = channel(s).await;
    let old = claim_rec(&ch.id, &new_id("k"), "fp", AGES_AGO - 100, AGES_AGO);
    let at_cutoff_later = claim_rec(&ch.id, &new_id("k"), "fp", AGES_AGO - 100, AGES_AGO + 101);
    for c in [&old, &at_cutoff_later] {
        assert_eq!(s.claim(c).await.expect("claim"), Claim::New);
    }
    assert!(s.purge_claims(AGES_AGO + 100).await.expect("purge") >= 1);
    // Probing at the original creation time: a surviving claim would still be unexpired.
    assert_eq!(s.claim(&old).await.expect("claim"), Claim::New, "purged");
    assert_eq!(
        s.claim(&at_cutoff_later).await.expect("claim"),
        Claim::Existing(at_cutoff_later.clone())
    );
}

// -- files ---------------------------------------------------------------------------------------

pub async fn files(s: &dyn Store) {
    let ch = channel(s).await;
    let f = FileRecord {
        direction: FileDirection::Outbound,
        byte_size: 5_000_000_000,
        ..file_rec(&ch, now_ms() + HOUR)
    };
    s.insert_file(&f).await.expect("insert file");
    assert_eq!(s.get_file(&f.file_ref).await.expect("get"), Some(f.clone()));
    assert_eq!(
        s.get_file(&new_id("fref")).await.expect("get unknown"),
        None
    );
    let err = s.insert_file(&f).await.expect_err("duplicate file_ref");
    assert_eq!(err.kind, ErrorKind::Conflict);

    s.delete_file(&f.file_ref).await.expect("delete");
    assert_eq!(s.get_file(&f.file_ref).await.expect("get"), None);
    s.delete_file(&f.file_ref)
        .await
        .expect("deleting a missing file is fine");
}

pub async fn expired_files(s: &dyn Store) {
    let ch = channel(s).await;
    let old = file_rec(&ch, AGES_AGO);
    let at_cutoff = file_rec(&ch, AGES_AGO + 100);
    let later = file_rec(&ch, AGES_AGO + 101);
    let live = file_rec(&ch, now_ms() + HOUR);
    for f in [&old, &at_cutoff, &later, &live] {
        s.insert_file(f).await.expect("insert file");
    }
    let expired = s
        .expired_files(AGES_AGO + 100, 1000)
        .await
        .expect("expired files");
    assert!(expired.contains(&old));
    assert!(expired.contains(&at_cutoff), "expired at expires_at");
    assert!(
        !expired
            .iter()
            .any(|f| f.file_ref == later.file_ref || f.file_ref == live.file_ref)
    );
    assert!(
        expired
            .windows(2)
            .all(|w| w[0].expires_at <= w[1].expires_at),
        "oldest first"
    );
    assert_eq!(
        s.expired_files(AGES_AGO + 100, 1)
            .await
            .expect("limited")
            .len(),
        1
    );
    for f in [&old, &at_cutoff, &later, &live] {
        s.delete_file(&f.file_ref).await.expect("cleanup");
    }
}

// -- leases --------------------------------------------------------------------------------------

pub async fn leases(s: &dyn Store) {
    let name = new_id("lease");
    let t = now_ms();
    assert_eq!(s.get_lease(&name).await.expect("get"), None);

    let a1 = s.acquire_lease(&name, "a", 1000, t).await.expect("acquire");
    let want = Lease {
        name: name.clone(),
        holder: "a".to_owned(),
        generation: 1,
        expires_at: t + 1000,
    };
    assert_eq!(a1, Some(want.clone()));
    assert_eq!(s.get_lease(&name).await.expect("get"), Some(want.clone()));

    let renewed = s
        .acquire_lease(&name, "a", 1000, t + 100)
        .await
        .expect("renew");
    let want = Lease {
        expires_at: t + 1100,
        ..want
    };
    assert_eq!(renewed, Some(want.clone()), "renewal keeps the generation");

    assert_eq!(
        s.acquire_lease(&name, "b", 1000, t + 200)
            .await
            .expect("contend"),
        None
    );
    assert_eq!(
        s.get_lease(&name).await.expect("get"),
        Some(want.clone()),
        "a failed acquire changes nothing"
    );

    let b = s
        .acquire_lease(&name, "b", 1000, t + 1100)
        .await
        .expect("take over");
    let want_b = Lease {
        name: name.clone(),
        holder: "b".to_owned(),
        generation: 2,
        expires_at: t + 2100,
    };
    assert_eq!(
        b,
        Some(want_b.clone()),
        "expired at expires_at: another holder takes it with a new generation"
    );
    assert_eq!(
        s.acquire_lease(&name, "a", 1000, t + 1200)
            .await
            .expect("old holder"),
        None
    );
}

pub async fn lease_release(s: &dyn Store) {
    let name = new_id("lease");
    let t = now_ms();
    let a = s
        .acquire_lease(&name, "a", 60_000, t)
        .await
        .expect("acquire")
        .expect("free lease");

    s.release_lease(&name, "b")
        .await
        .expect("release by a non-holder");
    assert_eq!(
        s.get_lease(&name).await.expect("get"),
        Some(a.clone()),
        "a non-holder cannot release"
    );
    assert_eq!(
        s.acquire_lease(&name, "b", 60_000, t + 1)
            .await
            .expect("contend"),
        None
    );

    s.release_lease(&name, "a").await.expect("release");
    let b = s
        .acquire_lease(&name, "b", 60_000, t + 2)
        .await
        .expect("acquire after release");
    let b = b.expect("a released lease is free at once");
    assert_eq!(
        (b.holder.as_str(), b.generation),
        ("b", a.generation + 1),
        "fencing survives a release"
    );

    s.release_lease(&new_id("lease"), "a")
        .await
        .expect("release unknown");
}

pub async fn lease_is_atomic(store: &Arc<dyn Store>) {
    let name = new_id("lease");
    let now = now_ms();
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            let name = name.clone();
            tokio::spawn(async move {
                store
                    .acquire_lease(&name, &format!("holder-{i}"), 60_000, now)
                    .await
            })
        })
        .collect();
    let mut winners = Vec::new();
    for t in tasks {
        if let Some(lease) = t.await.expect("task").expect("acquire") {
            winners.push(lease);
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "exactly one concurrent acquirer wins: {winners:?}"
    );
    assert_eq!(winners[0].generation, 1);
    assert_eq!(
        store.get_lease(&name).await.expect("get"),
        Some(winners[0].clone())
    );
}

// -- kv ------------------------------------------------------------------------------------------

pub async fn kv(s: &dyn Store) {
    let ns = new_id("ns");
    assert_eq!(s.kv_get(&ns, "cursor").await.expect("get"), None);
    s.kv_put(&ns, "cursor", "1").await.expect("put");
    assert_eq!(
        s.kv_get(&ns, "cursor").await.expect("get"),
        Some("1".to_owned())
    );
    s.kv_put(&ns, "cursor", "2").await.expect("overwrite");
    assert_eq!(
        s.kv_get(&ns, "cursor").await.expect("get"),
        Some("2".to_owned())
    );
    assert_eq!(
        s.kv_get(&new_id("ns"), "cursor")
            .await
            .expect("other namespace"),
        None
    );
    assert_eq!(s.kv_get(&ns, "other").await.expect("other key"), None);
}

// -- concurrency ---------------------------------------------------------------------------------

/// Runs `n` copies of `f` on separate tasks at once and returns their results in task order.
async fn concurrently<T, F, Fut>(store: &Arc<dyn Store>, n: usize, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(Arc<dyn Store>, usize) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    let tasks: Vec<_> = (0..n).map(|i| tokio::spawn(f(store.clone(), i))).collect();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.expect("task"));
    }
    out
}

/// An insert within a tenant quota counts and inserts in one step: eight at once never pass
/// the quota (count-then-insert would let several see room for one).
pub async fn quota_inserts_are_atomic(store: &Arc<dyn Store>) {
    let s = &**store;
    let c = Arc::new(connector(s).await);
    let t = c.tenant_id.clone();
    let kinds = |v: Vec<Result<(), ErrorKind>>| {
        let ok = v.iter().filter(|r| r.is_ok()).count();
        assert!(
            v.iter()
                .all(|r| matches!(r, Ok(()) | Err(ErrorKind::LimitExceeded))),
            "{v:?}"
        );
        ok
    };

    let inserted = concurrently(store, 8, |st, _| {
        let c = c.clone();
        async move {
            st.insert_channel_within(&channel_rec(&c, now_ms()), 3)
                .await
                .map_err(|e| e.kind)
        }
    })
    .await;
    assert_eq!(kinds(inserted), 3, "channels within a quota of 3");
    assert_eq!(s.count_tenant_channels(&t, 100).await.expect("count"), 3);
    s.insert_channel_within(&channel_rec(&c, now_ms()), 0)
        .await
        .expect("0 is no limit");

    let pod = Arc::new(live_pod(s).await);
    let tid = Arc::new(t.clone());
    let registered = concurrently(store, 8, |st, _| {
        let (c, pod, tid) = (c.clone(), pod.clone(), tid.clone());
        async move {
            let rec = SocketRecord {
                id: new_id("sock"),
                connector_id: c.id.clone(),
                pod_id: (*pod).clone(),
                opened_at: now_ms(),
            };
            st.register_socket_within(&rec, &tid, 2)
                .await
                .map_err(|e| e.kind)
        }
    })
    .await;
    assert_eq!(kinds(registered), 2, "sockets within a quota of 2");
    assert_eq!(s.count_tenant_sockets(&t, 100).await.expect("count"), 2);

    let ch = Arc::new(channel_of(s, &c).await);
    let stored = concurrently(store, 8, |st, _| {
        let ch = ch.clone();
        async move {
            let f = FileRecord {
                byte_size: 100,
                ..file_rec(&ch, now_ms() + HOUR)
            };
            st.insert_file_within(&f, 350).await.map_err(|e| e.kind)
        }
    })
    .await;
    assert_eq!(kinds(stored), 3, "100-byte files within 350 bytes");
    assert_eq!(s.tenant_stored_bytes(&t).await.expect("bytes"), 300);
    // A file must fit whole: 60 more would pass 350, 50 do not.
    let err = s
        .insert_file_within(
            &FileRecord {
                byte_size: 60,
                ..file_rec(&ch, now_ms() + HOUR)
            },
            350,
        )
        .await
        .expect_err("over the quota with it");
    assert_eq!(err.kind, ErrorKind::LimitExceeded, "{err}");
    s.insert_file_within(
        &FileRecord {
            byte_size: 50,
            ..file_rec(&ch, now_ms() + HOUR)
        },
        350,
    )
    .await
    .expect("fits exactly");
}

/// "Was it the last socket?" must see every concurrent change, or a connector_id without
/// sockets stays online forever (never deregistered) or one with a socket goes offline.
pub async fn last_socket_race(store: &Arc<dyn Store>) {
    let s = &**store;
    let pod = live_pod(s).await;
    for _ in 0..3 {
        let c = connector(s).await;
        let mut sockets = Vec::new();
        for _ in 0..8 {
            sockets.push(socket(s, &c.id, &pod).await);
        }
        let sockets = Arc::new(sockets);
        let now = now_ms();
        concurrently(store, 8, |st, i| {
            let sockets = sockets.clone();
            async move {
                st.unregister_socket(&sockets[i], now)
                    .await
                    .expect("unregister")
            }
        })
        .await;
        assert_eq!(
            offline_since(s, &c.id).await,
            Some(now),
            "all sockets went at once"
        );
    }

    for _ in 0..3 {
        let c = connector(s).await;
        let mut sockets = Vec::new();
        for _ in 0..4 {
            sockets.push(socket(s, &c.id, &pod).await);
        }
        let (sockets, pod, conn) = (Arc::new(sockets), pod.clone(), c.id.clone());
        let now = now_ms();
        concurrently(store, 5, |st, i| {
            let (sockets, pod, conn) = (sockets.clone(), pod.clone(), conn.clone());
            async move {
                if i < 4 {
                    st.unregister_socket(&sockets[i], now)
                        .await
                        .expect("unregister");
                } else {
                    let rec = SocketRecord {
                        id: new_id("sock"),
                        connector_id: conn,
                        pod_id: pod,
                        opened_at: now,
                    };
                    st.register_socket(&rec).await.expect("register");
                }
            }
        })
        .await;
        assert_eq!(
            offline_since(s, &c.id).await,
            None,
            "a hello during the closes keeps it online"
        );
    }
}

pub async fn enqueue_is_atomic(store: &Arc<dyn Store>) {
    let s = &**store;
    let ch = channel(s).await;
    let now = now_ms();
    let m = Arc::new(message(&ch.id, now, now + HOUR));
    let outcomes = concurrently(store, 8, |st, _| {
        let m = m.clone();
        async move {
            st.enqueue_outbox(&m, 100, now + HOUR)
                .await
                .expect("enqueue")
        }
    })
    .await;
    let stored = outcomes.iter().filter(|o| o.is_stored()).count();
    assert_eq!(stored, 1, "one copy of a message is stored: {outcomes:?}");
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, EnqueueOutcome::Stored { .. } | EnqueueOutcome::Duplicate))
    );

    let ch = channel(s).await;
    let ch_id = Arc::new(ch.id.clone());
    let outcomes = concurrently(store, 8, |st, _| {
        let ch_id = ch_id.clone();
        async move {
            st.enqueue_outbox(&message(&ch_id, now, now + HOUR), 3, now + HOUR)
                .await
                .expect("enqueue")
        }
    })
    .await;
    let stored = outcomes.iter().filter(|o| o.is_stored()).count();
    assert_eq!(stored, 3, "the cap holds under concurrency: {outcomes:?}");
    assert_eq!(s.count_pending(&ch.id).await.expect("count"), 3);
    let recs = s
        .pending_outbox(&ch.id, 0, now, 100)
        .await
        .expect("pending");
    assert!(recs.windows(2).all(|w| w[0].seq < w[1].seq));
}

pub async fn claim_is_atomic(store: &Arc<dyn Store>) {
    let s = &**store;
    let ch = channel(s).await;
    let now = now_ms();
    let key = new_id("k");
    let (ch_id, key) = (Arc::new(ch.id.clone()), Arc::new(key));
    let claims = concurrently(store, 8, |st, i| {
        let (ch_id, key) = (ch_id.clone(), key.clone());
        async move {
            let rec = claim_rec(&ch_id, &key, &format!("fp-{i}"), now, now + HOUR);
            st.claim(&rec).await.expect("claim")
        }
    })
    .await;
    let winners = claims.iter().filter(|c| **c == Claim::New).count();
    assert_eq!(
        winners, 1,
        "one concurrent claimant owns the work: {claims:?}"
    );
}

/// `m` for a batch, with a two-hour dedupe window.
pub fn item(m: OutboxRecord, cap: u32) -> Enqueue {
    let dedupe_until = m.created_at + 2 * HOUR;
    Enqueue {
        record: m,
        cap,
        dedupe_until,
    }
}

/// A batch follows the single-message rules item by item, in one transaction.
pub async fn enqueue_batch_rules(s: &dyn Store) {
    let ch = channel(s).await;
    let full = channel(s).await;
    let now = now_ms();
    let (old, old_at) = enqueue(s, &ch.id, 100).await;
    let (_, full_at) = enqueue(s, &full.id, 100).await;
    let a = message(&ch.id, now, now + HOUR);
    let b = message(&ch.id, now, now + HOUR);
    let f1 = message(&full.id, now, now + HOUR);
    let f2 = message(&full.id, now, now + HOUR);
    let missing = message("cch_missing", now, now + HOUR);
    let out = s
        .enqueue_outbox_batch(&[
            item(a.clone(), 100),
            item(old.clone(), 100),
            item(missing, 100),
            item(f1.clone(), 2),
            item(b.clone(), 100),
            item(a.clone(), 100),
            item(f2, 2),
        ])
        .await
        .expect("enqueue batch");
    let labels: Vec<&str> = out.iter().map(EnqueueOutcome::label).collect();
    assert_eq!(
        labels,
        [
            "stored",
            "duplicate",
            "unknown_channel",
            "stored",
            "stored",
            "duplicate",
            "full"
        ]
    );
    // Each stored message is placed after the one stored before it in its channel.
    let place = |o: &EnqueueOutcome| match *o {
        EnqueueOutcome::Stored { seq, prev } => (seq, prev),
        other => panic!("not stored: {other:?}"),
    };
    let ((old_seq, _), (full_seq, _)) = (place(&old_at), place(&full_at));
    let (a_seq, a_prev) = place(&out[0]);
    let (f1_seq, f1_prev) = place(&out[3]);
    let (b_seq, b_prev) = place(&out[4]);
    assert_eq!((a_prev, f1_prev, b_prev), (old_seq, full_seq, a_seq));
    assert!(
        old_seq < a_seq && a_seq < b_seq && full_seq < f1_seq,
        "{out:?}"
    );
    assert_eq!(
        pending_ids(s, &ch.id, now).await,
        [
            old.message_id.clone(),
            a.message_id.clone(),
            b.message_id.clone()
        ],
        "batch rows follow the batch order"
    );
    assert_eq!(s.count_pending(&full.id).await.expect("count"), 2);
    // The seen-record is written: after the ack the message is still a duplicate.
    assert!(s.ack_outbox(&ch.id, &a.message_id).await.expect("ack"));
    let again = s
        .enqueue_outbox_batch(&[item(a.clone(), 100)])
        .await
        .expect("enqueue batch");
    assert_eq!(again, [EnqueueOutcome::Duplicate]);
    assert_eq!(s.enqueue_outbox_batch(&[]).await.expect("empty"), []);
    // The channel's highest seq counts in any state: after a failed message comes the next.
    let ended = channel(s).await;
    let (last, last_at) = enqueue(s, &ended.id, 100).await;
    assert!(
        s.fail_outbox(&ended.id, &last.message_id, "rejected")
            .await
            .expect("fail")
    );
    let next = s
        .enqueue_outbox_batch(&[item(message(&ended.id, now, now + HOUR), 100)])
        .await
        .expect("enqueue batch");
    assert_eq!(
        place(&next[0]).1,
        place(&last_at).0,
        "placed after the failed one"
    );
}

/// Concurrent batches on the same channels: each message stored once, the cap holds, and
/// seq order within a channel is commit order.
pub async fn enqueue_batch_is_atomic(store: &Arc<dyn Store>) {
    let s = &**store;
    let a = channel(s).await;
    let b = channel(s).await;
    let now = now_ms();
    let shared: Arc<Vec<OutboxRecord>> =
        Arc::new((0..20).map(|_| message(&a.id, now, now + HOUR)).collect());
    let b_id = Arc::new(b.id.clone());
    let outcomes = concurrently(store, 6, |st, i| {
        let shared = shared.clone();
        let b_id = b_id.clone();
        async move {
            // Every task sends the same 20 messages to A (in a rotated order) and 5 new ones
            // to B, whose cap is 12.
            let mut items: Vec<Enqueue> = shared
                .iter()
                .cycle()
                .skip(i * 3)
                .take(shared.len())
                .map(|m| item(m.clone(), 100))
                .collect();
            items.extend((0..5).map(|_| item(message(&b_id, now, now + HOUR), 12)));
            st.enqueue_outbox_batch(&items)
                .await
                .expect("enqueue batch")
        }
    })
    .await;
    let all: Vec<EnqueueOutcome> = outcomes.into_iter().flatten().collect();
    let stored = all.iter().filter(|o| o.is_stored()).count();
    assert_eq!(stored, 20 + 12, "each shared message once, B up to its cap");
    assert_eq!(s.count_pending(&a.id).await.expect("count"), 20);
    assert_eq!(s.count_pending(&b.id).await.expect("count"), 12);
    for ch in [&a.id, &b.id] {
        let recs = s.pending_outbox(ch, 0, now, 100).await.expect("pending");
        assert!(recs.windows(2).all(|w| w[0].seq < w[1].seq));
    }
}

pub async fn ack_batch(s: &dyn Store) {
    let a = channel(s).await;
    let b = channel(s).await;
    let (m1, _) = enqueue(s, &a.id, 100).await;
    let (m2, _) = enqueue(s, &a.id, 100).await;
    let (m3, _) = enqueue(s, &b.id, 100).await;
    let gone = s
        .ack_outbox_batch(&[
            (a.id.clone(), m1.message_id.clone()),
            (b.id.clone(), m3.message_id.clone()),
            // Another channel's message id: nothing.
            (b.id.clone(), m2.message_id.clone()),
            (a.id.clone(), "msg_unknown".into()),
        ])
        .await
        .expect("ack batch");
    assert_eq!(gone, 2);
    let now = now_ms();
    assert_eq!(
        pending_ids(s, &a.id, now).await,
        std::slice::from_ref(&m2.message_id)
    );
    assert!(pending_ids(s, &b.id, now).await.is_empty());
    assert_eq!(s.ack_outbox_batch(&[]).await.expect("empty"), 0);
}

/// Acks as a cursor (issue 26, item 2): a channel's acked position moves up only, in one
/// statement for many channels; pending reads, counts, the backlog, the sweep's states and
/// the cap skip what it covers; failed rows are not covered; the purge removes the covered
/// rows in bulk and nothing else.
pub async fn ack_cursor(s: &dyn Store) {
    let a = channel(s).await;
    let b = channel(s).await;
    let (n1, _) = enqueue(s, &b.id, 100).await;
    let mut at = Vec::new();
    let mut ms = Vec::new();
    for _ in 0..4 {
        let (m, o) = enqueue(s, &a.id, 100).await;
        match o {
            EnqueueOutcome::Stored { seq, .. } => at.push(seq),
            other => panic!("not stored: {other:?}"),
        }
        ms.push(m);
    }
    assert!(
        s.fail_outbox(&a.id, &ms[1].message_id, "no")
            .await
            .expect("fail")
    );
    s.advance_outbox(&[
        (a.id.clone(), at[2]),
        ("cch_missing".into(), 99),
        (b.id.clone(), 0),
    ])
    .await
    .expect("advance");
    let now = now_ms();
    assert_eq!(
        pending_ids(s, &a.id, now).await,
        std::slice::from_ref(&ms[3].message_id)
    );
    assert_eq!(
        pending_ids(s, &b.id, now).await,
        std::slice::from_ref(&n1.message_id)
    );
    assert_eq!(s.count_pending(&a.id).await.expect("count"), 1);
    assert_eq!(s.outbox_backlog(now, 100).await.expect("backlog").0, 2);
    let states = s
        .route_states(std::slice::from_ref(&a.id), now)
        .await
        .expect("states");
    assert_eq!(states[0].max_pending_seq, Some(at[3]));
    // Never back.
    s.advance_outbox(&[(a.id.clone(), at[0])])
        .await
        .expect("advance");
    assert_eq!(s.count_pending(&a.id).await.expect("count"), 1);
    // Covered rows do not hold the channel's capacity.
    assert_eq!(enqueue(s, &a.id, 2).await.1.label(), "stored");
    assert_eq!(enqueue(s, &a.id, 2).await.1, EnqueueOutcome::Full);
    assert_eq!(s.overview(1000).await.expect("overview").outbox, 6);

    // The purge removes m1 and m3 (covered); the failed m2, m4, m5 and n1 stay.
    assert_eq!(s.purge_acked_outbox().await.expect("purge"), 2);
    assert_eq!(s.purge_acked_outbox().await.expect("purge"), 0);
    assert_eq!(s.overview(1000).await.expect("overview").outbox, 4);
    assert_eq!(s.overview(1000).await.expect("overview").outbox_failed, 1);
    // An acked message is still a duplicate after its row went.
    assert_eq!(
        s.enqueue_outbox(&ms[0], 100, now + HOUR)
            .await
            .expect("enqueue"),
        EnqueueOutcome::Duplicate
    );
    // The position goes with its channel.
    s.delete_channel(&a.id).await.expect("delete");
    s.advance_outbox(&[(a.id.clone(), 1)])
        .await
        .expect("a deleted channel is skipped");
}

/// The purge of acked rows walks the outbox in windows (2000 seqs on the SQL stores): every
/// covered row goes, however many windows they span, and nothing else does.
pub async fn purge_in_windows(s: &dyn Store) {
    let a = channel(s).await;
    let b = channel(s).await;
    let now = now_ms();
    let items: Vec<Enqueue> = (0..4500)
        .map(|i| {
            item(
                message(if i % 3 == 0 { &b.id } else { &a.id }, now, now + HOUR),
                10_000,
            )
        })
        .collect();
    let out = s.enqueue_outbox_batch(&items).await.expect("enqueue");
    let seqs: Vec<i64> = out
        .iter()
        .map(|o| match *o {
            EnqueueOutcome::Stored { seq, .. } => seq,
            other => panic!("not stored: {other:?}"),
        })
        .collect();
    // a: the first 2000 of its 3000 acked, one of them failed; b: none acked.
    let a_items: Vec<(usize, &Enqueue)> = items
        .iter()
        .enumerate()
        .filter(|(_, it)| it.record.channel_id == a.id)
        .collect();
    let (at, _) = a_items[1999];
    let failed = &a_items[10].1.record.message_id;
    assert!(s.fail_outbox(&a.id, failed, "no").await.expect("fail"));
    s.advance_outbox(&[(a.id.clone(), seqs[at])])
        .await
        .expect("advance");
    assert_eq!(s.purge_acked_outbox().await.expect("purge"), 1999);
    assert_eq!(s.purge_acked_outbox().await.expect("purge"), 0);
    assert_eq!(s.count_pending(&a.id).await.expect("count"), 1000);
    assert_eq!(s.count_pending(&b.id).await.expect("count"), 1500);
    let o = s.overview(1_000_000).await.expect("overview");
    assert_eq!((o.outbox, o.outbox_failed), (2501, 1));
}

pub async fn route_states(s: &dyn Store) {
    let c = connector(s).await;
    let idle = channel_of(s, &c).await;
    let busy = channel_of(s, &c).await;
    let now = now_ms();
    s.set_channel_route(&busy.id, Some("sock_x"), &[], now)
        .await
        .expect("route");
    let (_, _) = enqueue(s, &busy.id, 100).await;
    let (last, _) = enqueue(s, &busy.id, 100).await;
    let last_seq = s
        .pending_outbox(&busy.id, 0, now, 100)
        .await
        .expect("pending")
        .into_iter()
        .find(|r| r.message_id == last.message_id)
        .expect("stored")
        .seq;
    let mut states = s
        .route_states(
            &[idle.id.clone(), busy.id.clone(), "cch_missing".into()],
            now,
        )
        .await
        .expect("route states");
    states.sort_by(|x, y| x.channel_id.cmp(&y.channel_id));
    let mut expected = vec![
        RouteState {
            channel_id: idle.id.clone(),
            route_socket: None,
            max_pending_seq: None,
        },
        RouteState {
            channel_id: busy.id.clone(),
            route_socket: Some("sock_x".into()),
            max_pending_seq: Some(last_seq),
        },
    ];
    expected.sort_by(|x, y| x.channel_id.cmp(&y.channel_id));
    assert_eq!(states, expected);
    // Expired messages do not count as pending.
    let later = now + 2 * HOUR;
    let states = s
        .route_states(std::slice::from_ref(&busy.id), later)
        .await
        .expect("route states");
    assert_eq!(states[0].max_pending_seq, None);
    assert!(s.route_states(&[], now).await.expect("empty").is_empty());
}

/// A batch of reopens: the channels of a list read at once (missing ids left out), and
/// routed to one socket with one write, touching no channel outside the list.
pub async fn channel_batches(s: &dyn Store) {
    let c = connector(s).await;
    let a = channel_of(s, &c).await;
    let b = channel_of(s, &c).await;
    let other = channel_of(s, &c).await;
    let now = now_ms();
    s.set_channel_route(&other.id, Some("sock_old"), &[], now)
        .await
        .expect("route");
    let mut got = s
        .get_channels(&[a.id.clone(), "cch_missing".into(), b.id.clone()])
        .await
        .expect("get channels");
    got.sort_by(|x, y| x.id.cmp(&y.id));
    let mut want = vec![a.clone(), b.clone()];
    want.sort_by(|x, y| x.id.cmp(&y.id));
    assert_eq!(got, want);
    assert!(s.get_channels(&[]).await.expect("empty").is_empty());

    let profiles = vec!["xagent.im.v2".to_owned()];
    // b has a pending message; a has none.
    let (m, _) = enqueue(s, &b.id, 100).await;
    let stored = s
        .pending_outbox(&b.id, 0, now, 100)
        .await
        .expect("pending")
        .into_iter()
        .find(|r| r.message_id == m.message_id)
        .expect("stored")
        .seq;
    let mut states = s
        .set_channel_routes(
            &[a.id.clone(), b.id.clone(), "cch_missing".into()],
            "sock_new",
            &profiles,
            now + 1,
        )
        .await
        .expect("set routes");
    states.sort_by(|x, y| x.channel_id.cmp(&y.channel_id));
    let mut want_states = vec![
        RouteState {
            channel_id: a.id.clone(),
            route_socket: Some("sock_new".into()),
            max_pending_seq: None,
        },
        RouteState {
            channel_id: b.id.clone(),
            route_socket: Some("sock_new".into()),
            max_pending_seq: Some(stored),
        },
    ];
    want_states.sort_by(|x, y| x.channel_id.cmp(&y.channel_id));
    assert_eq!(
        states, want_states,
        "the routed channels' states, as route_states"
    );
    for id in [&a.id, &b.id] {
        let ch = s.get_channel(id).await.expect("get").expect("exists");
        assert_eq!(ch.route_socket.as_deref(), Some("sock_new"));
        assert_eq!(ch.profiles, profiles);
        assert_eq!(ch.updated_at, now + 1);
    }
    let untouched = s
        .get_channel(&other.id)
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(untouched.route_socket.as_deref(), Some("sock_old"));
    assert!(
        s.set_channel_routes(&[], "sock_new", &profiles, now)
            .await
            .expect("an empty batch writes nothing")
            .is_empty()
    );

    // A closing socket clears its routes together: only those still pointing at it.
    s.set_channel_route(&b.id, Some("sock_other"), &profiles, now + 2)
        .await
        .expect("b moves");
    s.clear_channel_routes_if(
        &[a.id.clone(), b.id.clone(), "cch_missing".into()],
        "sock_new",
        now + 3,
    )
    .await
    .expect("clear routes");
    let a_now = s.get_channel(&a.id).await.expect("get").expect("exists");
    assert_eq!(
        (a_now.route_socket, a_now.updated_at),
        (None, now + 3),
        "cleared"
    );
    let b_now = s.get_channel(&b.id).await.expect("get").expect("exists");
    assert_eq!(
        (b_now.route_socket.as_deref(), b_now.updated_at),
        (Some("sock_other"), now + 2),
        "routed elsewhere: untouched"
    );
    s.clear_channel_routes_if(&[], "sock_new", now)
        .await
        .expect("an empty batch writes nothing");
}

/// A reconnecting socket's batch: the caller's channels are read as they were and routed to
/// it with their states; another owner's channel is read and left alone; unknown ids are
/// skipped.
pub async fn reopen_channels(s: &dyn Store) {
    let c = connector(s).await;
    let idle = channel_of(s, &c).await;
    let busy = channel_of(s, &c).await;
    let other_conn = connector_with(s, &c.tenant_id, None).await;
    let foreign = channel_of(s, &other_conn).await;
    let now = now_ms();
    s.set_channel_route(&busy.id, Some("sock_old"), &[], now)
        .await
        .expect("route");
    s.set_channel_route(&foreign.id, Some("sock_theirs"), &[], now)
        .await
        .expect("route");
    let (m, _) = enqueue(s, &busy.id, 100).await;
    let stored = s
        .pending_outbox(&busy.id, 0, now, 100)
        .await
        .expect("pending")
        .into_iter()
        .find(|r| r.message_id == m.message_id)
        .expect("stored")
        .seq;
    let before_busy = s.get_channel(&busy.id).await.expect("get").expect("busy");
    let before_foreign = s
        .get_channel(&foreign.id)
        .await
        .expect("get")
        .expect("foreign");
    let owner = ChannelOwner {
        tenant_id: &c.tenant_id,
        card_id: &c.card_id,
        connector_id: &c.id,
    };
    let profiles = vec!["xagent.im.v1".to_owned()];
    let mut got = s
        .reopen_channels(
            &[
                idle.id.clone(),
                "cch_missing".into(),
                busy.id.clone(),
                foreign.id.clone(),
            ],
            &owner,
            "sock_new",
            &profiles,
            now + 1,
        )
        .await
        .expect("reopen");
    got.sort_by(|x, y| x.channel.id.cmp(&y.channel.id));
    let mut want = vec![
        Reopened {
            channel: idle.clone(),
            moved: true,
            max_pending_seq: None,
        },
        Reopened {
            channel: before_busy,
            moved: true,
            max_pending_seq: Some(stored),
        },
        Reopened {
            channel: before_foreign.clone(),
            moved: false,
            max_pending_seq: None,
        },
    ];
    want.sort_by(|x, y| x.channel.id.cmp(&y.channel.id));
    assert_eq!(got, want, "as they were, and whether moved");
    for id in [&idle.id, &busy.id] {
        let ch = s.get_channel(id).await.expect("get").expect("exists");
        assert_eq!(
            (ch.route_socket.as_deref(), &ch.profiles, ch.updated_at),
            (Some("sock_new"), &profiles, now + 1),
            "routed here"
        );
    }
    assert_eq!(
        s.get_channel(&foreign.id).await.expect("get"),
        Some(before_foreign),
        "another owner's channel is untouched"
    );
    let wrong_card = ChannelOwner {
        card_id: "card_other",
        ..owner
    };
    let got = s
        .reopen_channels(
            std::slice::from_ref(&idle.id),
            &wrong_card,
            "sock_x",
            &profiles,
            now + 2,
        )
        .await
        .expect("reopen");
    assert_eq!(got.len(), 1);
    assert!(!got[0].moved, "the card must match too");
    assert!(
        s.reopen_channels(&[], &owner, "sock_new", &profiles, now)
            .await
            .expect("an empty batch")
            .is_empty()
    );
}

/// One SQL statement run as a pod of the previous build would run it: the first column of the
/// first row it returns, as text (`None` for none, or for a statement that returns no rows).
pub type OldBuild = dyn Fn(String) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<String>> + Send>>
    + Send
    + Sync;

/// Schema 9 keeps a channel's route in `channel_routes`, and build 8 writes it to the old
/// columns of `channels` (a rolling upgrade, a rollback). For the SQL stores: `s` comes
/// migrated to version 8 only (the case migrates it on), `old` runs SQL as a pod of build 8.
pub async fn routes_across_schema_8(s: &dyn Store, old: &OldBuild) {
    let t = AGES_AGO;
    let c = connector(s).await;
    let a = new_id("sock");
    let routed = ChannelRecord {
        route_socket: Some(a.clone()),
        ..channel_rec(&c, t)
    };
    let moving = channel_rec(&c, t);
    for ch in [&routed, &moving] {
        s.insert_channel(ch).await.expect("insert at schema 8");
    }
    s.migrate().await.expect("migrate to 9");
    for ch in [&routed, &moving] {
        assert_eq!(
            s.get_channel(&ch.id).await.expect("get"),
            Some(ch.clone()),
            "the upgrade keeps a route"
        );
    }
    let get = |id: String| async move { s.get_channel(&id).await.expect("get").expect("exists") };

    // Build 8 moves a route: build 9 reads it.
    let b = new_id("sock");
    old(format!(
        "UPDATE channels SET route_socket = '{b}', profiles = '[\"xagent.im.v1\"]', updated_at = {} WHERE id = '{}'",
        t + 1,
        moving.id
    ))
    .await;
    let got = get(moving.id.clone()).await;
    assert_eq!(
        (got.route_socket.as_deref(), got.profiles, got.updated_at),
        (Some(b.as_str()), vec!["xagent.im.v1".to_owned()], t + 1)
    );

    // Build 9 moves it on. Build 8 clears the route of its closing socket b, which it still
    // sees: the move stays.
    let n = new_id("sock");
    let v2 = vec!["xagent.im.v2".to_owned()];
    let states = s
        .set_channel_routes(std::slice::from_ref(&moving.id), &n, &v2, t + 2)
        .await
        .expect("move");
    assert_eq!(states.len(), 1);
    assert_eq!(states[0].route_socket.as_deref(), Some(n.as_str()));
    old(format!(
        "UPDATE channels SET route_socket = NULL, updated_at = {} WHERE id = '{}' AND route_socket = '{b}'",
        t + 3,
        moving.id
    ))
    .await;
    let got = get(moving.id.clone()).await;
    assert_eq!(
        (got.route_socket.as_deref(), &got.profiles),
        (Some(n.as_str()), &v2),
        "build 8 cannot undo a move it does not see"
    );

    // A route build 8 set and clears itself is cleared.
    let x = new_id("sock");
    old(format!(
        "UPDATE channels SET route_socket = '{x}', profiles = '[\"xagent.im.v2\"]', updated_at = {} WHERE id = '{}'",
        t + 4,
        moving.id
    ))
    .await;
    old(format!(
        "UPDATE channels SET route_socket = NULL, updated_at = {} WHERE id = '{}' AND route_socket = '{x}'",
        t + 5,
        moving.id
    ))
    .await;
    let got = get(moving.id.clone()).await;
    assert_eq!((got.route_socket, got.updated_at), (None, t + 5));

    // Its old column is now empty and it is unbound: a janitor of build 8 would take it for
    // stale once routed only in channel_routes. Routing it fills the old column too, and the
    // route keeps what build 9 wrote.
    let m = new_id("sock");
    s.set_channel_routes(std::slice::from_ref(&moving.id), &m, &v2, t + 6)
        .await
        .expect("route");
    assert_eq!(
        old(format!(
            "SELECT route_socket FROM channels WHERE id = '{}'",
            moving.id
        ))
        .await
        .as_deref(),
        Some(m.as_str())
    );
    let got = get(moving.id.clone()).await;
    assert_eq!(
        (got.route_socket.as_deref(), &got.profiles, got.updated_at),
        (Some(m.as_str()), &v2, t + 6)
    );
    let stale = s.stale_unbound_channels(t + 100).await.expect("stale");
    assert!(!stale.iter().any(|f| f.id == moving.id), "routed");
    // Build 9 clears the route in channel_routes only; the janitor goes by that.
    s.clear_channel_routes_if(std::slice::from_ref(&moving.id), &m, t + 7)
        .await
        .expect("clear");
    let stale = s.stale_unbound_channels(t + 100).await.expect("stale");
    assert!(
        stale.iter().any(|f| f.id == moving.id),
        "unrouted and stale"
    );
    assert!(
        !stale.iter().any(|f| f.id == routed.id),
        "routed at schema 8"
    );

    // A channel build 8 inserts has its route.
    let id = new_id("cch");
    let y = new_id("sock");
    old(format!(
        "INSERT INTO channels (id, tenant_id, connector_id, card_id, route_socket, profiles, status, view, \
         binding, binding_key, created_at, updated_at) VALUES ('{id}', '{}', '{}', '{}', '{y}', \
         '[\"xagent.im.v2\"]', '{}', '{{}}', NULL, NULL, {t}, {t})",
        c.tenant_id,
        c.id,
        c.card_id,
        ConnectionStatus::Created.as_str()
    ))
    .await;
    let got = get(id.clone()).await;
    assert_eq!(got.route_socket.as_deref(), Some(y.as_str()));
    let states = s.route_states(&[id], now_ms()).await.expect("states");
    assert_eq!(states.len(), 1);
    assert_eq!(states[0].route_socket.as_deref(), Some(y.as_str()));
}

// -- operator console pages ----------------------------------------------------------------------

/// Keyset pages walk rows after the cursor in id order; rows of other behaviours share the
/// store, so each check starts at a cursor just before this test's own ids.
pub async fn console_pages(s: &dyn Store) {
    let p = new_id("cons");
    let mut tenants = Vec::new();
    for i in 0..5 {
        let t = Tenant {
            id: format!("{p}-{i:02}"),
            name: new_id("name"),
            created_at: now_ms(),
        };
        s.create_tenant(&t).await.expect("create tenant");
        tenants.push(t);
    }
    let first = s.page_tenants(Some(&p), 2).await.expect("page");
    assert_eq!(first, tenants[..2].to_vec());
    let second = s.page_tenants(Some(&first[1].id), 2).await.expect("page");
    assert_eq!(second, tenants[2..4].to_vec());
    let third = s.page_tenants(Some(&second[1].id), 2).await.expect("page");
    assert_eq!(third[0], tenants[4]);
    assert!(
        s.page_tenants(None, 3).await.expect("page").len() <= 3,
        "the limit holds"
    );

    // Keys: no hash, and last use recorded at most once a minute.
    let t = &tenants[0];
    let key = ApiKeyRecord {
        id: new_id("key"),
        tenant_id: t.id.clone(),
        secret_hash: "ab".repeat(32),
        created_at: 10,
        revoked_at: None,
    };
    s.insert_api_key(&key).await.expect("insert key");
    let listed = s.tenant_keys(&t.id).await.expect("keys");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].last_used_at, None);
    s.touch_api_key(&key.id, 1_000_000).await.expect("touch");
    s.touch_api_key(&key.id, 1_030_000).await.expect("touch");
    assert_eq!(
        s.tenant_keys(&t.id).await.expect("keys")[0].last_used_at,
        Some(1_000_000),
        "a second use within a minute is not written"
    );
    s.touch_api_key(&key.id, 1_070_000).await.expect("touch");
    s.revoke_api_key(&key.id, 1_080_000).await.expect("revoke");
    let k = &s.tenant_keys(&t.id).await.expect("keys")[0];
    assert_eq!(
        (k.last_used_at, k.revoked_at, k.created_at),
        (Some(1_070_000), Some(1_080_000), 10)
    );
    s.touch_api_key("key_unknown", 1)
        .await
        .expect("unknown key: nothing to do");

    // Connectors in id order.
    let cp = new_id("conp");
    let mut conns = Vec::new();
    for i in 0..3 {
        let c = ConnectorRecord {
            id: format!("{cp}-{i}"),
            tenant_id: t.id.clone(),
            card_id: format!("card-{i}"),
            created_at: now_ms(),
            offline_since: (i == 1).then_some(5),
        };
        s.insert_connector(&c).await.expect("insert connector");
        conns.push(c);
    }
    assert_eq!(
        s.page_connectors(Some(&cp), 2).await.expect("page"),
        conns[..2]
    );
    assert_eq!(
        s.page_connectors(Some(&conns[1].id), 1)
            .await
            .expect("page"),
        conns[2..]
    );

    let o = s.overview(1_000_000).await.expect("overview");
    assert!(
        o.tenants >= 5 && o.connectors >= 3 && o.connectors_offline >= 1,
        "{o:?}"
    );
    let capped = s.overview(2).await.expect("overview");
    assert_eq!(
        (capped.tenants, capped.connectors),
        (2, 2),
        "counts stop at the cap"
    );
}

pub async fn console_channels_and_failures(s: &dyn Store) {
    let c = connector(s).await;
    let p = new_id("cchp");
    let mut ids = Vec::new();
    for i in 0..4 {
        let mut ch = channel_rec(&c, now_ms());
        ch.id = format!("{p}-{i}");
        if i % 2 == 1 {
            ch.binding = Some(vec![1, 2, 3]);
            ch.binding_key = Some(new_id("bk"));
            ch.status = ConnectionStatus::Connected;
            ch.view = json!({"display_name": "Support", "account_hint": "@bot"});
        }
        s.insert_channel(&ch).await.expect("insert channel");
        ids.push(ch.id);
    }
    // Channel 1: two pending (the older first), one failed; channel 3: one retried with an error.
    let now = now_ms();
    let m1 = message(&ids[1], now - 5_000, now + HOUR);
    let m2 = message(&ids[1], now - 1_000, now + HOUR);
    let m3 = message(&ids[1], now, now + HOUR);
    let m4 = message(&ids[3], now, now + HOUR);
    for m in [&m1, &m2, &m3, &m4] {
        assert_eq!(
            s.enqueue_outbox(m, 100, now + 2 * HOUR)
                .await
                .expect("enqueue")
                .label(),
            "stored"
        );
    }
    assert!(
        s.fail_outbox(&ids[1], &m3.message_id, "rejected: 403 forbidden")
            .await
            .expect("fail")
    );
    s.record_attempt(&ids[3], &m4.message_id, Some("timeout"))
        .await
        .expect("attempt");

    let page = s.page_channels(Some(&p), false, 3).await.expect("page");
    assert_eq!(
        page.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        [ids[0].as_str(), ids[1].as_str(), ids[2].as_str()]
    );
    let one = &page[1];
    assert!(one.bound && !one.routed && !page[0].bound);
    assert_eq!((one.pending, one.failed), (2, 1));
    assert_eq!(one.oldest_pending_at, Some(now - 5_000));
    assert_eq!(one.status, ConnectionStatus::Connected);
    assert_eq!(one.view["account_hint"], "@bot");
    assert_eq!((page[0].pending, page[0].oldest_pending_at), (0, None));
    let rest = s
        .page_channels(Some(&ids[2]), false, 1)
        .await
        .expect("page");
    assert_eq!(rest[0].id, ids[3]);

    let bound = s.page_channels(Some(&p), true, 10).await.expect("page");
    assert_eq!(bound[0].id, ids[1]);
    assert_eq!(bound[1].id, ids[3]);
    assert!(bound.iter().all(|c| c.bound));

    // Failures newest first, with their reasons; the cursor moves past the newest.
    let f = s.page_failures(None, 1000).await.expect("failures");
    let mine: Vec<&DeliveryFailure> = f.iter().filter(|f| f.channel_id.starts_with(&p)).collect();
    assert_eq!(mine.len(), 2, "{mine:?}");
    assert_eq!(mine[0].message_id, m4.message_id);
    assert_eq!(mine[0].reason, "timeout");
    assert_eq!(mine[0].state, OutboxState::Pending);
    assert_eq!(mine[0].attempts, 1);
    assert_eq!(mine[0].tenant_id, c.tenant_id);
    assert_eq!(mine[1].message_id, m3.message_id);
    assert_eq!(mine[1].reason, "rejected: 403 forbidden");
    assert_eq!(mine[1].state, OutboxState::Failed);
    let older = s
        .page_failures(Some(mine[0].seq), 1000)
        .await
        .expect("failures");
    assert!(older.iter().all(|f| f.seq < mine[0].seq));
    assert!(older.iter().any(|f| f.message_id == m3.message_id));

    let o = s.overview(1_000_000).await.expect("overview");
    assert!(
        o.channels >= 4 && o.bound_channels >= 2 && o.outbox >= 4 && o.outbox_failed >= 1,
        "{o:?}"
    );
}

/// The console's search on channels, bindings and failures: each filter alone and together,
/// keeping the page's order, its cursor and its limit.
pub async fn console_search(s: &dyn Store) {
    let a = connector(s).await;
    let b = connector(s).await;
    let p = new_id("srch");
    let mut chans = Vec::new();
    // Six channels in id order: tenants a, b, a, b, a, b; the last three bound and connected.
    for i in 0..6 {
        let c = if i % 2 == 0 { &a } else { &b };
        let mut ch = channel_rec(c, now_ms());
        ch.id = format!("{p}-{}{i}", if i < 3 { "x" } else { "y" });
        if i >= 3 {
            ch.binding = Some(vec![i as u8]);
            ch.binding_key = Some(new_id("bk"));
            ch.status = ConnectionStatus::Connected;
        }
        s.insert_channel(&ch).await.expect("insert channel");
        chans.push(ch);
    }
    let ids = |v: &[ChannelSummary]| v.iter().map(|c| c.id.clone()).collect::<Vec<_>>();
    let want = |is: &[usize]| is.iter().map(|&i| chans[i].id.clone()).collect::<Vec<_>>();
    let search = |f: ConsoleFilter, after: Option<String>, bound: bool, limit: u32| async move {
        s.search_channels(&f, after.as_deref(), bound, limit)
            .await
            .expect("search channels")
    };
    let of = |tenant: Option<&str>, card: Option<&str>, status: Option<&str>, prefix: &str| {
        ConsoleFilter {
            tenant_id: tenant.map(str::to_owned),
            card_id: card.map(str::to_owned),
            status: status.map(str::to_owned),
            id_prefix: Some(prefix.to_owned()),
        }
    };

    // By id prefix alone: exactly the channels whose id starts with it.
    let all = search(of(None, None, None, &p), None, false, 50).await;
    assert_eq!(ids(&all), want(&[0, 1, 2, 3, 4, 5]));
    let x = search(of(None, None, None, &format!("{p}-x")), None, false, 50).await;
    assert_eq!(ids(&x), want(&[0, 1, 2]));
    let none = search(of(None, None, None, &format!("{p}-z")), None, false, 50).await;
    assert!(none.is_empty(), "{none:?}");
    // By tenant, by card (each tenant's connector has its own Card), by status.
    let ta = search(of(Some(&a.tenant_id), None, None, &p), None, false, 50).await;
    assert_eq!(ids(&ta), want(&[0, 2, 4]));
    let cb = search(of(None, Some(&b.card_id), None, &p), None, false, 50).await;
    assert_eq!(ids(&cb), want(&[1, 3, 5]));
    let connected = search(of(None, None, Some("connected"), &p), None, false, 50).await;
    assert_eq!(ids(&connected), want(&[3, 4, 5]));
    assert!(
        connected
            .iter()
            .all(|c| c.status == ConnectionStatus::Connected)
    );
    // Together, and with bound_only (the bindings page).
    let both = search(
        of(Some(&a.tenant_id), None, Some("created"), &p),
        None,
        false,
        50,
    )
    .await;
    assert_eq!(ids(&both), want(&[0, 2]));
    let bound_b = search(of(Some(&b.tenant_id), None, None, &p), None, true, 50).await;
    assert_eq!(ids(&bound_b), want(&[3, 5]));
    // The limit and the cursor page through the matches only.
    let first = search(of(Some(&a.tenant_id), None, None, &p), None, false, 2).await;
    assert_eq!(ids(&first), want(&[0, 2]));
    let next = search(
        of(Some(&a.tenant_id), None, None, &p),
        Some(first[1].id.clone()),
        false,
        2,
    )
    .await;
    assert_eq!(ids(&next), want(&[4]));
    // An empty filter is the plain page.
    let plain = s
        .search_channels(&ConsoleFilter::default(), Some(&p), false, 3)
        .await
        .expect("search");
    assert_eq!(
        ids(&plain),
        ids(&s.page_channels(Some(&p), false, 3).await.expect("page"))
    );

    // Failures: one failed on channel 0 (tenant a), one retried on channel 3 (tenant b).
    let now = now_ms();
    let m0 = message(&chans[0].id, now, now + HOUR);
    let m3 = message(&chans[3].id, now, now + HOUR);
    for m in [&m0, &m3] {
        s.enqueue_outbox(m, 100, now + 2 * HOUR)
            .await
            .expect("enqueue");
    }
    assert!(
        s.fail_outbox(&chans[0].id, &m0.message_id, "rejected")
            .await
            .expect("fail")
    );
    s.record_attempt(&chans[3].id, &m3.message_id, Some("timeout"))
        .await
        .expect("attempt");
    let failures = |f: ConsoleFilter, before: Option<i64>| async move {
        s.search_failures(&f, before, 50)
            .await
            .expect("search failures")
            .into_iter()
            .map(|f| f.message_id)
            .collect::<Vec<_>>()
    };
    let by = |tenant: Option<&str>, card: Option<&str>, status: Option<&str>, prefix: &str| {
        of(tenant, card, status, prefix)
    };
    assert_eq!(
        failures(by(None, None, None, &p), None).await,
        [m3.message_id.as_str(), m0.message_id.as_str()],
        "newest first, by channel id prefix"
    );
    assert_eq!(
        failures(by(Some(&a.tenant_id), None, None, &p), None).await,
        [m0.message_id.as_str()]
    );
    assert_eq!(
        failures(by(None, Some(&b.card_id), None, &p), None).await,
        [m3.message_id.as_str()]
    );
    assert_eq!(
        failures(by(None, None, Some("failed"), &p), None).await,
        [m0.message_id.as_str()]
    );
    assert_eq!(
        failures(by(None, None, Some("pending"), &p), None).await,
        [m3.message_id.as_str()]
    );
    // The prefix also finds a failure by its message id.
    let by_message = ConsoleFilter {
        id_prefix: Some(m0.message_id[..m0.message_id.len() - 4].to_owned()),
        ..ConsoleFilter::default()
    };
    assert_eq!(failures(by_message, None).await, [m0.message_id.as_str()]);
    // The cursor moves past the newest.
    let newest = s
        .search_failures(&by(None, None, None, &p), None, 1)
        .await
        .expect("search failures");
    assert_eq!(newest.len(), 1);
    assert_eq!(
        failures(by(None, None, None, &p), Some(newest[0].seq)).await,
        [m0.message_id.as_str()]
    );
}

fn step(tenant: &str, ch: &str, msg: &str, step: &str, at: i64) -> JournalRecord {
    JournalRecord {
        id: 0,
        tenant_id: tenant.to_owned(),
        channel_id: ch.to_owned(),
        message_id: msg.to_owned(),
        step: step.to_owned(),
        detail: format!("{step} detail"),
        pod_id: "pod-j".to_owned(),
        at,
    }
}

/// The delivery journal: a batch insert, a message's steps oldest first, a channel's newest
/// first with a cursor, and the purge by age and per-tenant count.
pub async fn journal(s: &dyn Store) {
    let (ta, tb) = (tenant(s).await.id, tenant(s).await.id);
    let (ch, other) = (new_id("ch"), new_id("ch"));
    let (m1, m2) = (new_id("msg"), new_id("msg"));
    let t0 = now_ms();
    s.insert_journal(&[]).await.expect("empty batch");
    s.insert_journal(&[
        step(&ta, &ch, &m1, "accepted", t0),
        step(&ta, &ch, &m1, "stored", t0),
        step(&ta, &ch, &m2, "accepted", t0 + 1),
        step(&ta, &other, &new_id("msg"), "accepted", t0 + 1),
    ])
    .await
    .expect("insert");
    s.insert_journal(&[step(&ta, &ch, &m1, "sent", t0 + 2)])
        .await
        .expect("insert");
    // Recorded before the earlier steps but happened earlier: read by time.
    s.insert_journal(&[step(&ta, &ch, &m1, "rung", t0 + 1)])
        .await
        .expect("insert");

    let got = s.journal_for_message(&m1, 100).await.expect("by message");
    let steps: Vec<&str> = got.iter().map(|e| e.step.as_str()).collect();
    assert_eq!(steps, ["accepted", "stored", "rung", "sent"]);
    assert_eq!(
        got[0],
        JournalRecord {
            id: got[0].id,
            ..step(&ta, &ch, &m1, "accepted", t0)
        }
    );
    assert!(got[0].id < got[1].id, "ids follow insert order");
    assert_eq!(s.journal_for_message(&m1, 2).await.expect("limit").len(), 2);
    assert!(
        s.journal_for_message(&new_id("msg"), 10)
            .await
            .expect("none")
            .is_empty()
    );

    let page = s
        .journal_for_channel(&ch, None, 3)
        .await
        .expect("by channel");
    let steps: Vec<(&str, &str)> = page
        .iter()
        .map(|e| (e.message_id.as_str(), e.step.as_str()))
        .collect();
    assert_eq!(steps, [(&*m1, "rung"), (&*m1, "sent"), (&*m2, "accepted")]);
    let rest = s
        .journal_for_channel(&ch, Some(page[2].id), 10)
        .await
        .expect("next page");
    let steps: Vec<&str> = rest.iter().map(|e| e.step.as_str()).collect();
    assert_eq!(steps, ["stored", "accepted"]);

    // By age: only the old step goes.
    s.insert_journal(&[step(&tb, &ch, &m2, "expired", AGES_AGO)])
        .await
        .expect("insert old");
    assert!(s.purge_journal(AGES_AGO + 1, 0).await.expect("purge age") >= 1);
    let left = s.journal_for_message(&m2, 10).await.expect("read");
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].step, "accepted");

    // By count: each tenant keeps its newest; another tenant's steps are its own.
    s.insert_journal(&[
        step(&tb, &other, &m2, "a", t0),
        step(&tb, &other, &m2, "b", t0),
    ])
    .await
    .expect("insert b");
    assert!(s.purge_journal(AGES_AGO + 1, 2).await.expect("purge cap") >= 4);
    let a_left = s.journal_for_channel(&ch, None, 10).await.expect("a");
    let steps: Vec<&str> = a_left.iter().map(|e| e.step.as_str()).collect();
    assert_eq!(steps, ["rung", "sent"], "tenant a keeps its newest two");
    let b_left = s.journal_for_channel(&other, None, 10).await.expect("b");
    let steps: Vec<&str> = b_left.iter().map(|e| e.step.as_str()).collect();
    assert_eq!(steps, ["b", "a"], "tenant b keeps both");

    // What the purge is about to remove unanswered: pending past its expiry, not failed ones
    // or live ones, with the channel's tenant.
    let ch = channel(s).await;
    let old = message(&ch.id, AGES_AGO - 100, AGES_AGO);
    let old_failed = message(&ch.id, AGES_AGO - 100, AGES_AGO + 10);
    let live = message(&ch.id, now_ms(), now_ms() + HOUR);
    for m in [&old, &old_failed, &live] {
        s.enqueue_outbox(m, 10, m.expires_at + HOUR)
            .await
            .expect("enqueue");
    }
    assert!(
        s.fail_outbox(&ch.id, &old_failed.message_id, "rejected")
            .await
            .expect("fail")
    );
    let expired = s
        .expired_pending(AGES_AGO + 100, 10)
        .await
        .expect("expired");
    let mine: Vec<_> = expired.iter().filter(|(_, c, _)| *c == ch.id).collect();
    assert_eq!(
        mine,
        [&(ch.tenant_id.clone(), ch.id.clone(), old.message_id.clone())]
    );

    // Within one millisecond, on two pods: the delivering pod's batch stored first, but a
    // message is accepted before it is sent.
    let (tc, chc, m3) = (tenant(s).await.id, new_id("ch"), new_id("msg"));
    s.insert_journal(&[
        step(&tc, &chc, &m3, "sent", t0),
        step(&tc, &chc, &m3, "acked", t0),
    ])
    .await
    .expect("insert");
    s.insert_journal(&[
        step(&tc, &chc, &m3, "accepted", t0),
        step(&tc, &chc, &m3, "stored", t0),
    ])
    .await
    .expect("insert");
    let got = s.journal_for_message(&m3, 100).await.expect("by message");
    let steps: Vec<&str> = got.iter().map(|e| e.step.as_str()).collect();
    assert_eq!(steps, ["accepted", "stored", "sent", "acked"]);

    // A large batch (a busy pod's 200 ms: stores cut it into several statements) keeps
    // every step, in order.
    let (td, chd) = (tenant(s).await.id, new_id("ch"));
    let many: Vec<JournalRecord> = (0..347)
        .map(|i| step(&td, &chd, &format!("msg_many_{i:04}"), "accepted", t0 + i))
        .collect();
    s.insert_journal(&many).await.expect("a large batch");
    let got = s.journal_for_channel(&chd, None, 1000).await.expect("all");
    let ids: Vec<String> = got.iter().rev().map(|e| e.message_id.clone()).collect();
    let want: Vec<String> = many.iter().map(|e| e.message_id.clone()).collect();
    assert_eq!(ids, want, "every step of the batch, newest first");
}
