//! The report: a table on stdout and the same facts as JSON.

use std::fmt::Write as _;

use serde::Serialize;

use crate::bare::PingCompare;
use crate::baseline::Baselines;
use crate::figures::{Figure, ratio};
use crate::hosts::HostsReport;
use crate::pods::{PodState, ProcSample};
use crate::probe::ProbeReport;
use crate::scenario::{Event, Recovery};
use crate::series::SeriesReport;
use crate::stages::Profile;
use crate::stats::FlowReport;
use crate::target::TargetReport;
use crate::xagent::Reconnect;

#[derive(Debug, Clone, Serialize)]
pub struct PodReport {
    pub name: String,
    pub pid: u32,
    pub state: PodState,
    /// Last reading while the process existed (the end of the run for live pods).
    pub rss_kib: u64,
    pub peak_rss_kib: u64,
    pub cpu_seconds: f64,
    pub uptime_s: f64,
    pub log: String,
    /// `switchyard_*` samples from the pod's `/metrics` at the end (live pods only).
    pub metrics: Vec<String>,
}

/// One simulated xAgent backend (tenant).
#[derive(Debug, Clone, Serialize)]
pub struct BackendReport {
    pub tenant: usize,
    pub channels: usize,
    /// Inbound `chat.message` first arrivals per second on this backend.
    pub inbound_timeline_per_s: Vec<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Rates {
    pub inbound_per_s: f64,
    pub inbound_concurrency: usize,
    pub tool_per_s: f64,
    pub outbound_per_s: f64,
    pub file_per_s: f64,
}

/// The machine, so figures from a busy host can be recognised as such.
#[derive(Debug, Clone, Serialize)]
pub struct Host {
    pub cpus: usize,
    /// `/proc/loadavg` when the load started and when it ended.
    pub loadavg_start: String,
    pub loadavg_end: String,
}

impl Host {
    pub fn loadavg() -> String {
        std::fs::read_to_string("/proc/loadavg")
            .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub command: String,
    pub binary: String,
    pub mode: String,
    pub pods: usize,
    pub tenants: usize,
    pub channels: usize,
    pub duration_s: f64,
    pub settle_s: f64,
    pub rates: Rates,
    pub setup_s: f64,
    pub host: Host,
    pub flows: Vec<FlowReport>,
    /// The agent-host workload (`--hosts`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hosts: Option<HostsReport>,
    pub target: TargetReport,
    pub probes: ProbeReport,
    pub pod_resources: Vec<PodReport>,
    pub loadtest_process: ProcSample,
    pub events: Vec<Event>,
    pub recoveries: Vec<Recovery>,
    pub reconnects: Vec<Reconnect>,
    pub backends: Vec<BackendReport>,
    pub schema_violations: usize,
    pub schema_violation_examples: Vec<String>,
    pub notes: Vec<String>,
    /// Empty when nothing went wrong.
    pub problems: Vec<String>,
    /// Each measured figure next to its limit (`--baseline`, `--ping-compare`).
    pub figures: Vec<Figure>,
    /// `--baseline`: what the store alone does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baselines: Option<Baselines>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ping_compare: Option<PingCompare>,
    /// `--target`: the deployment's public base URL (no pods were started).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_url: Option<String>,
    /// Where the deployment posted to the fake webhook target.
    pub webhook_url: String,
    /// `--ramp` / `--soak`: the inbound flow's stages.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stages: Option<Profile>,
    pub thresholds: Thresholds,
    /// Thresholds that were breached (exit status 4); empty otherwise.
    pub breaches: Vec<String>,
    /// Second-by-second rates, latencies and pod resources (the HTML report's plots).
    pub series: SeriesReport,
}

/// Exit status when the run completed but found problems (loss, errors, bad signatures...).
pub const EXIT_PROBLEMS: i32 = 3;
/// Exit status when a threshold (`--max-p99`, `--max-lost`, `--max-dup`, `--min-rate`) was
/// breached; it takes precedence over [`EXIT_PROBLEMS`].
pub const EXIT_THRESHOLD: i32 = 4;

/// The operator's pass criteria.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Thresholds {
    pub max_p99_ms: Option<f64>,
    pub max_lost: Option<u64>,
    pub max_dup: Option<u64>,
    pub min_rate_per_s: Option<f64>,
}

impl Thresholds {
    /// What is breached in `flows` over a load of `duration_s`.
    pub fn check(&self, flows: &[FlowReport], duration_s: f64) -> Vec<String> {
        let mut b = Vec::new();
        let active: Vec<&FlowReport> = flows.iter().filter(|f| f.sent > 0).collect();
        if let Some(max) = self.max_p99_ms {
            for f in &active {
                if f.latency_ms.count == 0 {
                    b.push(format!(
                        "--max-p99 {max}ms: {} has no delivered message to measure",
                        f.flow
                    ));
                } else if f.latency_ms.p99 > max {
                    b.push(format!(
                        "--max-p99 {max}ms: {} p99 is {:.1} ms",
                        f.flow, f.latency_ms.p99
                    ));
                }
            }
        }
        let lost: u64 = active.iter().map(|f| f.lost).sum();
        if let Some(max) = self.max_lost
            && lost > max
        {
            b.push(format!("--max-lost {max}: {lost} message(s) lost"));
        }
        let dup: u64 = active.iter().map(|f| f.duplicate_ids).sum();
        if let Some(max) = self.max_dup
            && dup > max
        {
            b.push(format!(
                "--max-dup {max}: {dup} message_id(s) delivered more than once"
            ));
        }
        if let Some(min) = self.min_rate_per_s {
            let rate = total_delivered_per_s(flows, duration_s);
            if rate < min {
                b.push(format!(
                    "--min-rate {min}: {rate:.1} distinct deliveries/s over the load"
                ));
            }
        }
        b
    }
}

/// Distinct deliveries of every flow together per second of load.
pub fn total_delivered_per_s(flows: &[FlowReport], duration_s: f64) -> f64 {
    flows.iter().map(|f| f.delivered).sum::<u64>() as f64 / duration_s.max(1e-9)
}

/// The `--baseline` and `--ping-compare` lines.
pub fn render_measures(b: Option<&Baselines>, ping: Option<&PingCompare>) -> String {
    let mut s = String::new();
    if let Some(b) = b {
        for x in b.postgres.iter().chain(b.sqlite.iter()) {
            let _ = writeln!(s, "{}", x.line());
        }
        for n in &b.notes {
            let _ = writeln!(s, "baseline: {n}");
        }
    }
    if let Some(p) = ping {
        let _ = writeln!(s, "{}", p.line());
    }
    s
}

impl Report {
    /// Lists what went wrong; duplicates are expected (at-least-once) only around a disruption.
    /// A threshold given for loss or duplicates replaces the built-in check of it.
    pub fn judge(&mut self, disrupted: bool) {
        let mut p = Vec::new();
        let t = self.thresholds.clone();
        for f in &self.flows {
            if f.lost > 0 && t.max_lost.is_none() {
                p.push(format!(
                    "{}: {} accepted message(s) never delivered",
                    f.flow, f.lost
                ));
            }
            if f.duplicate_ids > 0 && !disrupted && t.max_dup.is_none() {
                p.push(format!(
                    "{}: {} message_id(s) delivered more than once ({} extra deliveries)",
                    f.flow, f.duplicate_ids, f.duplicate_deliveries
                ));
            }
            if f.gave_up > 0 {
                p.push(format!(
                    "{}: {} operation(s) never accepted before the deadline",
                    f.flow, f.gave_up
                ));
            }
            if !f.rejected.is_empty() {
                p.push(format!("{}: refused {:?}", f.flow, f.rejected));
            }
        }
        if self.target.bad_signature > 0 {
            p.push(format!(
                "target: {} post(s) with a bad signature",
                self.target.bad_signature
            ));
        }
        if self.target.malformed > 0 || self.target.unknown_flow > 0 {
            p.push(format!(
                "target: {} malformed post(s), {} with an unknown text",
                self.target.malformed, self.target.unknown_flow
            ));
        }
        if !self.target.file_download_failures.is_empty() {
            p.push(format!(
                "target: file downloads failed {:?}",
                self.target.file_download_failures
            ));
        }
        if let Some(h) = &self.hosts {
            p.extend(h.problems());
        }
        if self.schema_violations > 0 {
            p.push(format!(
                "{} schema violation(s) in packets from the pods",
                self.schema_violations
            ));
        }
        self.problems = p;
        self.breaches = t.check(&self.flows, self.duration_s);
    }

    pub fn exit_code(&self) -> i32 {
        if !self.breaches.is_empty() {
            EXIT_THRESHOLD
        } else if !self.problems.is_empty() {
            EXIT_PROBLEMS
        } else {
            0
        }
    }

    /// The chat flows' table, their details and the fake target.
    fn render_chat(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "offered: inbound {} (max {} in flight), tool {}/s, outbound {}/s, file {}/s; setup {:.1}s",
            if self.rates.inbound_per_s > 0.0 {
                format!("{}/s", self.rates.inbound_per_s)
            } else {
                "unlimited".into()
            },
            self.rates.inbound_concurrency,
            self.rates.tool_per_s,
            self.rates.outbound_per_s,
            self.rates.file_per_s,
            self.setup_s
        );
        let _ = writeln!(
            s,
            "\n{:<9} {:>8} {:>8} {:>9} {:>6} {:>5} {:>9} {:>9} | {:>7} {:>7} {:>7} {:>8} | {:>7} {:>7}",
            "flow",
            "sent",
            "accepted",
            "delivered",
            "dupIds",
            "lost",
            "sent/s",
            "deliv/s",
            "p50ms",
            "p90ms",
            "p99ms",
            "maxms",
            "ack50",
            "ack99"
        );
        for f in &self.flows {
            if f.sent == 0 {
                continue;
            }
            let _ = writeln!(
                s,
                "{:<9} {:>8} {:>8} {:>9} {:>6} {:>5} {:>9.1} {:>9.1} | {:>7.1} {:>7.1} {:>7.1} {:>8.1} | {:>7.1} {:>7.1}",
                f.flow,
                f.sent,
                f.accepted,
                f.delivered,
                f.duplicate_ids,
                f.lost,
                f.sent_per_s,
                f.delivered_per_s,
                f.latency_ms.p50,
                f.latency_ms.p90,
                f.latency_ms.p99,
                f.latency_ms.max,
                f.ack_latency_ms.p50,
                f.ack_latency_ms.p99,
            );
        }
        let _ = writeln!(
            s,
            "(latency = send stamp in the text -> arrival at the receiver; ack = request -> 202 / ack)"
        );
        for f in &self.flows {
            if f.sent == 0 {
                continue;
            }
            let extra = f.attempts.saturating_sub(f.sent);
            if extra > 0 || !f.errors.is_empty() || !f.rejected.is_empty() || f.gave_up > 0 {
                let _ = writeln!(
                    s,
                    "{}: {} retries; failed attempts {:?}; refused {:?}; gave up {}",
                    f.flow, extra, f.errors, f.rejected, f.gave_up
                );
            }
            if f.duplicate_ids > 0 || f.delivered_not_accepted > 0 {
                let _ = writeln!(
                    s,
                    "{}: {} extra deliveries over {} ids (e.g. {:?}); {} delivered without an acceptance",
                    f.flow,
                    f.duplicate_deliveries,
                    f.duplicate_ids,
                    f.duplicate_examples.iter().take(3).collect::<Vec<_>>(),
                    f.delivered_not_accepted
                );
            }
            if f.lost > 0 {
                let _ = writeln!(s, "{}: lost e.g. {:?}", f.flow, f.lost_examples);
            }
            if f.drain_after_run_ms > 1000.0 {
                let _ = writeln!(
                    s,
                    "{}: backlog drained {:.1}s after the load stopped",
                    f.flow,
                    f.drain_after_run_ms / 1000.0
                );
            }
        }
        let t = &self.target;
        let _ = writeln!(
            s,
            "\ntarget: {} posts, {} bad signatures, {} malformed, {} file downloads ok, failures {:?}",
            t.posts, t.bad_signature, t.malformed, t.file_downloads_ok, t.file_download_failures
        );
    }

    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "\n== switchyard-loadtest: {} mode, {} pod(s), {} tenants, {} channels, {:.0}s load, settle up to {:.0}s",
            self.mode, self.pods, self.tenants, self.channels, self.duration_s, self.settle_s
        );
        let _ = writeln!(s, "binary: {}", self.binary);
        let _ = writeln!(
            s,
            "host: {} CPUs, load average {} at the start, {} at the end",
            self.host.cpus, self.host.loadavg_start, self.host.loadavg_end
        );
        let chat = self.tenants > 0;
        if !chat {
            let _ = writeln!(
                s,
                "offered: no chat workload (--no-chat); setup {:.1}s",
                self.setup_s
            );
        }
        if chat {
            self.render_chat(&mut s);
        }
        if let Some(h) = &self.hosts {
            render_hosts(&mut s, h);
        }
        let pr = &self.probes;
        let _ = writeln!(
            s,
            "probes every 100ms: /livez p50 {:.1} p99 {:.1} max {:.1} ms; /readyz (pings the store) p50 {:.1} p99 {:.1} max {:.1} ms; loadtest timer lag p99 {:.1} max {:.1} ms",
            pr.livez_ms.p50,
            pr.livez_ms.p99,
            pr.livez_ms.max,
            pr.readyz_ms.p50,
            pr.readyz_ms.p99,
            pr.readyz_ms.max,
            pr.loadtest_timer_lag_ms.p99,
            pr.loadtest_timer_lag_ms.max
        );
        if !pr.slow.is_empty() {
            let list: Vec<String> = pr
                .slow
                .iter()
                .take(12)
                .map(|x| format!("{:.1}s {} {:.0}ms", x.at_s, x.probe, x.ms))
                .collect();
            let _ = writeln!(s, "slow probes (>250ms): {}", list.join(", "));
        }
        s.push_str(&render_resources(
            &self.pod_resources,
            &self.loadtest_process,
        ));
        if !self.recoveries.is_empty() {
            let _ = writeln!(s, "\nrecovery:");
            for r in &self.recoveries {
                let back = r
                    .all_channels_back_ms
                    .map(|ms| format!("all channels back after {:.0} ms", ms))
                    .unwrap_or_else(|| "no backend had to move".into());
                let _ = writeln!(
                    s,
                    "  {} {} at {:.1}s: {} backend(s) moved, {}",
                    r.action, r.pod, r.at_s, r.backends_affected, back
                );
                for c in &r.reconnects {
                    let _ = writeln!(
                        s,
                        "    tenant {} {} -> {} (close {}), down {:.0} ms, connector_id kept: {}, {} channels reopened, failures {:?}",
                        c.tenant,
                        c.from_pod,
                        c.to_pod,
                        c.close_code,
                        c.down_ms,
                        c.connector_id_kept,
                        c.channels_reopened,
                        c.channel_reopen_failures
                    );
                }
            }
        }
        if self.baselines.is_some() || self.ping_compare.is_some() {
            s.push('\n');
            s.push_str(&render_measures(
                self.baselines.as_ref(),
                self.ping_compare.as_ref(),
            ));
        }
        if let Some(b) = &self.baselines
            && let Some(inbound) = self
                .flows
                .iter()
                .find(|f| f.flow == "inbound" && f.sent > 0)
        {
            for x in b.postgres.iter().chain(b.sqlite.iter()) {
                let mine = (self.mode == "cluster") == (x.store == "postgres");
                let _ = writeln!(
                    s,
                    "delivered/baseline = {:.3}  (inbound delivered {:.1}/s vs {} {:.0} rows/s{})",
                    ratio(inbound.delivered_per_s, x.rows_per_s),
                    inbound.delivered_per_s,
                    x.store,
                    x.rows_per_s,
                    if mine {
                        format!(", the store of {} mode", self.mode)
                    } else {
                        ", for reference only".to_owned()
                    }
                );
            }
        }
        s.push_str(&crate::figures::render(&self.figures));
        if self.schema_violations > 0 {
            let _ = writeln!(
                s,
                "\nschema violations: {} (e.g. {:?})",
                self.schema_violations,
                self.schema_violation_examples
                    .iter()
                    .take(3)
                    .collect::<Vec<_>>()
            );
        }
        for n in &self.notes {
            let _ = writeln!(s, "note: {n}");
        }
        if self.problems.is_empty() {
            let _ = writeln!(
                s,
                "\nverdict: OK (no loss, no unexpected duplicates, no errors)"
            );
        } else {
            let _ = writeln!(s, "\nverdict: PROBLEMS");
            for p in &self.problems {
                let _ = writeln!(s, "  - {p}");
            }
        }
        let t = &self.thresholds;
        if t.max_p99_ms.is_some()
            || t.max_lost.is_some()
            || t.max_dup.is_some()
            || t.min_rate_per_s.is_some()
        {
            let _ = writeln!(
                s,
                "distinct deliveries/s over the load, all flows: {:.1}",
                total_delivered_per_s(&self.flows, self.duration_s)
            );
            if self.breaches.is_empty() {
                let _ = writeln!(s, "thresholds: met");
            } else {
                let _ = writeln!(s, "thresholds: BREACHED (exit status {EXIT_THRESHOLD})");
                for b in &self.breaches {
                    let _ = writeln!(s, "  - {b}");
                }
            }
        }
        s
    }
}

/// The agent-host section: one line of figures, then correctness and what went wrong.
fn render_hosts(s: &mut String, h: &HostsReport) {
    let _ = writeln!(
        s,
        "\nagent hosts: {} simulated hosts, {} runs/s offered, {} events per run {}",
        h.hosts,
        h.run_rate,
        h.events_per_run,
        if h.event_interval_ms > 0.0 {
            format!("{} ms apart", h.event_interval_ms)
        } else {
            "sent at once".to_owned()
        }
    );
    let _ = writeln!(
        s,
        "{:<6} {:>7} {:>7} {:>8} {:>8} {:>8} {:>5} {:>7} {:>7} | {:>8} {:>8} {:>9} | {:>7} {:>7} | {:>7} {:>7} | {:>7} {:>7} {:>8}",
        "",
        "started",
        "acked",
        "dispatch",
        "complete",
        "verified",
        "lost",
        "dupRuns",
        "redisp",
        "start/s",
        "done/s",
        "events/s",
        "ack50",
        "ack99",
        "disp50",
        "disp99",
        "run50",
        "run99",
        "runmax"
    );
    let _ = writeln!(
        s,
        "{:<6} {:>7} {:>7} {:>8} {:>8} {:>8} {:>5} {:>7} {:>7} | {:>8.1} {:>8.1} {:>9.1} | {:>7.1} {:>7.1} | {:>7.1} {:>7.1} | {:>7.1} {:>7.1} {:>8.1}",
        "runs",
        h.started,
        h.acked,
        h.dispatched,
        h.completed,
        h.verified,
        h.lost,
        h.duplicate_runs,
        h.redispatches,
        h.started_per_s,
        h.completed_per_s,
        h.events_stored_per_s,
        h.ack_latency_ms.p50,
        h.ack_latency_ms.p99,
        h.dispatch_latency_ms.p50,
        h.dispatch_latency_ms.p99,
        h.run_latency_ms.p50,
        h.run_latency_ms.p99,
        h.run_latency_ms.max,
    );
    let _ = writeln!(
        s,
        "(ms; ack = agent_run_start sent -> its ack; disp = agent_run_start sent -> create_run at the host; run = agent_run_start sent -> agent_run_wait answered completed)"
    );
    let _ = writeln!(
        s,
        "events: {} sent by the hosts ({} more replayed for re-sent create_runs), {} read back from completed runs' logs, {} progress pushes to xAgent; {} create_run(s) arrived before their start ack",
        h.events_sent,
        h.events_replayed,
        h.events_stored,
        h.progress_pushes,
        h.dispatched_before_ack
    );
    let _ = writeln!(
        s,
        "correctness: every acked run completed once: {}; logs exact (seq 1..={}, one completion, last): {} of {}; create_run for unknown runs: {}; re-dispatched create_runs: {}",
        if h.lost == 0 && h.not_completed.is_empty() && h.duplicate_runs == 0 {
            "yes".to_owned()
        } else {
            format!(
                "NO ({} lost, {} duplicated, other ends {:?})",
                h.lost, h.duplicate_runs, h.not_completed
            )
        },
        h.events_per_run,
        h.verified,
        h.completed,
        h.unknown_create_runs,
        h.redispatches
    );
    if !h.errors.is_empty() || !h.refused.is_empty() || !h.gave_up.is_empty() {
        let _ = writeln!(
            s,
            "hosts: {} tool calls in all; failed attempts {:?}; refused {:?}; gave up {:?}",
            h.attempts, h.errors, h.refused, h.gave_up
        );
    }
    if h.never_dispatched > 0 || h.dispatched_not_acked > 0 {
        let _ = writeln!(
            s,
            "hosts: {} acked run(s) never reached a host; {} run(s) reached a host although their start call got no ack",
            h.never_dispatched, h.dispatched_not_acked
        );
    }
    if !h.host_errors.is_empty() || !h.host_unexpected.is_empty() {
        let _ = writeln!(
            s,
            "hosts: server errors to the hosts {:?}; unexpected messages {:?}",
            h.host_errors, h.host_unexpected
        );
    }
    if !h.moves.is_empty() {
        let worst = h.moves.iter().map(|m| m.down_ms).fold(0.0, f64::max);
        let _ = writeln!(
            s,
            "hosts: {} socket(s) moved to another pod (longest {:.0} ms down):",
            h.moves.len(),
            worst
        );
        for m in h.moves.iter().take(20) {
            let _ = writeln!(
                s,
                "    {} {} {} -> {} at {:.1}s, down {:.0} ms ({})",
                m.side, m.host, m.from_pod, m.to_pod, m.at_s, m.down_ms, m.why
            );
        }
    } else {
        for d in &h.host_disconnects {
            let _ = writeln!(s, "hosts: socket ended: {d}");
        }
    }
    for v in h.verify_failure_examples.iter().take(3) {
        let _ = writeln!(s, "hosts: log mismatch {v}");
    }
}

/// The pods' and the loadtest's memory and CPU, as the text report shows them.
pub fn render_resources(pods: &[PodReport], loadtest: &ProcSample) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nresources (VmRSS / VmHWM from /proc, CPU = utime+stime):"
    );
    for p in pods {
        if p.pid == 0 && p.rss_kib == 0 {
            // --target --metrics-url without process_* series: only the scrape to report.
            let _ = writeln!(
                s,
                "  {:<8} /metrics scraped: {} switchyard_* samples, no process_* series (CPU/RSS need --pod-pid)",
                p.name,
                p.metrics.len()
            );
            continue;
        }
        let _ = writeln!(
            s,
            "  {:<8} pid {:<7} {:<8} RSS {:>7.1} MiB  peak {:>7.1} MiB  CPU {:>6.1} s over {:>5.1} s",
            p.name,
            p.pid,
            format!("{:?}", p.state).to_lowercase(),
            p.rss_kib as f64 / 1024.0,
            p.peak_rss_kib as f64 / 1024.0,
            p.cpu_seconds,
            p.uptime_s
        );
    }
    let _ = writeln!(
        s,
        "  loadtest                      RSS {:>7.1} MiB  peak {:>7.1} MiB  CPU {:>6.1} s",
        loadtest.rss_kib as f64 / 1024.0,
        loadtest.peak_rss_kib as f64 / 1024.0,
        loadtest.cpu_seconds
    );
    s
}
