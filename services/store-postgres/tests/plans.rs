//! The hot path's statements keep one generic plan: Postgres plans a prepared statement for
//! its parameters five times, then keeps a generic plan only if that costs no more. A statement
//! whose generic plan always looks dearer (an array parameter whose length a custom plan knows)
//! is planned again on every execution, and at saturation that planning cost more than running
//! it (`outbox.rs`).

use serde_json::json;
use switchyard_core::ids::{new_id, now_ms, random_secret};
use switchyard_core::model::*;
use switchyard_core::store::Store;
use switchyard_protocol::ConnectionStatus;
use switchyard_store_postgres::PostgresStore;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const HOUR: i64 = 3_600_000;

async fn channel(s: &dyn Store, c: &ConnectorRecord) -> String {
    let now = now_ms();
    let ch = ChannelRecord {
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
        created_at: now,
        updated_at: now,
    };
    s.insert_channel(&ch).await.expect("insert channel");
    ch.id
}

fn item(channel_id: &str) -> Enqueue {
    let now = now_ms();
    let message_id = new_id("msg");
    Enqueue {
        record: OutboxRecord {
            seq: 0,
            channel_id: channel_id.to_owned(),
            payload: json!({"message_id": message_id, "text": "hello"}),
            message_id,
            created_at: now,
            expires_at: now + HOUR,
            attempts: 0,
            state: OutboxState::Pending,
            last_error: None,
        },
        cap: 1000,
        dedupe_until: now + 2 * HOUR,
    }
}

#[tokio::test]
async fn batch_statements_keep_a_generic_plan() {
    let url =
        std::env::var("SWITCHYARD_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned());
    let schema = format!("t_{}", random_secret(8));
    // One connection: the statements below all run on it, and so does the view of its plans.
    let store = PostgresStore::connect(&url, Some(&schema), 1)
        .await
        .expect("connect postgres");
    store.migrate().await.expect("migrate");
    let tenant = Tenant {
        id: new_id("ten"),
        name: new_id("name"),
        created_at: now_ms(),
    };
    store.create_tenant(&tenant).await.expect("create tenant");
    let connector = ConnectorRecord {
        id: new_id("conn"),
        tenant_id: tenant.id.clone(),
        card_id: new_id("card"),
        created_at: now_ms(),
        offline_since: None,
    };
    store
        .insert_connector(&connector)
        .await
        .expect("insert connector");
    // Enough channels, with statistics, that the plans probe indexes (as a deployment's
    // do): on a table of a few rows every plan is one cheap scan, and a generic plan is kept
    // whatever the statement looks like.
    let mut channels = Vec::new();
    for _ in 0..300 {
        channels.push(channel(&store, &connector).await);
    }
    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(
            url.parse::<sqlx::postgres::PgConnectOptions>()
                .expect("url")
                .options([("search_path", schema.as_str())]),
        )
        .await
        .expect("connect the admin pool");
    sqlx::query("ANALYZE channels, outbox, inbound_seen, outbox_cursors")
        .execute(&admin)
        .await
        .expect("analyze");
    // Batches of different sizes, as the group commit makes them; each acked at once.
    for round in 0..12 {
        let items: Vec<Enqueue> = channels
            .iter()
            .skip(round * 7)
            .take(1 + round % 2)
            .map(|c| item(c))
            .collect();
        let out = store.enqueue_outbox_batch(&items).await.expect("enqueue");
        let cursors: Vec<(String, i64)> = items
            .iter()
            .zip(&out)
            .map(|(i, o)| match o {
                EnqueueOutcome::Stored { seq, .. } => (i.record.channel_id.clone(), *seq),
                other => panic!("not stored: {other:?}"),
            })
            .collect();
        store.advance_outbox(&cursors).await.expect("advance");
    }
    let plans = store.prepared_plans().await.expect("plans");
    let plan_of = |needle: &str| {
        let found: Vec<_> = plans.iter().filter(|(s, ..)| s.contains(needle)).collect();
        assert_eq!(
            found.len(),
            1,
            "one statement with {needle:?} in {plans:#?}"
        );
        (found[0].1, found[0].2)
    };
    // The lock and the facts read fail this with `$n` in place of `(SELECT $n)` (12 custom
    // plans); the cursors' upsert keeps a generic plan here either way, but at saturation its
    // old form was planned in a third of its executions.
    for needle in [
        "ORDER BY id FOR NO KEY UPDATE",
        "'seen' AS kind",
        "INSERT INTO outbox_cursors",
    ] {
        let (generic, custom) = plan_of(needle);
        // Five custom plans, then the generic one for the other seven executions.
        assert!(
            custom <= 5 && generic >= 7,
            "{needle:?}: {generic} generic and {custom} custom plans in 12 executions"
        );
    }
    store.close().await;
    sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .execute(&admin)
        .await
        .expect("drop the test schema");
    admin.close().await;
}
