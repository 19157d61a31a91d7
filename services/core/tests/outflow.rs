//! The delivery machine ([`Outflow`]) and the group commit ([`OutboxCommitter`]) over the
//! in-memory store and the in-process bus, with the probe provider's Card: no sockets, no
//! HTTP. Each test drives the machine with the events a session would feed it and checks
//! what it would send and what the store holds afterwards.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use switchyard_core::bus::Carried;
use switchyard_core::engine::{
    AckOutcome, CommitLimits, Hub, HubParts, Janitor, MountedCard, Outflow, OutflowLimits,
    SessionIdent,
};
use switchyard_core::ids::now_ms;
use switchyard_core::memstore::MemoryStore;
use switchyard_core::model::{ChannelRecord, Enqueue, EnqueueOutcome, OutboxRecord, OutboxState};
use switchyard_core::store::Store;
use switchyard_protocol::Envelope;
use switchyard_protocol::im::ChatAckPayload;
use switchyard_protocol::packet::HelloPayload;

use common::ProbeProvider;

struct Kit {
    hub: Arc<Hub>,
    conn: MountedCard,
    store: Arc<dyn Store>,
    /// The same store, for its count of delivery reads.
    mem: Arc<MemoryStore>,
    _dir: tempfile::TempDir,
}

async fn kit() -> Kit {
    kit_with(CommitLimits::default()).await
}

async fn kit_with(commit: CommitLimits) -> Kit {
    let dir = tempfile::tempdir().unwrap();
    let mem = Arc::new(MemoryStore::new());
    let store: Arc<dyn Store> = mem.clone();
    store.migrate().await.unwrap();
    let hub = Arc::new(Hub::new(HubParts {
        commit,
        ..common::hub_parts(&store, &dir)
    }));
    let conn = MountedCard::new(hub.clone(), Arc::new(ProbeProvider::new()));
    Kit {
        hub,
        conn,
        store,
        mem,
        _dir: dir,
    }
}

/// A message for `channel` accepted now, with a one-minute lifetime and dedupe window.
fn item(channel: &str, message_id: &str, cap: u32) -> Enqueue {
    let now = now_ms();
    Enqueue {
        record: OutboxRecord {
            seq: 0,
            channel_id: channel.into(),
            message_id: message_id.into(),
            payload: json!({"message_id": message_id, "text": format!("text {message_id}")}),
            created_at: now,
            expires_at: now + 60_000,
            attempts: 0,
            state: OutboxState::Pending,
            last_error: None,
        },
        cap,
        dedupe_until: now + 60_000,
    }
}

impl Kit {
    /// hello + channel.open for a fresh tenant, with the given profiles.
    async fn channel(&self, socket: &str, profile: &str) -> (SessionIdent, ChannelRecord) {
        let (tenant, _) = switchyard_core::engine::create_tenant(self.store.as_ref(), "t")
            .await
            .unwrap();
        let hello = HelloPayload {
            connector_card_id: self.conn.card_id().to_owned(),
            connector_id: None,
            protocol_version: Some("3.0".into()),
            supported_profiles: Some(vec![profile.into()]),
        };
        let ok = self.conn.hello(&tenant.id, socket, &hello).await.unwrap();
        let (ch, _) = self.conn.open_channel(&ok.ident, None).await.unwrap();
        (ok.ident, ch)
    }

    async fn put(&self, ch: &str, ids: &[&str]) {
        let items: Vec<Enqueue> = ids.iter().map(|id| item(ch, id, 1000)).collect();
        let out = self.store.enqueue_outbox_batch(&items).await.unwrap();
        assert!(out.iter().all(|o| o.is_stored()), "{out:?}");
    }

    /// Stores messages as the ingress does and returns what their doorbells carry.
    async fn put_carried(&self, ch: &str, ids: &[&str]) -> Vec<Carried> {
        let items: Vec<Enqueue> = ids.iter().map(|id| item(ch, id, 1000)).collect();
        let out = self.store.enqueue_outbox_batch(&items).await.unwrap();
        items
            .into_iter()
            .zip(out)
            .map(|(it, o)| match o {
                EnqueueOutcome::Stored { seq, prev } => Carried {
                    seq,
                    prev,
                    message_id: it.record.message_id,
                    payload: it.record.payload,
                    created_at: it.record.created_at,
                    expires_at: it.record.expires_at,
                },
                other => panic!("not stored: {other:?}"),
            })
            .collect()
    }

    /// The delivery machine of socket `sock_a` with `ch` routed to it.
    fn flow(&self, ch: &ChannelRecord) -> Outflow {
        let mut flow = Outflow::new(self.conn.clone(), "sock_a", limits());
        flow.open(ch);
        flow
    }

    async fn pending(&self, ch: &str) -> Vec<String> {
        self.store
            .pending_outbox(ch, 0, now_ms(), 10_000)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.message_id)
            .collect()
    }
}

fn limits() -> OutflowLimits {
    OutflowLimits {
        window: 4,
        ack_timeout: Duration::from_millis(200),
        retry_pause: Duration::from_millis(100),
    }
}

fn ids(packets: &[Envelope]) -> Vec<String> {
    packets
        .iter()
        .map(|e| {
            e.payload.as_ref().unwrap()["message_id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

fn ack(id: &str) -> ChatAckPayload {
    ChatAckPayload::accepted(id)
}

#[tokio::test]
async fn window_bounds_what_is_in_flight_and_acks_open_it() {
    let k = kit().await;
    let (_, ch) = k.channel("sock_a", "xagent.im.v2").await;
    k.put(&ch.id, &["m1", "m2", "m3", "m4", "m5", "m6"]).await;
    let mut flow = k.flow(&ch);
    let first = flow.flush().await;
    assert_eq!(ids(&first), ["m1", "m2", "m3", "m4"]);
    assert!(first.iter().all(|e| e.kind == "chat.message"));
    assert!(
        first
            .iter()
            .all(|e| e.connector_channel_id.as_deref() == Some(ch.id.as_str()))
    );
    // Nothing more while the window is full.
    flow.wake(&ch.id);
    assert!(flow.flush().await.is_empty());
    // Two acks in one round: one batched write, two slots.
    let r1 = first[0].packet_id.clone();
    assert_eq!(
        flow.on_ack(&ch.id, Some(&r1), &ack("m1")).await,
        AckOutcome::Recorded
    );
    assert_eq!(
        flow.on_ack(&ch.id, None, &ack("m2")).await,
        AckOutcome::Recorded
    );
    let next = flow.flush().await;
    assert_eq!(ids(&next), ["m5", "m6"]);
    assert_eq!(k.pending(&ch.id).await, ["m3", "m4", "m5", "m6"]);
    assert!(!flow.is_settled());
}

#[tokio::test]
async fn an_acked_message_is_never_delivered_again() {
    let k = kit().await;
    let (_, ch) = k.channel("sock_a", "xagent.im.v2").await;
    k.put(&ch.id, &["m1", "m2"]).await;
    let mut flow = k.flow(&ch);
    let sent = flow.flush().await;
    assert_eq!(ids(&sent), ["m1", "m2"]);
    flow.on_ack(&ch.id, None, &ack("m1")).await;
    flow.on_ack(&ch.id, None, &ChatAckPayload::duplicate("m2"))
        .await;
    assert!(flow.flush().await.is_empty());
    assert!(flow.is_settled());
    assert!(k.pending(&ch.id).await.is_empty());
    // A reopen (a reconnect) starts from the oldest unfinished message: there is none.
    flow.open(&ch);
    assert!(flow.flush().await.is_empty());
    // A late second ack is harmless.
    assert_eq!(
        flow.on_ack(&ch.id, None, &ack("m1")).await,
        AckOutcome::NotInFlight
    );
}

#[tokio::test]
async fn a_timeout_redelivers_the_unfinished_ones_in_order_with_the_same_ids() {
    let k = kit().await;
    let (_, ch) = k.channel("sock_a", "xagent.im.v2").await;
    k.put(&ch.id, &["m1", "m2", "m3"]).await;
    let mut flow = k.flow(&ch);
    let sent = flow.flush().await;
    flow.on_ack(&ch.id, None, &ack("m2")).await;
    assert!(flow.flush().await.is_empty());
    let due = flow.next_due().expect("messages in flight have a deadline");
    // Before the deadline nothing happens.
    flow.on_tick(Instant::now()).await;
    assert!(flow.flush().await.is_empty());
    flow.on_tick(due + Duration::from_millis(1)).await;
    let again = flow.flush().await;
    assert_eq!(ids(&again), ["m1", "m3"]);
    // New packets, same message ids: acks must name the new packet or the message.
    assert_ne!(again[0].packet_id, sent[0].packet_id);
    assert_eq!(
        flow.on_ack(&ch.id, Some(&sent[0].packet_id), &ack("m1"))
            .await,
        AckOutcome::Recorded,
        "an ack naming the old packet still matches by message_id"
    );
    assert!(flow.flush().await.is_empty());
    let attempts: Vec<i32> = k
        .store
        .pending_outbox(&ch.id, 0, now_ms(), 10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.attempts)
        .collect();
    assert_eq!(
        attempts,
        [1],
        "m3's timeout is recorded; m1 is gone after its ack"
    );
}

#[tokio::test]
async fn rejections_retry_or_fail_by_the_one_rule() {
    let k = kit().await;
    let (_, ch) = k.channel("sock_a", "xagent.im.v2").await;
    k.put(&ch.id, &["m1", "m2"]).await;
    let mut flow = k.flow(&ch);
    flow.flush().await;
    let final_no = ChatAckPayload::rejected("m1", "bad", "no", false);
    let later = ChatAckPayload::rejected("m2", "busy", "later", true);
    assert_eq!(
        flow.on_ack(&ch.id, None, &final_no).await,
        AckOutcome::Recorded
    );
    assert_eq!(
        flow.on_ack(&ch.id, None, &later).await,
        AckOutcome::Recorded
    );
    assert!(flow.flush().await.is_empty());
    // m1 failed for good; m2 waits for the retry pause, then comes again.
    assert_eq!(k.pending(&ch.id).await, ["m2"]);
    let due = flow.next_due().unwrap();
    assert!(due <= Instant::now() + Duration::from_millis(100));
    flow.on_tick(due + Duration::from_millis(1)).await;
    assert_eq!(ids(&flow.flush().await), ["m2"]);
}

#[tokio::test]
async fn an_ack_naming_another_message_is_refused() {
    let k = kit().await;
    let (_, ch) = k.channel("sock_a", "xagent.im.v2").await;
    k.put(&ch.id, &["m1", "m2"]).await;
    let mut flow = k.flow(&ch);
    let sent = flow.flush().await;
    let outcome = flow
        .on_ack(&ch.id, Some(&sent[0].packet_id), &ack("m2"))
        .await;
    assert_eq!(outcome, AckOutcome::Mismatch);
    assert_eq!(k.pending(&ch.id).await, ["m1", "m2"]);
}

#[tokio::test]
async fn the_sweep_finds_lost_doorbells_and_routes_taken_elsewhere() {
    let k = kit().await;
    let (ident, ch) = k.channel("sock_a", "xagent.im.v2").await;
    let mut flow = k.flow(&ch);
    assert!(flow.flush().await.is_empty());
    // A message arrives but its doorbell is lost: the sweep notices it.
    k.put(&ch.id, &["m1"]).await;
    assert!(flow.flush().await.is_empty());
    flow.sweep().await;
    assert_eq!(ids(&flow.flush().await), ["m1"]);
    // Nothing new beyond the cursor: the sweep reads nothing more.
    flow.sweep().await;
    assert!(flow.flush().await.is_empty());
    // Another socket takes the channel; the ChannelTaken notice is lost too.
    let other = SessionIdent {
        socket_id: "sock_b".into(),
        ..ident
    };
    k.conn.open_channel(&other, Some(&ch.id)).await.unwrap();
    flow.sweep().await;
    assert!(!flow.is_routed(&ch.id));
}

/// A socket with many routes asks the store about a slice of them per sweep (256, or a sixth
/// of the table if that is more), and about every route within a few sweeps: a lost doorbell
/// and a route taken elsewhere are still found. Lost doorbells make the next sweep whole.
#[tokio::test]
async fn a_large_route_table_is_swept_in_slices_that_cover_it() {
    let k = kit().await;
    let (ident, first) = k.channel("sock_a", "xagent.im.v2").await;
    let mut flow = k.flow(&first);
    let mut chans = vec![first];
    for _ in 1..600 {
        let (ch, _) = k.conn.open_channel(&ident, None).await.unwrap();
        flow.open(&ch);
        chans.push(ch);
    }
    assert!(flow.flush().await.is_empty());
    // A message whose doorbell is lost, and a channel taken by another socket unnoticed.
    let lost = chans[417].id.clone();
    let taken = chans[123].id.clone();
    k.put(&lost, &["m1"]).await;
    let other = SessionIdent {
        socket_id: "sock_b".into(),
        ..ident.clone()
    };
    k.conn.open_channel(&other, Some(&taken)).await.unwrap();
    let mut sent = Vec::new();
    let mut looked_up = 0;
    // 600 routes: three slices of 256 cover them.
    for _ in 0..3 {
        let before = k.mem.route_lookups();
        flow.sweep().await;
        let asked = k.mem.route_lookups() - before;
        assert_eq!(asked, 256, "one slice per sweep");
        looked_up += asked;
        sent.extend(ids(&flow.flush().await));
    }
    assert!(looked_up >= 600);
    assert_eq!(sent, ["m1"], "the lost doorbell's message went out once");
    assert!(!flow.is_routed(&taken), "the route taken elsewhere went");
    assert!(
        chans
            .iter()
            .filter(|c| c.id != taken)
            .all(|c| flow.is_routed(&c.id)),
        "no other route went"
    );
    // The bus lost doorbells: every route is read, and the next sweep asks about all.
    flow.wake_all();
    let before = k.mem.route_lookups();
    flow.sweep().await;
    assert_eq!(k.mem.route_lookups() - before, 599);
    let before = k.mem.route_lookups();
    flow.sweep().await;
    assert_eq!(k.mem.route_lookups() - before, 256, "then slices again");
}

#[tokio::test]
async fn message_push_is_delivered_once_the_transport_wrote_it() {
    let k = kit().await;
    let (_, ch) = k.channel("sock_a", "xagent.im.v1").await;
    k.put(&ch.id, &["m1", "m2"]).await;
    let mut flow = k.flow(&ch);
    let sent = flow.flush().await;
    assert_eq!(sent.len(), 2);
    assert!(sent.iter().all(|e| e.kind == "message.push"));
    assert!(sent.iter().all(|e| flow.awaits_handoff(&e.packet_id)));
    assert!(
        !flow.is_settled(),
        "handed to the transport, not yet written"
    );
    assert_eq!(
        k.pending(&ch.id).await,
        ["m1", "m2"],
        "nothing is delivered before the socket took it"
    );
    flow.taken(&sent[0].packet_id);
    flow.taken(&sent[1].packet_id);
    assert!(flow.flush().await.is_empty(), "never sent twice");
    assert!(flow.is_settled());
    assert!(k.pending(&ch.id).await.is_empty());
}

#[tokio::test]
async fn a_push_the_socket_never_wrote_is_sent_on_the_next_connection() {
    // issue 25: message.push used to be recorded as delivered when the session was handed
    // the packet, so a socket that gave up before writing it lost the message.
    let k = kit().await;
    let (_, ch) = k.channel("sock_a", "xagent.im.v1").await;
    k.put(&ch.id, &["m1", "m2"]).await;
    let mut first = k.flow(&ch);
    let sent = first.flush().await;
    assert_eq!(ids(&sent), ["m1", "m2"]);
    // The writer wrote m1, then the socket went away with m2 still queued.
    first.taken(&sent[0].packet_id);
    assert!(first.flush().await.is_empty());
    drop(first);
    assert_eq!(k.pending(&ch.id).await, ["m2"], "m1 delivered, m2 kept");

    let mut second = k.flow(&ch);
    let again = second.flush().await;
    assert_eq!(ids(&again), ["m2"], "the unwritten push comes again");
    second.taken(&again[0].packet_id);
    second.flush().await;
    assert!(k.pending(&ch.id).await.is_empty());
}

#[tokio::test]
async fn group_commit_stores_each_message_once_and_in_order() {
    let k = kit().await;
    let (_, ch) = k.channel("sock_a", "xagent.im.v2").await;
    let committer = k.hub.committer();
    let mut calls = Vec::new();
    // 200 distinct messages, each sent twice, all at once.
    for _round in 0..2 {
        for i in 0..200 {
            calls.push(committer.enqueue(item(&ch.id, &format!("m{i:03}"), 1000)));
        }
    }
    let outcomes: Vec<EnqueueOutcome> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(|r| r.expect("queue not full").expect("stored"))
        .collect();
    let stored = outcomes.iter().filter(|o| o.is_stored()).count();
    let dup = outcomes
        .iter()
        .filter(|o| **o == EnqueueOutcome::Duplicate)
        .count();
    assert_eq!((stored, dup), (200, 200));
    let pending = k.pending(&ch.id).await;
    let expected: Vec<String> = (0..200).map(|i| format!("m{i:03}")).collect();
    assert_eq!(pending, expected, "seq order follows submission order");
}

#[tokio::test]
async fn a_full_commit_queue_refuses_at_once_and_stores_nothing_it_refused() {
    let k = kit_with(CommitLimits {
        committers: 1,
        max_batch: 4,
        max_queued: 8,
    })
    .await;
    let (_, ch) = k.channel("sock_a", "xagent.im.v2").await;
    let committer = k.hub.committer();
    let calls: Vec<_> = (0..300)
        .map(|i| committer.enqueue(item(&ch.id, &format!("m{i}"), 1000)))
        .collect();
    let results = futures::future::join_all(calls).await;
    let accepted: Vec<String> = results
        .iter()
        .enumerate()
        .filter(|(_, r)| matches!(r, Ok(Ok(EnqueueOutcome::Stored { .. }))))
        .map(|(i, _)| format!("m{i}"))
        .collect();
    let refused = results.iter().filter(|r| r.is_err()).count();
    assert!(refused > 0, "a queue of 8 cannot take 300 at once");
    assert_eq!(accepted.len() + refused, 300);
    let mut pending = k.pending(&ch.id).await;
    pending.sort();
    let mut accepted_sorted = accepted.clone();
    accepted_sorted.sort();
    assert_eq!(
        pending, accepted_sorted,
        "exactly what was answered Stored is stored"
    );
    assert_eq!(committer.queued(), 0);
}

#[tokio::test]
async fn batch_outcomes_for_a_missing_channel_and_a_full_one() {
    let k = kit().await;
    let (_, ch) = k.channel("sock_a", "xagent.im.v2").await;
    let out = k
        .store
        .enqueue_outbox_batch(&[
            item(&ch.id, "a", 2),
            item("cch_missing", "a", 2),
            item(&ch.id, "b", 2),
            item(&ch.id, "c", 2),
            item(&ch.id, "a", 2),
        ])
        .await
        .unwrap();
    let labels: Vec<&str> = out.iter().map(EnqueueOutcome::label).collect();
    assert_eq!(
        labels,
        ["stored", "unknown_channel", "stored", "full", "duplicate"]
    );
    let gone = k
        .store
        .ack_outbox_batch(&[(ch.id.clone(), "a".into()), (ch.id.clone(), "zz".into())])
        .await
        .unwrap();
    assert_eq!(gone, 1);
    assert_eq!(k.pending(&ch.id).await, ["b"]);
}

/// Provider secrets (`ProviderServices::secret_put`) are stored encrypted, apart from the plain
/// provider state, and bound to their key: a value copied under another key is refused.
#[tokio::test]
async fn provider_secrets_are_encrypted_and_bound_to_their_key() {
    use switchyard_core::ProviderServices;
    let k = kit().await;
    let secret = json!({"context_token": "ctx-s3cret-value"});
    k.conn.secret_put("peer:u1", &secret).await.unwrap();
    assert_eq!(k.conn.secret_get("peer:u1").await.unwrap(), Some(secret));
    assert_eq!(k.conn.secret_get("peer:u2").await.unwrap(), None);
    // Not readable as plain provider state, and not stored in clear anywhere in kv.
    assert_eq!(k.conn.kv_get("peer:u1").await.unwrap(), None);
    let ns = format!("{}#secrets", k.conn.card_id());
    let stored = k.store.kv_get(&ns, "peer:u1").await.unwrap().unwrap();
    assert!(!stored.contains("ctx-s3cret-value"));
    // The same ciphertext under another key does not decrypt.
    k.store.kv_put(&ns, "peer:u2", &stored).await.unwrap();
    assert!(k.conn.secret_get("peer:u2").await.is_err());
}

/// Issue 26, item 1: a doorbell that carries its message is sent as it is, without reading
/// the store, one message after the other.
#[tokio::test]
async fn a_carried_doorbell_is_sent_without_reading_the_store() {
    let k = kit().await;
    let (_, ch) = k.channel("sock_a", "xagent.im.v2").await;
    let mut flow = k.flow(&ch);
    assert!(flow.flush().await.is_empty(), "the open reads what waits");
    let reads = k.mem.pending_reads();
    for m in ["m1", "m2", "m3"] {
        let c = k.put_carried(&ch.id, &[m]).await;
        flow.offer(&ch.id, c[0].clone());
        let sent = flow.flush().await;
        assert_eq!(ids(&sent), [m]);
        assert_eq!(
            flow.on_ack(&ch.id, Some(&sent[0].packet_id), &ack(m)).await,
            AckOutcome::Recorded
        );
    }
    // Two stored in one batch, their doorbells in order.
    for c in k.put_carried(&ch.id, &["m4", "m5"]).await {
        flow.offer(&ch.id, c);
    }
    let sent = flow.flush().await;
    assert_eq!(ids(&sent), ["m4", "m5"]);
    assert_eq!(
        k.mem.pending_reads(),
        reads,
        "neither the doorbells nor the acks read the store"
    );
    assert_eq!(k.pending(&ch.id).await, ["m4", "m5"], "m1..m3 acked");
}

/// A doorbell whose predecessor this socket never saw (its doorbell lost) reads the store,
/// which gives both in order; the late doorbell then changes nothing.
#[tokio::test]
async fn a_gap_before_a_carried_doorbell_falls_back_to_the_store() {
    let k = kit().await;
    let (_, ch) = k.channel("sock_a", "xagent.im.v2").await;
    let mut flow = k.flow(&ch);
    assert!(flow.flush().await.is_empty());
    let lost = k.put_carried(&ch.id, &["m1"]).await;
    let next = k.put_carried(&ch.id, &["m2"]).await;
    assert_eq!(next[0].prev, lost[0].seq);
    let reads = k.mem.pending_reads();
    flow.offer(&ch.id, next[0].clone());
    assert_eq!(ids(&flow.flush().await), ["m1", "m2"]);
    assert_eq!(
        k.mem.pending_reads(),
        reads + 1,
        "one read recovers the gap"
    );
    flow.offer(&ch.id, lost[0].clone());
    flow.offer(&ch.id, next[0].clone());
    assert!(flow.flush().await.is_empty(), "late and repeated doorbells");
    assert_eq!(k.mem.pending_reads(), reads + 1);
}

/// A carried message that finds the window full waits in the store and is read when a slot
/// frees; after a timeout the redelivery comes from the store and carried doorbells resume
/// behind it.
#[tokio::test]
async fn a_full_window_and_a_timeout_hand_over_to_the_store() {
    let k = kit().await;
    let (_, ch) = k.channel("sock_a", "xagent.im.v2").await;
    let mut flow = k.flow(&ch);
    assert!(flow.flush().await.is_empty());
    let all = k.put_carried(&ch.id, &["m1", "m2", "m3", "m4", "m5"]).await;
    let reads = k.mem.pending_reads();
    for c in &all {
        flow.offer(&ch.id, c.clone());
    }
    let sent = flow.flush().await;
    assert_eq!(ids(&sent), ["m1", "m2", "m3", "m4"], "the window is 4");
    flow.on_ack(&ch.id, None, &ack("m1")).await;
    assert_eq!(ids(&flow.flush().await), ["m5"]);
    assert_eq!(k.mem.pending_reads(), reads + 1);

    // m2..m5 time out: redelivered from the store, in order, with m6 carried behind them.
    let due = flow.next_due().unwrap();
    flow.on_tick(due + Duration::from_millis(1)).await;
    assert_eq!(ids(&flow.flush().await), ["m2", "m3", "m4", "m5"]);
    for m in ["m2", "m3", "m4", "m5"] {
        flow.on_ack(&ch.id, None, &ack(m)).await;
    }
    // That read filled the window, so the freed slots look once more behind it.
    assert!(flow.flush().await.is_empty());
    let reads = k.mem.pending_reads();
    let c = k.put_carried(&ch.id, &["m6"]).await;
    flow.offer(&ch.id, c[0].clone());
    assert_eq!(ids(&flow.flush().await), ["m6"]);
    assert_eq!(k.mem.pending_reads(), reads);
    assert_eq!(k.pending(&ch.id).await, ["m6"]);
}

impl Kit {
    /// Outbox rows, whatever their state.
    async fn rows(&self) -> u64 {
        self.store.overview(1000).await.unwrap().outbox
    }
}

/// Issue 26, item 2: in-order acks move the channel's acked position (no row deleted on the
/// delivery path); the janitor removes the covered rows in bulk.
#[tokio::test]
async fn acks_move_a_cursor_and_the_janitor_removes_the_rows_in_bulk() {
    let k = kit().await;
    let (_, ch) = k.channel("sock_a", "xagent.im.v2").await;
    k.put(&ch.id, &["m1", "m2", "m3"]).await;
    let mut flow = k.flow(&ch);
    assert_eq!(ids(&flow.flush().await), ["m1", "m2", "m3"]);
    for m in ["m1", "m2", "m3"] {
        flow.on_ack(&ch.id, None, &ack(m)).await;
    }
    assert!(flow.flush().await.is_empty());
    assert!(flow.is_settled());
    assert!(
        k.pending(&ch.id).await.is_empty(),
        "the position covers them"
    );
    assert_eq!(k.rows().await, 3, "their rows wait for the janitor");
    // A reconnect reads nothing the position covers.
    flow.open(&ch);
    assert!(flow.flush().await.is_empty());

    let janitor = Janitor::new(
        k.hub.clone(),
        std::slice::from_ref(&k.conn),
        Duration::from_secs(60),
        Duration::from_secs(60),
    );
    let report = janitor.step().await.unwrap().expect("the only pod leads");
    assert_eq!(report.messages_purged, 3);
    assert_eq!(k.rows().await, 0);
}

/// Acked positions handed in at once (by many sockets' flushes) are written together: each
/// caller is answered, and a channel's position is the highest any of them handed in,
/// whatever the order.
#[tokio::test]
async fn acked_positions_of_many_sockets_are_written_together_and_only_move_up() {
    let k = kit_with(CommitLimits {
        committers: 1,
        ..CommitLimits::default()
    })
    .await;
    let (ident, a) = k.channel("sock_a", "xagent.im.v2").await;
    let (b, _) = k.conn.open_channel(&ident, None).await.unwrap();
    let sa: Vec<i64> = k
        .put_carried(&a.id, &["a1", "a2", "a3", "a4"])
        .await
        .iter()
        .map(|c| c.seq)
        .collect();
    let sb: Vec<i64> = k
        .put_carried(&b.id, &["b1", "b2"])
        .await
        .iter()
        .map(|c| c.seq)
        .collect();
    let acks = k.hub.acks();
    let calls = vec![
        acks.advance(vec![(a.id.clone(), sa[2])]),
        acks.advance(vec![(a.id.clone(), sa[0]), (b.id.clone(), sb[0])]),
        acks.advance(vec![(b.id.clone(), sb[1]), ("cch_missing".into(), 7)]),
        acks.advance(vec![(a.id.clone(), sa[1])]),
    ];
    for r in futures::future::join_all(calls).await {
        r.expect("every caller is answered once its write committed");
    }
    assert_eq!(k.pending(&a.id).await, ["a4"], "the highest position wins");
    assert!(k.pending(&b.id).await.is_empty());
    // Lower positions later move nothing back.
    acks.advance(vec![(a.id.clone(), sa[0])]).await.unwrap();
    assert_eq!(k.pending(&a.id).await, ["a4"]);
}

/// An ack out of order removes its message by itself; the position moves once the older
/// one is acked, and a timeout then redelivers only what is unfinished.
#[tokio::test]
async fn an_ack_out_of_order_waits_for_the_position_and_nothing_acked_comes_again() {
    let k = kit().await;
    let (_, ch) = k.channel("sock_a", "xagent.im.v2").await;
    k.put(&ch.id, &["m1", "m2", "m3"]).await;
    let mut flow = k.flow(&ch);
    assert_eq!(ids(&flow.flush().await), ["m1", "m2", "m3"]);
    flow.on_ack(&ch.id, None, &ack("m2")).await;
    assert!(flow.flush().await.is_empty());
    assert_eq!(k.pending(&ch.id).await, ["m1", "m3"]);
    assert_eq!(k.rows().await, 2, "m2 went by itself");
    flow.on_ack(&ch.id, None, &ack("m1")).await;
    assert!(flow.flush().await.is_empty());
    assert_eq!(k.pending(&ch.id).await, ["m3"]);
    let due = flow.next_due().unwrap();
    flow.on_tick(due + Duration::from_millis(1)).await;
    assert_eq!(ids(&flow.flush().await), ["m3"]);
}

/// A carried message waits for the flush: a route taken by another socket in the same round
/// (its `ChannelTaken` doorbell behind the outbox one) sends nothing here.
#[tokio::test]
async fn a_carried_message_is_not_sent_on_a_route_taken_before_the_flush() {
    let k = kit().await;
    let (_, ch) = k.channel("sock_a", "xagent.im.v2").await;
    let mut flow = k.flow(&ch);
    assert!(flow.flush().await.is_empty());
    let c = k.put_carried(&ch.id, &["m1"]).await;
    flow.offer(&ch.id, c[0].clone());
    assert!(flow.close(&ch.id));
    assert!(flow.flush().await.is_empty());
    assert!(flow.is_settled());
    assert_eq!(k.pending(&ch.id).await, ["m1"], "left for the new route");
}
