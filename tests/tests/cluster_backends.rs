//! Cluster scenario 6: NATS and Redis restart under load. The pods use a private
//! `nats-server` and `redis-server` of this test (the shared ones serve other tests), which
//! are killed and started again while messages flow. The pods reconnect by themselves,
//! `/readyz` follows the backends, and inbound work is either accepted (then delivered) or
//! refused with a retryable 503, never lost.
//!
//! Postgres is not restarted here: the machine's Postgres is shared by every test.

mod cluster_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster_support::*;
use tokio::time::MissedTickBehavior;

#[derive(Default)]
struct Posted {
    /// (channel index, id, accepted at)
    accepted: Vec<(usize, String, Instant)>,
    refused: Vec<String>,
}

/// Waits until every pod's `/readyz` answers `want`; returns how long it took.
async fn all_ready_is(cluster: &Cluster, pods: &[PodInfo], want: u16, what: &str) -> Duration {
    let t = Instant::now();
    for p in pods {
        eventually(
            Duration::from_secs(20),
            &format!("{what}: readyz {want} on {}", p.name),
            || async { (cluster.readyz(p).await == Some(want)).then_some(()) },
        )
        .await;
        assert_eq!(
            cluster.livez(p).await,
            Some(200),
            "livez stays 200 on {}",
            p.name
        );
    }
    t.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_ride_out_nats_and_redis_restarts() {
    let mut nats = PrivateServer::nats().await;
    let mut redis = PrivateServer::redis().await;
    let opts = ClusterOptions {
        nats_url: nats.url("nats"),
        redis_url: redis.url("redis"),
        // Long, so that prompt deliveries after the restart prove the doorbells work again.
        sweep_interval: "5s",
        ..ClusterOptions::default()
    };
    let cluster = Cluster::start(opts).await;
    let a = cluster.start_pod("a").await;
    let b = cluster.start_pod("b").await;
    let c = cluster.start_pod("c").await;
    let pods = [a.clone(), b.clone(), c.clone()];
    let tenant = cluster.tenant("backends").await;
    let endpoint = Endpoint::start().await;
    let agent = Agent::connect(&cluster, &tenant, &b, Prefer::Oldest).await;
    let channels = agent.bind_channels(2, &endpoint).await;
    let rec = agent.recorder().clone();

    // 20 messages/s to A and C, whatever the backends are doing.
    let stop = Arc::new(AtomicBool::new(false));
    let posted: Arc<Mutex<Posted>> = Arc::default();
    let posters: Vec<_> = channels
        .iter()
        .enumerate()
        .map(|(ci, ch)| {
            let (cluster, ch, secret, stop, posted) = (
                cluster.clone(),
                ch.clone(),
                endpoint.secret.clone(),
                stop.clone(),
                posted.clone(),
            );
            let targets = [a.clone(), c.clone()];
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
                for i in 0.. {
                    tick.tick().await;
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let id = format!("b-{ci}-{i:04}");
                    let status = cluster
                        .inbound(&targets[i % 2], &ch, &secret, &id, "through restarts")
                        .await
                        .expect("pods stay up");
                    let mut p = posted.lock().unwrap();
                    match status {
                        202 => p.accepted.push((ci, id, Instant::now())),
                        503 => p.refused.push(id),
                        other => {
                            panic!("inbound {id} answered {other}: neither accepted nor retryable")
                        }
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // NATS goes away: every pod turns unready, deliveries fall back to the sweep.
    let t = Instant::now();
    let nats_down_at = Instant::now();
    nats.down().await;
    let nats_unready = all_ready_is(&cluster, &pods, 503, "nats down").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    nats.up().await;
    let nats_ready = all_ready_is(&cluster, &pods, 200, "nats back").await;
    let nats_back_at = Instant::now();
    let nats_outage = t.elapsed();

    // Redis likewise.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t = Instant::now();
    redis.down().await;
    let redis_unready = all_ready_is(&cluster, &pods, 503, "redis down").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    redis.up().await;
    let redis_ready = all_ready_is(&cluster, &pods, 200, "redis back").await;
    let redis_outage = t.elapsed();

    // After both restarts the doorbells ring again: with a 5 s sweep, these arrive fast
    // only through NATS.
    let marker = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    for p in posters {
        p.await.expect("poster");
    }
    let (accepted, refused) = {
        let p = posted.lock().unwrap();
        (p.accepted.clone(), p.refused.clone())
    };
    let expected: Vec<String> = accepted.iter().map(|(_, id, _)| id.clone()).collect();
    assert!(
        rec.wait_distinct(expected.len(), WAIT).await,
        "delivered {} of {} accepted",
        rec.deliveries.distinct(),
        expected.len()
    );
    for (ci, ch) in channels.iter().enumerate() {
        let ids: Vec<String> = accepted
            .iter()
            .filter(|(i, _, _)| *i == ci)
            .map(|(_, id, _)| id.clone())
            .collect();
        assert_eq!(rec.first_order(ch), ids, "channel {ch} in acceptance order");
    }
    let arrival: std::collections::HashMap<String, Instant> = rec
        .log()
        .into_iter()
        .map(|g| (g.message_id, g.at))
        .collect();
    let late: Vec<f64> = accepted
        .iter()
        .filter(|(_, _, at)| *at > marker)
        .map(|(_, id, at)| arrival[id].saturating_duration_since(*at).as_secs_f64() * 1000.0)
        .collect();
    assert!(!late.is_empty());
    let worst = late.iter().copied().fold(0.0, f64::max);
    // Accepted while NATS was away: no doorbell, so the 5 s sweep delivered them.
    let during: Vec<f64> = accepted
        .iter()
        .filter(|(_, _, at)| *at > nats_down_at && *at < nats_back_at)
        .map(|(_, id, at)| arrival[id].saturating_duration_since(*at).as_secs_f64() * 1000.0)
        .collect();
    let during_worst = during.iter().copied().fold(0.0, f64::max);
    assert!(
        worst < 1500.0,
        "after the restarts deliveries are doorbell-driven again (worst {worst:.0} ms with a 5 s sweep)"
    );

    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_exactly_once(&rec, &expected);
    assert!(agent.problems().is_empty(), "{:?}", agent.problems());
    println!(
        "scenario 6: {} inbound accepted and delivered exactly once, {} refused with 503 (retryable); \
         NATS down {nats_outage:?} total: all pods unready within {nats_unready:?}, ready again {nats_ready:?} after restart; \
         Redis down {redis_outage:?} total: unready within {redis_unready:?}, ready again {redis_ready:?} after restart; \
         {} accepted while NATS was down, delivered by the sweep within {during_worst:.0} ms; \
         worst accept-to-delivery after recovery {worst:.0} ms; client reconnects {}",
        expected.len(),
        refused.len(),
        during.len(),
        agent.reconnects().len()
    );
}
