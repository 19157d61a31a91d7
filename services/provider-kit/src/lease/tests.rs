use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use switchyard_core::testkit::{Cluster, FakeServices};

use super::*;

const NAME: &str = "poll:bot_1";

fn cfg(ttl_ms: u64) -> LeaseConfig {
    LeaseConfig {
        ttl: Duration::from_millis(ttl_ms),
        retry: Duration::from_millis(40),
        backoff: Duration::from_millis(40),
    }
}

fn pod(cluster: &Arc<Cluster>, name: &str) -> Arc<FakeServices> {
    FakeServices::new(cluster.clone(), name, "http://127.0.0.1:9", "/kit")
}

fn lease(services: &Arc<FakeServices>, ttl_ms: u64) -> Lease {
    Lease::new(services.clone(), NAME, "test consumer", cfg(ttl_ms))
}

/// A store that can stop answering (a starved pool), over a test pod.
struct Stalling {
    pod: Arc<FakeServices>,
    stalled: AtomicBool,
}

#[async_trait]
impl LeaseStore for Stalling {
    async fn acquire(&self, name: &str, ttl: Duration) -> Result<Option<i64>, BackendError> {
        if self.stalled.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        self.pod.acquire_lease(name, ttl).await
    }

    async fn release(&self, name: &str) -> Result<(), BackendError> {
        self.pod.release_lease(name).await
    }
}

#[tokio::test]
async fn one_holder_then_a_handover_on_release() {
    let cluster = Cluster::new();
    let (a, b) = (pod(&cluster, "pod-a"), pod(&cluster, "pod-b"));
    let stop = CancellationToken::new();
    let mut la = lease(&a, 60_000);
    let first = la.hold(&stop).await.unwrap();
    assert!(first.fresh);
    assert_eq!(
        la.hold(&stop).await.unwrap(),
        Term {
            generation: first.generation,
            fresh: false
        },
        "renewing keeps the term"
    );
    let mut lb = lease(&b, 60_000);
    let waiting = tokio::spawn(async move {
        let t = lb.hold(&CancellationToken::new()).await;
        (t, lb)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "a second pod waits while one holds");
    assert_eq!(cluster.lease_holder(NAME).as_deref(), Some("pod-a"));

    la.release().await;
    let (t, _lb) = tokio::time::timeout(Duration::from_secs(2), waiting)
        .await
        .expect("taken over at once after a release")
        .unwrap();
    let t = t.unwrap();
    assert!(t.fresh);
    assert!(t.generation > first.generation, "a new fencing generation");
    assert_eq!(cluster.lease_holder(NAME).as_deref(), Some("pod-b"));
    assert_eq!(la.generation(), None);
    assert!(!la.confirm().await, "the old holder's fence refuses");
}

#[tokio::test]
async fn a_restarted_pod_with_the_same_identity_takes_its_lease_back_at_once() {
    let cluster = Cluster::new();
    let before = pod(&cluster, "pod-a");
    let stop = CancellationToken::new();
    let mut crashed = lease(&before, 60_000);
    let held = crashed.hold(&stop).await.unwrap();
    // A SIGKILL: nothing released.
    drop(crashed);
    let mut stranger = lease(&pod(&cluster, "pod-b"), 60_000);
    let other_stop = CancellationToken::new();
    let s = other_stop.clone();
    let waiting = tokio::spawn(async move { stranger.hold(&s).await });

    let again = pod(&cluster, "pod-a");
    let mut restarted = lease(&again, 60_000);
    let t = tokio::time::timeout(Duration::from_millis(500), restarted.hold(&stop))
        .await
        .expect("the same identity does not wait the lease out")
        .unwrap();
    assert!(
        t.fresh,
        "a new consumer starts a fresh term (reloads its cursor)"
    );
    assert_eq!(
        t.generation, held.generation,
        "the same pod renews its term"
    );
    other_stop.cancel();
    assert_eq!(waiting.await.unwrap(), None, "a stranger never got it");
}

#[tokio::test]
async fn an_expired_term_fails_the_fence_and_the_next_hold_is_fresh() {
    let cluster = Cluster::new();
    let (a, b) = (pod(&cluster, "pod-a"), pod(&cluster, "pod-b"));
    let stop = CancellationToken::new();
    let mut la = lease(&a, 150);
    let first = la.hold(&stop).await.unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let mut lb = lease(&b, 60_000);
    let taken = lb.hold(&stop).await.unwrap();
    assert!(taken.generation > first.generation);
    assert!(
        !la.confirm().await,
        "the cursor is not moved by a lost term"
    );
    assert_eq!(la.generation(), None);
    lb.release().await;
    let back = la.hold(&stop).await.unwrap();
    assert!(back.fresh && back.generation > taken.generation);
}

#[tokio::test]
async fn run_renews_while_the_work_waits_and_stops_on_cancel() {
    let cluster = Cluster::new();
    let a = pod(&cluster, "pod-a");
    let stop = CancellationToken::new();
    // A 300 ms lease outlived three times over by one call: renewed meanwhile.
    let mut la = lease(&a, 300);
    let t = la.hold(&stop).await.unwrap();
    let out = la
        .run(&stop, async {
            tokio::time::sleep(Duration::from_millis(900)).await;
            7
        })
        .await;
    assert!(matches!(out, Held::Done(7)));
    assert_eq!(cluster.lease_holder(NAME).as_deref(), Some("pod-a"));
    assert_eq!(la.generation(), Some(t.generation));

    let s = stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        s.cancel();
    });
    let out = la.run(&stop, std::future::pending::<()>()).await;
    assert!(matches!(out, Held::Stopped));
    assert_eq!(
        la.hold(&stop).await,
        None,
        "a stopped consumer takes nothing"
    );
}

#[tokio::test]
async fn a_failing_store_ends_the_term_while_the_lease_still_holds() {
    let cluster = Cluster::new();
    let a = pod(&cluster, "pod-a");
    let stop = CancellationToken::new();
    let mut la = lease(&a, 600);
    la.hold(&stop).await.unwrap();
    a.dead.store(true, Ordering::SeqCst);
    let out = la.run(&stop, std::future::pending::<()>()).await;
    assert!(matches!(out, Held::Lost));
    assert_eq!(
        cluster.lease_holder(NAME).as_deref(),
        Some("pod-a"),
        "closed before the lease could expire under the consumer"
    );
}

#[tokio::test]
async fn a_renewal_that_does_not_answer_within_a_third_of_the_ttl_ends_the_term() {
    let cluster = Cluster::new();
    let store = Arc::new(Stalling {
        pod: pod(&cluster, "pod-a"),
        stalled: AtomicBool::new(false),
    });
    let stop = CancellationToken::new();
    let mut la = Lease::with_store(store.clone(), NAME, "test consumer", cfg(900));
    la.hold(&stop).await.unwrap();
    store.stalled.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let out = la.run(&stop, std::future::pending::<()>()).await;
    assert!(matches!(out, Held::Lost));
    // Due at 300 ms, cut at 600 ms: the lease (900 ms) still holds when the consumer closes.
    assert!(started.elapsed() < Duration::from_millis(900));
    assert_eq!(cluster.lease_holder(NAME).as_deref(), Some("pod-a"));
}

#[tokio::test]
async fn consumers_start_once_restart_on_a_new_fingerprint_and_hand_over_on_shutdown() {
    let cluster = Cluster::new();
    let a = pod(&cluster, "pod-a");
    let stop = CancellationToken::new();
    let mut consumers = Consumers::new(&stop);
    let starts = Arc::new(AtomicUsize::new(0));
    let start = |fp: &'static str, consumers: &mut Consumers| {
        let (a, starts) = (a.clone(), starts.clone());
        consumers.ensure("bot_1", fp, move |stop| async move {
            starts.fetch_add(1, Ordering::SeqCst);
            let mut l = lease(&a, 60_000);
            while l.hold(&stop).await.is_some() {
                if !pause(&stop, Duration::from_millis(20)).await {
                    break;
                }
            }
            l.release().await;
        });
    };
    start("fp1", &mut consumers);
    start("fp1", &mut consumers);
    assert_eq!(consumers.len(), 1);
    let holder = || async { cluster.lease_holder(NAME) };
    switchyard_core::testkit::eventually(Duration::from_secs(2), "held", holder).await;
    assert_eq!(starts.load(Ordering::SeqCst), 1, "one consumer per key");
    start("fp2", &mut consumers);
    assert_eq!(starts.load(Ordering::SeqCst), 1);
    switchyard_core::testkit::eventually(Duration::from_secs(2), "restarted", || async {
        (starts.load(Ordering::SeqCst) == 2).then_some(())
    })
    .await;

    let mut wanted = HashMap::new();
    wanted.insert("bot_1".to_owned(), "fp2".to_owned());
    consumers.retain(&wanted);
    assert_eq!(consumers.len(), 1, "still wanted with its fingerprint");
    consumers.shutdown().await;
    assert_eq!(cluster.lease_holder(NAME), None, "the lease is handed over");

    let mut consumers = Consumers::new(&stop);
    start("fp1", &mut consumers);
    consumers.retain(&HashMap::new());
    assert!(consumers.is_empty(), "a key no longer bound is stopped");
}
