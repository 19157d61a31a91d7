//! What happens second by second: per flow the rates sent and delivered and the latency
//! percentiles of that second's first arrivals, per pod its RSS and CPU. The same samples
//! feed the live progress line and the HTML report's plots.

use std::collections::BTreeMap;
use std::io::{IsTerminal as _, Write as _};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::pods::{Fleet, PodState, fetch_metrics, proc_sample};
use crate::stages::Profile;
use crate::stats::{Flows, Latency};

/// One flow over time; index `i` of every vector is the second that ended at `t_s[i]`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FlowSeries {
    pub flow: String,
    /// The rate the stages asked for at that time (empty for "as fast as possible").
    pub offered_per_s: Vec<f64>,
    pub sent_per_s: Vec<f64>,
    pub accepted_per_s: Vec<f64>,
    /// Distinct first arrivals.
    pub delivered_per_s: Vec<f64>,
    pub p50_ms: Vec<Option<f64>>,
    pub p90_ms: Vec<Option<f64>>,
    pub p99_ms: Vec<Option<f64>>,
}

/// One pod (or process) over time.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ResourceSeries {
    pub name: String,
    /// `proc` (/proc/<pid> on this machine) or `metrics` (`process_*` series of /metrics).
    pub source: String,
    pub rss_mib: Vec<Option<f64>>,
    pub cpu_percent: Vec<Option<f64>>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct SeriesReport {
    /// Seconds since the load started at each sample.
    pub t_s: Vec<f64>,
    /// When the load stopped (the settle time follows).
    pub load_end_s: f64,
    /// Where one stage ends and the next begins (`--ramp`, `--soak`).
    pub stage_bounds_s: Vec<f64>,
    pub flows: Vec<FlowSeries>,
    pub resources: Vec<ResourceSeries>,
}

/// Where pod CPU and memory come from.
pub struct Sources {
    pub fleet: Arc<Fleet>,
    /// `--target`: internal listeners whose `/metrics` may carry `process_*` series.
    pub metrics_urls: Vec<String>,
    /// `--target`: local pods' pids.
    pub pod_pids: Vec<u32>,
}

/// `(rss bytes, cpu seconds)` from the standard `process_*` series, when exposed.
pub fn process_metrics(text: &str) -> (Option<f64>, Option<f64>) {
    let value = |name: &str| {
        text.lines().find_map(|l| {
            let mut it = l.split_whitespace();
            (it.next() == Some(name))
                .then(|| it.next().and_then(|v| v.parse::<f64>().ok()))
                .flatten()
        })
    };
    (
        value("process_resident_memory_bytes"),
        value("process_cpu_seconds_total"),
    )
}

struct Sampler {
    sources: Sources,
    flows: Arc<Flows>,
    profiles: [Option<Profile>; 4],
    start: Instant,
    total: Duration,
    report: SeriesReport,
    /// Cumulative `(sent, accepted, delivered)` per flow at the previous sample.
    last_counts: [(u64, usize, usize); 4],
    last_t: f64,
    /// Cumulative CPU seconds per resource at the previous sample.
    last_cpu: BTreeMap<String, f64>,
    progress: Option<Progress>,
}

/// The live stderr line: only on a terminal, and not with `--no-progress`.
struct Progress;

impl Progress {
    fn draw(line: &str) {
        let mut e = std::io::stderr().lock();
        let _ = write!(e, "\r\x1b[2K{line}");
        let _ = e.flush();
    }

    fn clear() {
        let mut e = std::io::stderr().lock();
        let _ = write!(e, "\r\x1b[2K");
        let _ = e.flush();
    }
}

/// What the sampler watches.
pub struct Watch {
    pub sources: Sources,
    pub flows: Arc<Flows>,
    /// The flows' stages (inbound, tool, outbound, file), for the offered rate.
    pub profiles: [Option<Profile>; 4],
    pub runs: Option<Arc<crate::hosts::RunStats>>,
    pub start: Instant,
    /// Length of the load.
    pub total: Duration,
    /// A live line on stderr if it is a terminal.
    pub show_progress: bool,
}

/// Runs until `stop`, one sample a second; returns the series.
pub async fn run(w: Watch, stop: CancellationToken) -> SeriesReport {
    let Watch {
        sources,
        flows,
        profiles,
        runs,
        start,
        total,
        show_progress,
    } = w;
    let names = flows.all().map(|f| f.name.to_owned());
    let mut stage_bounds_s = Vec::new();
    if let Some(p) = profiles[0].as_ref().filter(|p| p.stages.len() > 1) {
        let mut t = 0.0;
        for s in &p.stages[..p.stages.len() - 1] {
            t += s.seconds;
            stage_bounds_s.push(t);
        }
    }
    let mut s = Sampler {
        sources,
        flows,
        profiles,
        start,
        total,
        report: SeriesReport {
            load_end_s: total.as_secs_f64(),
            stage_bounds_s,
            flows: names
                .iter()
                .map(|n| FlowSeries {
                    flow: n.clone(),
                    ..FlowSeries::default()
                })
                .collect(),
            ..SeriesReport::default()
        },
        last_counts: [(0, 0, 0); 4],
        last_t: 0.0,
        last_cpu: BTreeMap::new(),
        progress: (show_progress && std::io::stderr().is_terminal()).then_some(Progress),
    };
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::from_std(start) + Duration::from_secs(1),
        Duration::from_secs(1),
    );
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n = 0u64;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        s.sample().await;
        n += 1;
        let line = s.line(runs.as_deref());
        if s.progress.is_some() {
            Progress::draw(&line);
        } else if n.is_multiple_of(5) {
            println!("{line}");
        }
    }
    if s.progress.is_some() {
        Progress::clear();
    }
    s.report
}

impl Sampler {
    async fn sample(&mut self) {
        let t = self.start.elapsed().as_secs_f64();
        let dt = (t - self.last_t).max(1e-3);
        let i = self.report.t_s.len();
        self.report.t_s.push(t);
        for (k, f) in self.flows.all().into_iter().enumerate() {
            let (sent, acc, del) = f.progress();
            let (ps, pa, pd) = self.last_counts[k];
            self.last_counts[k] = (sent, acc, del);
            let lat = Latency::of(&f.take_window());
            let fs = &mut self.report.flows[k];
            if let Some(p) = &self.profiles[k] {
                let at = Duration::from_secs_f64(t.min(self.total.as_secs_f64()));
                fs.offered_per_s.push(if t <= self.total.as_secs_f64() {
                    p.rate_at(at)
                } else {
                    0.0
                });
            }
            fs.sent_per_s.push(sent.saturating_sub(ps) as f64 / dt);
            fs.accepted_per_s.push(acc.saturating_sub(pa) as f64 / dt);
            fs.delivered_per_s.push(del.saturating_sub(pd) as f64 / dt);
            let some = |v: f64| (lat.count > 0).then_some(v);
            fs.p50_ms.push(some(lat.p50));
            fs.p90_ms.push(some(lat.p90));
            fs.p99_ms.push(some(lat.p99));
        }
        for (name, source, rss_bytes, cpu_s) in self.read_resources().await {
            let pos = match self.report.resources.iter().position(|r| r.name == name) {
                Some(p) => p,
                None => {
                    self.report.resources.push(ResourceSeries {
                        name: name.clone(),
                        source: source.into(),
                        rss_mib: vec![None; i],
                        cpu_percent: vec![None; i],
                    });
                    self.report.resources.len() - 1
                }
            };
            let r = &mut self.report.resources[pos];
            r.rss_mib.resize(i, None);
            r.cpu_percent.resize(i, None);
            r.rss_mib.push(rss_bytes.map(|b| b / (1024.0 * 1024.0)));
            let pct = match (cpu_s, self.last_cpu.get(&name)) {
                (Some(now), Some(before)) => Some(((now - before) / dt * 100.0).max(0.0)),
                _ => None,
            };
            r.cpu_percent.push(pct);
            match cpu_s {
                Some(c) => self.last_cpu.insert(name, c),
                None => self.last_cpu.remove(&name),
            };
        }
        for r in &mut self.report.resources {
            r.rss_mib.resize(i + 1, None);
            r.cpu_percent.resize(i + 1, None);
        }
        self.last_t = t;
    }

    /// `(name, source, rss bytes, cpu seconds)` of every pod that can be measured now.
    async fn read_resources(&self) -> Vec<(String, &'static str, Option<f64>, Option<f64>)> {
        let fleet = &self.sources.fleet;
        let mut out = Vec::new();
        for p in fleet.all() {
            if p.is_external() || !matches!(p.state(), PodState::Serving | PodState::Draining) {
                continue;
            }
            if let Some(s) = p.sample(fleet.clk_tck) {
                out.push((
                    p.name.clone(),
                    "proc",
                    Some(s.rss_kib as f64 * 1024.0),
                    Some(s.cpu_seconds),
                ));
            }
        }
        for pid in &self.sources.pod_pids {
            let s = proc_sample(*pid, fleet.clk_tck);
            out.push((
                format!("pid-{pid}"),
                "proc",
                s.map(|s| s.rss_kib as f64 * 1024.0),
                s.map(|s| s.cpu_seconds),
            ));
        }
        let scrapes = futures::future::join_all(
            self.sources
                .metrics_urls
                .iter()
                .map(|u| fetch_metrics(u.trim_end_matches('/'))),
        )
        .await;
        for (i, text) in scrapes.into_iter().enumerate() {
            let (rss, cpu) = text.as_deref().map_or((None, None), process_metrics);
            if rss.is_some() || cpu.is_some() {
                out.push((format!("metrics-{i}"), "metrics", rss, cpu));
            }
        }
        out
    }

    /// `[=====>    ]  12s/60s  inbound 998/s p99 12ms | ... | pod-0 85MiB 40%`
    fn line(&self, runs: Option<&crate::hosts::RunStats>) -> String {
        const WIDTH: usize = 20;
        let t = self.last_t;
        let total = self.total.as_secs_f64().max(1e-9);
        let done = ((t / total).min(1.0) * WIDTH as f64) as usize;
        let mut line = format!(
            "[{}{}{}] {:>5.0}s/{:.0}s",
            "=".repeat(done.saturating_sub(1)),
            if done > 0 { ">" } else { "" },
            " ".repeat(WIDTH - done),
            t,
            total
        );
        if t > total {
            line.push_str(" settling");
        }
        for (k, f) in self.report.flows.iter().enumerate() {
            if self.last_counts[k].0 == 0 {
                continue;
            }
            let last = |v: &Vec<f64>| v.last().copied().unwrap_or(0.0);
            line.push_str(&format!(
                " | {} {:.0}/s->{:.0}/s",
                f.flow,
                last(&f.sent_per_s),
                last(&f.delivered_per_s)
            ));
            if let Some(Some(p99)) = f.p99_ms.last() {
                line.push_str(&format!(" p99 {p99:.0}ms"));
            }
        }
        if let Some(r) = runs {
            let (started, acked, finished) = r.progress();
            line.push_str(&format!(" | runs {started}/{acked}/{finished}"));
        }
        for r in &self.report.resources {
            if let Some(Some(rss)) = r.rss_mib.last() {
                line.push_str(&format!(" | {} {rss:.0}MiB", r.name));
                if let Some(Some(c)) = r.cpu_percent.last() {
                    line.push_str(&format!(" {c:.0}%"));
                }
            }
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_process_metrics() {
        let text = "# HELP process_cpu_seconds_total x\nprocess_cpu_seconds_total 12.5\nprocess_resident_memory_bytes 1.048576e7\nswitchyard_x 1\n";
        assert_eq!(process_metrics(text), (Some(10_485_760.0), Some(12.5)));
        assert_eq!(process_metrics("switchyard_x 1\n"), (None, None));
    }
}
