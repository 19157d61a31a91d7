//! Side probes that tell a slow pod from a busy host: every 100 ms, `/livez` (the process
//! answers) and `/readyz` (it also pings its store, bus and ephemeral state) on each serving
//! pod, and how late the loadtest's own timer fires.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::pods::Fleet;
use crate::stats::Latency;

const EVERY: Duration = Duration::from_millis(100);
/// Samples slower than this are listed with their time.
const SLOW: Duration = Duration::from_millis(250);
const MAX_SLOW_LISTED: usize = 50;

#[derive(Default)]
struct Samples {
    livez_us: Vec<u64>,
    readyz_us: Vec<u64>,
    timer_lag_us: Vec<u64>,
    failures: u64,
    slow: Vec<Slow>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Slow {
    pub at_s: f64,
    pub probe: String,
    pub ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProbeReport {
    pub livez_ms: Latency,
    pub readyz_ms: Latency,
    /// How late a 100 ms timer in the loadtest fired: high values mean the host (not the pod)
    /// was short of CPU.
    pub loadtest_timer_lag_ms: Latency,
    pub failures: u64,
    pub slow: Vec<Slow>,
}

#[derive(Clone, Default)]
pub struct Probes(Arc<Mutex<Samples>>);

impl Probes {
    fn with<R>(&self, f: impl FnOnce(&mut Samples) -> R) -> R {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// `metrics_urls`: the `--target` deployment's internal listeners (started pods are
    /// probed on their own).
    pub async fn run(
        self,
        fleet: Arc<Fleet>,
        metrics_urls: Vec<String>,
        start: Instant,
        stop: CancellationToken,
    ) {
        let http = match reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
        {
            Ok(c) => c,
            Err(_) => return,
        };
        loop {
            let due = Instant::now() + EVERY;
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(EVERY) => {}
            }
            let lag = Instant::now().saturating_duration_since(due);
            self.with(|s| s.timer_lag_us.push(lag.as_micros() as u64));
            self.note_slow(start, "loadtest timer lag", lag);
            for (pod, base) in fleet.probe_targets(&metrics_urls) {
                for (path, name) in [("/livez", "livez"), ("/readyz", "readyz")] {
                    let t = Instant::now();
                    let ok = http
                        .get(format!("{base}{path}"))
                        .send()
                        .await
                        .is_ok_and(|r| r.status().is_success());
                    let took = t.elapsed();
                    if !ok {
                        // A pod being killed or drained fails its probes; that is not a sample.
                        self.with(|s| s.failures += 1);
                        continue;
                    }
                    let us = took.as_micros() as u64;
                    self.with(|s| match name {
                        "livez" => s.livez_us.push(us),
                        _ => s.readyz_us.push(us),
                    });
                    self.note_slow(start, &format!("{pod} {name}"), took);
                }
            }
        }
    }

    fn note_slow(&self, start: Instant, probe: &str, took: Duration) {
        if took < SLOW {
            return;
        }
        self.with(|s| {
            if s.slow.len() < MAX_SLOW_LISTED {
                s.slow.push(Slow {
                    at_s: start.elapsed().as_secs_f64(),
                    probe: probe.to_owned(),
                    ms: took.as_secs_f64() * 1000.0,
                });
            }
        });
    }

    pub fn report(&self) -> ProbeReport {
        self.with(|s| ProbeReport {
            livez_ms: Latency::of(&s.livez_us),
            readyz_ms: Latency::of(&s.readyz_us),
            loadtest_timer_lag_ms: Latency::of(&s.timer_lag_us),
            failures: s.failures,
            slow: s.slow.clone(),
        })
    }
}
