//! The hot path's statements keep one generic plan: Postgres plans a prepared statement for
//! its parameters five times, then keeps a generic plan only if that costs no more. A statement
//! whose generic plan always looks dearer (an array parameter whose length a custom plan knows)
//! is planned again on every execution, and at saturation that planning cost more than running
//! it (`outbox.rs`).

use switchyard_core::conformance::store::{channel_of, connector, item, message};
use switchyard_core::ids::{now_ms, random_secret};
use switchyard_core::model::*;
use switchyard_core::store::Store;
use switchyard_store_postgres::PostgresStore;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const HOUR: i64 = 3_600_000;

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
    let connector = connector(&store).await;
    // Enough channels, with statistics, that the plans probe indexes (as a deployment's
    // do): on a table of a few rows every plan is one cheap scan, and a generic plan is kept
    // whatever the statement looks like.
    let mut channels = Vec::new();
    for _ in 0..300 {
        channels.push(channel_of(&store, &connector).await.id);
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
            .map(|c| item(message(c, now_ms(), now_ms() + HOUR), 1000))
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
    // The batch's lock and facts read run inside `switchyard_enqueue_batch` since schema 10,
    // where PL/pgSQL caches their plans by the same rules, out of this view; the arrays there
    // are read as `(SELECT p_x)` for the same reason (`outbox.rs`). As statements of their
    // own, with `$n` in place of `(SELECT $n)`, they failed this with 12 custom plans. The
    // cursors' upsert keeps a generic plan here either way, but at saturation its old form
    // was planned in a third of its executions.
    for needle in ["switchyard_enqueue_batch", "INSERT INTO outbox_cursors"] {
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
