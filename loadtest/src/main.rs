//! `switchyard-loadtest`: starts real Switchyard pods, binds channels of simulated xAgent
//! backends to a fake webhook target, offers load on four flows and reports throughput,
//! latency, loss and duplicates (counted by `message_id`) and the pods' memory and CPU.
//! With `--hosts N` it also runs simulated agent hosts and starts runs on them through
//! xAgent device channels (runs counted by `run_id`). See `loadtest/README.md`.

mod args;
mod bare;
mod baseline;
mod fdlimit;
mod figures;
mod hosts;
mod html;
mod idle;
mod pods;
mod probe;
mod report;
mod scenario;
mod series;
mod stages;
mod stats;
mod target;
mod workload;
mod xagent;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use clap::Parser;
use tokio_util::sync::CancellationToken;

use crate::args::{Args, Mode};
use crate::baseline::Baselines;
use crate::figures::Figure;
use crate::pods::{Fleet, PodState, proc_sample};
use crate::probe::Probes;
use crate::report::{BackendReport, EXIT_PROBLEMS, Host, PodReport, Rates, Report, Thresholds};
use crate::scenario::Events;
use crate::stats::Flows;
use crate::target::Target;
use crate::workload::Ctx;
use crate::xagent::{Backend, CARD_ID};

#[tokio::main]
async fn main() {
    let mut argv = std::env::args().skip(1);
    if argv.next().as_deref() == Some(bare::CHILD_ARG) {
        bare::child_main(argv.next()).await;
        return;
    }
    let mut args = Args::parse();
    args.normalize();
    if let Err(e) = args.validate() {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    match run(args).await {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}

async fn run(args: Args) -> anyhow::Result<i32> {
    // Before any pod starts: the pods inherit this process's limits.
    let (fd_limit, fd_note) = fdlimit::raise();
    println!("{fd_note}");
    if args.idle_sockets > 0 {
        let need = args.idle_sockets as u64 + idle::FD_MARGIN;
        if fd_limit < need {
            eprintln!(
                "error: --idle-sockets {} needs at least {need} open files in the loadtest and in the pods (one per socket plus {}), but the limit is {fd_limit}; raise it in the shell first (`ulimit -n {need}`; above the hard limit `ulimit -Hn` only root can) or use fewer sockets",
                args.idle_sockets,
                idle::FD_MARGIN
            );
            return Ok(2);
        }
    }
    let bin = if args.target_mode() {
        PathBuf::from("(existing deployment)")
    } else {
        let b = pods::find_binary(args.bin.as_deref())?;
        println!("using switchyard binary {}", b.display());
        b
    };
    let (dir, temp) = match &args.work_dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            (d.canonicalize()?, None)
        }
        None => {
            let t = tempfile::Builder::new()
                .prefix("switchyard-loadtest-")
                .tempdir()?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    let fleet = match &args.target {
        Some(t) => {
            println!(
                "target mode: every flow goes to the deployment at {t}; metrics and logs in {}",
                dir.display()
            );
            Arc::new(Fleet::external(&args, dir.clone())?)
        }
        None => {
            println!("pod data and logs in {}", dir.display());
            Arc::new(Fleet::prepare(&args, bin.clone(), dir.clone()).await?)
        }
    };
    let outcome = tokio::select! {
        r = load(&args, fleet.clone(), &bin, fd_limit) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    fleet.stop_all().await;
    for n in fleet.cleanup_shared().await {
        println!("{n}");
    }
    if outcome.is_err() && args.work_dir.is_none() {
        // Keep the pods' logs of a failed run: they are the evidence.
        if let Some(g) = temp {
            let kept: PathBuf = g.keep();
            eprintln!("pod logs kept in {}", kept.display());
        }
    }
    outcome
}

async fn load(
    args: &Args,
    fleet: Arc<Fleet>,
    bin: &std::path::Path,
    fd_limit: u64,
) -> anyhow::Result<i32> {
    let tag = hex::encode(rand::random::<[u8; 4]>());
    let mut notes = Vec::new();
    let setup_started = Instant::now();

    fleet.migrate().await?;
    let mut tenants = Vec::new();
    if args.target_mode() {
        // The deployment's own tenants: their keys were given, nothing is created; several
        // backends (connectors, one socket each) may share a key.
        tenants = (0..args.tenants)
            .map(|i| {
                let k = &args.api_keys[i % args.api_keys.len()];
                (String::new(), k.trim().to_owned())
            })
            .collect();
    } else if !args.no_chat {
        for i in 0..args.tenants {
            tenants.push(fleet.create_tenant(&format!("loadtest-{tag}-{i}")).await?);
        }
    }
    // The hosts' tenant and the hosts themselves (`switchyard host enroll`), made before the
    // pods start like the tenants; the pods enroll them over HTTP once they serve.
    let host_tenant = if args.hosts > 0 {
        let (tenant_id, key) = fleet
            .create_tenant(&format!("loadtest-{tag}-hosts"))
            .await?;
        let minted = hosts::mint(&fleet, &tenant_id, &tag, args.hosts).await?;
        println!(
            "{} hosts created with `switchyard host enroll` for tenant {tenant_id}",
            minted.len()
        );
        Some((key, minted))
    } else {
        None
    };
    // --ping-compare needs a tenant's key; --no-chat has none of its own.
    let ping_key = match (args.ping_compare, tenants.first()) {
        (false, _) => None,
        (true, Some((_, key))) => Some(key.clone()),
        (true, None) => Some(
            fleet
                .create_tenant(&format!("loadtest-{tag}-ping"))
                .await?
                .1,
        ),
    };
    // The store's own limits, before the pods run, so nothing competes with them.
    let baselines = if args.baseline {
        Some(measure_baselines(args, &fleet, &tag).await)
    } else {
        None
    };
    for _ in 0..if args.target_mode() {
        0
    } else {
        args.pod_count()
    } {
        let pod = fleet.start_pod().await?;
        println!("{} ready at {} (pid {})", pod.name, pod.base_url, pod.pid);
    }
    let ping = match ping_key {
        Some(key) => {
            let pod = fleet.serving().first().cloned().context("no pod")?;
            let sim =
                switchyard_xagent_sim::Sim::new(&format!("{}/webhook", pod.base_url), Some(&key))?
                    .with_frame_recording(false)
                    .with_request_timeout(Duration::from_secs(30));
            println!(
                "ping compare: {} socket(s), {:?} against {} and then against a bare tokio-tungstenite server",
                args.ping_sockets, args.ping_duration, pod.name
            );
            let r = bare::ping_compare(
                &sim,
                CARD_ID,
                &["xagent.im.v2"],
                args.ping_sockets,
                args.ping_duration,
            )
            .await
            .context("--ping-compare")?;
            println!("{}", r.line());
            Some(r)
        }
        None => None,
    };
    if args.idle_sockets > 0 {
        let keys = tenants.into_iter().map(|(_, k)| k).collect();
        return idle_load(args, fleet, bin, keys, baselines, ping, fd_limit).await;
    }

    let flows = Arc::new(Flows::new(Instant::now()));
    let secrets: Vec<String> = (0..args.tenants)
        .map(|_| hex::encode(rand::random::<[u8; 16]>()))
        .collect();
    let target = Target::start(
        secrets.clone(),
        flows.clone(),
        &args.webhook_listen,
        args.webhook_public_url.as_deref(),
    )
    .await?;
    println!(
        "fake webhook target: channels post to {}/hook/<n>",
        target.base()
    );
    let backends: Vec<Arc<Backend>> = tenants
        .into_iter()
        .enumerate()
        .map(|(i, (_tenant_id, key))| {
            Backend::new(
                i,
                key,
                secrets[i].clone(),
                target.endpoint(i),
                fleet.clone(),
                flows.clone(),
            )
        })
        .collect();
    let per = args.channels / args.tenants;
    let extra = args.channels % args.tenants;
    let setups = backends
        .iter()
        .enumerate()
        .map(|(i, b)| b.setup(per + usize::from(i < extra)));
    for (i, r) in futures::future::join_all(setups)
        .await
        .into_iter()
        .enumerate()
    {
        r.with_context(|| format!("setting up tenant {i}"))?;
    }
    let channels = workload::interleave(backends.iter().map(|b| b.channels()).collect());
    let run_stats = hosts::RunStats::new(&tag);
    let host_stop = CancellationToken::new();
    let sim_hosts = match host_tenant {
        Some((key, minted)) => hosts::setup(
            &fleet,
            minted,
            &key,
            hosts::Pace {
                events_per_run: args.events_per_run,
                event_interval: args.event_interval,
            },
            run_stats.clone(),
            host_stop.clone(),
        )
        .await
        .context("setting up the simulated hosts")?,
        None => Vec::new(),
    };
    let setup_s = setup_started.elapsed().as_secs_f64();
    if !args.no_chat {
        println!(
            "{} channels bound across {} tenants",
            channels.len(),
            backends.len(),
        );
    }
    if !sim_hosts.is_empty() {
        println!(
            "{} hosts online, each with a bound device channel ({} runs/s, {} events per run, {:?} apart)",
            sim_hosts.len(),
            args.run_rate,
            args.events_per_run,
            args.event_interval
        );
    }
    println!(
        "setup took {setup_s:.1}s; offering load for {:?}",
        args.duration
    );
    if let Some(p) = args.inbound_profile().filter(|_| args.ramp.is_some()) {
        println!(
            "inbound stages: {}; {:.0} messages in all",
            p.stages
                .iter()
                .map(|s| format!("{}/s -> {}/s over {}s", s.from_per_s, s.to_per_s, s.seconds))
                .collect::<Vec<_>>()
                .join(", "),
            p.expected_ops()
        );
    }

    let mut file_rate = args.file_rate;
    if file_rate > 0.0 && !fleet.shared_files && !args.no_chat {
        file_rate = 0.0;
        notes.push(
            "file flow skipped: cluster pods need a shared file store and no --s3-bucket was given"
                .into(),
        );
        println!("note: {}", notes[notes.len() - 1]);
    }

    let stop = CancellationToken::new();
    for b in &backends {
        tokio::spawn(b.clone().supervise(stop.child_token()));
    }
    let loadavg_start = Host::loadavg();
    let start = Instant::now();
    flows.begin(start);
    run_stats.begin(start);
    for b in &backends {
        b.begin(start);
    }
    let until = tokio::time::Instant::from_std(start + args.duration);
    let deadline = until + args.settle;
    let ctx = Arc::new(Ctx {
        backends: backends.clone(),
        channels,
        flows: flows.clone(),
        fleet: fleet.clone(),
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(args.concurrency)
            .timeout(Duration::from_secs(30))
            .build()?,
        tag: tag.clone(),
        filler: "x".repeat(args.text_bytes),
        file: Bytes::from(
            (0..args.file_bytes)
                .map(|i| (i % 251) as u8)
                .collect::<Vec<u8>>(),
        ),
        deadline,
    });

    let events = Arc::new(Events::default());
    let disrupted = args.kill_pod_at.is_some() || args.rolling_restart;
    if let Some(at) = args.kill_pod_at {
        tokio::spawn(scenario::kill_pod(
            fleet.clone(),
            args.mode,
            start,
            at,
            events.clone(),
        ));
    }
    if args.rolling_restart {
        tokio::spawn(scenario::rolling_restart(
            fleet.clone(),
            args.mode,
            start,
            args.duration / 4,
            events.clone(),
        ));
    }
    // --no-chat turns every chat flow off (an inbound rate of 0 would mean "unlimited").
    let chat_profile = |rate: f64| {
        if args.no_chat {
            None
        } else {
            args.flow_profile(rate)
        }
    };
    let profiles = [
        if args.no_chat {
            None
        } else {
            args.inbound_profile()
        },
        chat_profile(args.tool_rate),
        chat_profile(args.outbound_rate),
        chat_profile(file_rate),
    ];
    let sampler = tokio::spawn(series::run(
        series::Watch {
            sources: series::Sources {
                fleet: fleet.clone(),
                metrics_urls: args.metrics_urls.clone(),
                pod_pids: args.pod_pids.clone(),
            },
            flows: flows.clone(),
            profiles: profiles.clone(),
            runs: (!sim_hosts.is_empty()).then(|| run_stats.clone()),
            start,
            total: args.duration,
            show_progress: !args.no_progress,
        },
        stop.clone(),
    ));
    let probes = Probes::default();
    let prober = tokio::spawn(probes.clone().run(
        fleet.clone(),
        args.metrics_urls.clone(),
        start,
        stop.clone(),
    ));

    let c = ctx.clone();
    let inbound = async {
        if args.no_chat {
            0
        } else {
            workload::drive(profiles[0].as_ref(), args.concurrency, until, move |n| {
                workload::inbound(c.clone(), n)
            })
            .await
        }
    };
    let c = ctx.clone();
    let tool = optional(
        profiles[1].as_ref(),
        workload::SOCKET_FLOW_CAP,
        until,
        move |n| workload::tool(c.clone(), n),
    );
    let c = ctx.clone();
    let outbound = optional(
        profiles[2].as_ref(),
        workload::SOCKET_FLOW_CAP,
        until,
        move |n| workload::outbound(c.clone(), n),
    );
    let c = ctx.clone();
    let file = optional(
        profiles[3].as_ref(),
        workload::SOCKET_FLOW_CAP,
        until,
        move |n| workload::file(c.clone(), n),
    );
    // Each run op lasts until its run is verified or the settle deadline passes.
    let hosts_ctx = Arc::new(hosts::HostsCtx {
        hosts: sim_hosts.clone(),
        stats: run_stats.clone(),
        events_per_run: args.events_per_run,
        deadline,
    });
    let run_pace =
        (!sim_hosts.is_empty()).then(|| stages::Profile::constant(args.run_rate, args.duration));
    let host_runs = optional(
        run_pace.as_ref(),
        workload::SOCKET_FLOW_CAP,
        until,
        move |n| hosts::run_op(hosts_ctx.clone(), n),
    );
    tokio::join!(inbound, tool, outbound, file, host_runs);
    let loadavg_end = Host::loadavg();
    let run_end = start + args.duration;

    // Settle: accepted work still on its way gets until the deadline to arrive.
    while tokio::time::Instant::now() < deadline {
        if flows.all().iter().all(|f| f.outstanding() == 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Late duplicates show up shortly after the last delivery; give them a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    fleet.sample_all();
    let loadtest_process = proc_sample(std::process::id(), fleet.clk_tck).unwrap_or_default();
    stop.cancel();
    let series = sampler.await.unwrap_or_default();
    let _ = prober.await;

    let flow_reports: Vec<_> = flows
        .all()
        .iter()
        .map(|f| f.report(args.duration, run_end))
        .collect();
    let reconnects: Vec<_> = backends.iter().flat_map(|b| b.reconnects()).collect();
    let event_list = events.list();
    let mut violations: Vec<String> = backends
        .iter()
        .flat_map(|b| b.schema_violations())
        .chain(hosts::schema_violations(&sim_hosts))
        .collect();
    violations.sort();
    violations.dedup();
    let mut pod_resources = Vec::new();
    if args.target_mode() {
        pod_resources = target_resources(args, &fleet).await;
    }
    for p in fleet.all().into_iter().filter(|p| !p.is_external()) {
        let s = p.sample(fleet.clk_tck).unwrap_or_default();
        let metrics = if p.state() == PodState::Serving {
            p.scrape_metrics().await
        } else {
            Vec::new()
        };
        pod_resources.push(PodReport {
            name: p.name.clone(),
            pid: p.pid,
            state: p.state(),
            rss_kib: s.rss_kib,
            peak_rss_kib: s.peak_rss_kib,
            cpu_seconds: s.cpu_seconds,
            uptime_s: p.started.elapsed().as_secs_f64(),
            log: p.log.display().to_string(),
            metrics,
        });
    }
    for b in &backends {
        b.close().await;
    }
    let hosts_report = (!sim_hosts.is_empty()).then(|| {
        run_stats.report(
            &sim_hosts,
            args.run_rate,
            hosts::Pace {
                events_per_run: args.events_per_run,
                event_interval: args.event_interval,
            },
            args.duration,
            disrupted,
        )
    });
    host_stop.cancel();
    hosts::close(&sim_hosts).await;
    let mut report = Report {
        command: command_line(),
        binary: bin.display().to_string(),
        mode: match args.mode {
            _ if args.target_mode() => "target".into(),
            Mode::Embedded => "embedded".into(),
            Mode::Cluster => "cluster".into(),
        },
        pods: args.pod_count(),
        tenants: if args.no_chat { 0 } else { args.tenants },
        channels: if args.no_chat { 0 } else { args.channels },
        duration_s: args.duration.as_secs_f64(),
        settle_s: args.settle.as_secs_f64(),
        rates: Rates {
            // With --ramp: its peak (the stages are in `stages`).
            inbound_per_s: args.ramp.as_ref().map_or(args.inbound_rate, |r| r.peak()),
            inbound_concurrency: args.concurrency,
            tool_per_s: args.tool_rate,
            outbound_per_s: args.outbound_rate,
            file_per_s: file_rate,
        },
        setup_s,
        host: Host {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            loadavg_start,
            loadavg_end,
        },
        flows: flow_reports,
        hosts: hosts_report,
        target: target.report(),
        probes: probes.report(),
        pod_resources,
        loadtest_process,
        recoveries: scenario::recoveries(&event_list, &reconnects),
        events: event_list,
        reconnects,
        backends: backends
            .iter()
            .map(|b| BackendReport {
                tenant: b.index,
                channels: b.channels().len(),
                inbound_timeline_per_s: b.inbound_timeline(),
            })
            .collect(),
        schema_violations: violations.len(),
        schema_violation_examples: violations.into_iter().take(20).collect(),
        notes,
        problems: Vec::new(),
        figures: Vec::new(),
        baselines,
        ping_compare: ping,
        target_url: args.target.clone(),
        webhook_url: target.base().to_owned(),
        stages: args.ramp.is_some().then(|| profiles[0].clone()).flatten(),
        thresholds: Thresholds {
            max_p99_ms: args.max_p99.map(|d| d.as_secs_f64() * 1000.0),
            max_lost: args.max_lost,
            max_dup: args.max_dup,
            min_rate_per_s: args.min_rate,
        },
        breaches: Vec::new(),
        series,
    };
    report.figures = workload_figures(&report);
    report.judge(disrupted);
    print!("{}", report.render());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("json report written to {}", path.display());
    }
    if let Some(path) = html_path(args) {
        std::fs::write(&path, html::render(&report))
            .with_context(|| format!("writing {}", path.display()))?;
        println!("html report written to {}", path.display());
    }
    Ok(report.exit_code())
}

/// `--html`, else beside `--json` with the extension `.html`.
fn html_path(args: &Args) -> Option<PathBuf> {
    args.html
        .clone()
        .or_else(|| args.json.as_ref().map(|j| j.with_extension("html")))
}

/// The command line as the reports keep it, without the value of `--api-key`.
fn command_line() -> String {
    redact_command(std::env::args())
}

fn redact_command(argv: impl Iterator<Item = String>) -> String {
    let mut out = Vec::new();
    let mut hide_next = false;
    for a in argv {
        if hide_next {
            out.push("***".to_owned());
            hide_next = false;
        } else if a == "--api-key" {
            out.push(a);
            hide_next = true;
        } else if a.starts_with("--api-key=") {
            out.push("--api-key=***".to_owned());
        } else {
            out.push(a);
        }
    }
    out.join(" ")
}

/// `--target`: each `--pod-pid` from /proc and each `--metrics-url`'s final scrape (its
/// `switchyard_*` samples, the whole text saved in the work dir).
async fn target_resources(args: &Args, fleet: &Fleet) -> Vec<PodReport> {
    let mut out = Vec::new();
    for pid in &args.pod_pids {
        let s = proc_sample(*pid, fleet.clk_tck).unwrap_or_default();
        out.push(PodReport {
            name: format!("pid-{pid}"),
            pid: *pid,
            state: PodState::Serving,
            rss_kib: s.rss_kib,
            peak_rss_kib: s.peak_rss_kib,
            cpu_seconds: s.cpu_seconds,
            uptime_s: pods::proc_uptime(*pid, fleet.clk_tck).unwrap_or(0.0),
            log: String::new(),
            metrics: Vec::new(),
        });
    }
    for (i, url) in args.metrics_urls.iter().enumerate() {
        let name = format!("metrics-{i}");
        let Some(text) = pods::fetch_metrics(url.trim_end_matches('/')).await else {
            println!("note: {url}/metrics did not answer at the end of the run");
            continue;
        };
        let saved = fleet.dir().join(format!("{name}.metrics"));
        let _ = std::fs::write(&saved, &text);
        let (rss, cpu) = series::process_metrics(&text);
        out.push(PodReport {
            name,
            pid: 0,
            state: PodState::Serving,
            rss_kib: rss.map_or(0, |b| (b / 1024.0) as u64),
            peak_rss_kib: 0,
            cpu_seconds: cpu.unwrap_or(0.0),
            uptime_s: 0.0,
            log: saved.display().to_string(),
            metrics: pods::switchyard_samples(&text),
        });
    }
    out
}

/// A flow without a profile is off.
async fn optional<F, Fut>(
    pace: Option<&stages::Profile>,
    cap: usize,
    until: tokio::time::Instant,
    op: F,
) -> u64
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    match pace {
        Some(p) => workload::drive(Some(p), cap, until, op).await,
        None => 0,
    }
}

/// `--baseline`: Postgres (cluster: the run's schema; embedded: a schema of its own, if
/// `--postgres-url` answers) and SQLite next to the pods' data. A store that cannot be
/// measured is a note, not a failed run.
async fn measure_baselines(args: &Args, fleet: &Fleet, tag: &str) -> Baselines {
    let mut b = Baselines::default();
    let (schema, own) = match fleet.pg_schema() {
        Some(s) => (s.to_owned(), false),
        None => (format!("loadtest_baseline_{tag}"), true),
    };
    println!(
        "baseline: {} connections of single-row INSERTs on {} for {} s...",
        baseline::PG_CONNECTIONS,
        args.postgres_url,
        baseline::PG_SECONDS
    );
    match baseline::postgres(&args.postgres_url, &schema, own).await {
        Ok(x) => {
            println!("{}", x.line());
            b.postgres = Some(x);
        }
        Err(e) => {
            let n = format!("Postgres baseline not measured: {e:#}");
            println!("note: {n}");
            b.notes.push(n);
        }
    }
    let dir = fleet.dir().join("baseline-sqlite");
    println!(
        "baseline: SQLite WAL + synchronous=FULL commits in {} for {} s...",
        dir.display(),
        baseline::SQLITE_SECONDS
    );
    match baseline::sqlite(&dir).await {
        Ok(x) => {
            println!("{}", x.line());
            b.sqlite = Some(x);
        }
        Err(e) => {
            let n = format!("SQLite baseline not measured: {e:#}");
            println!("note: {n}");
            b.notes.push(n);
        }
    }
    b
}

/// The message workload's figures: delivered inbound next to the store's baseline of the
/// mode, and ping/pong next to the bare server.
fn workload_figures(r: &Report) -> Vec<Figure> {
    let mut f = Vec::new();
    if let Some(b) = &r.baselines
        && let Some(inbound) = r.flows.iter().find(|x| x.flow == "inbound" && x.sent > 0)
    {
        let store = if r.mode == "cluster" {
            b.postgres.as_ref()
        } else {
            b.sqlite.as_ref()
        };
        if let Some(s) = store {
            f.push(Figure::new(
                format!("inbound delivered ({} mode, {} pod(s))", r.mode, r.pods),
                inbound.delivered_per_s,
                "msgs/s",
                if s.store == "postgres" {
                    "Postgres 16-connection single-row INSERT"
                } else {
                    "SQLite WAL synchronous=FULL one row per transaction"
                },
                s.rows_per_s,
                "rows/s",
                // Issue 26's goals: a cluster at half the INSERT rate, one node at 0.6x of
                // SQLite's single-row commits.
                if s.store == "postgres" {
                    "goal >= 0.5x"
                } else {
                    "goal >= 0.6x"
                },
            ));
        }
    }
    f.extend(r.ping_compare.as_ref().map(ping_figure));
    f
}

fn ping_figure(p: &bare::PingCompare) -> Figure {
    Figure::new(
        format!("/ws ping/pong round trips ({} socket(s))", p.pod.sockets),
        p.pod.round_trips_per_s,
        "round trips/s",
        "bare tokio-tungstenite echo server, same client",
        p.bare.round_trips_per_s,
        "round trips/s",
        "goal >= 0.8x",
    )
}

/// What an idle-socket run writes as JSON.
#[derive(serde::Serialize)]
struct IdleRun {
    command: String,
    binary: String,
    mode: String,
    pods: usize,
    host: Host,
    hold_s: f64,
    baselines: Option<Baselines>,
    ping_compare: Option<bare::PingCompare>,
    idle: idle::IdleReport,
    figures: Vec<Figure>,
    pod_resources: Vec<PodReport>,
    loadtest_process: pods::ProcSample,
    events: Vec<scenario::Event>,
    problems: Vec<String>,
}

/// `--idle-sockets`: sockets, then channels, in 10 steps each; then they are held for
/// `--duration`, with `--kill-pod-at` counted from the start of that hold.
async fn idle_load(
    args: &Args,
    fleet: Arc<Fleet>,
    bin: &std::path::Path,
    keys: Vec<String>,
    baselines: Option<Baselines>,
    ping: Option<bare::PingCompare>,
    fd_limit: u64,
) -> anyhow::Result<i32> {
    let loadavg_start = Host::loadavg();
    let idle = idle::Idle::new(
        fleet.clone(),
        keys,
        args.idle_sockets,
        fd_limit,
        args.reopen_in_flight,
    );
    let hello_ack = idle.probe_hello().await.context("probe hello")?;
    // The bare server is a process of its own (with the same limit as this one).
    let bare_n = args
        .idle_sockets
        .min(fd_limit.saturating_sub(idle::FD_MARGIN) as usize);
    println!(
        "connect + hello against a bare tokio-tungstenite server: {bare_n} sockets, {} in flight...",
        idle::CONNECT_CONCURRENCY
    );
    let bare = idle.bare_connect(hello_ack, bare_n).await?;
    println!(
        "bare server: {:.0} sockets/s (p50 {:.1} p99 {:.1} ms, {} failed)",
        bare.rate_per_s, bare.latency_ms.p50, bare.latency_ms.p99, bare.failed
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_baseline: u64 = fleet
        .serving()
        .iter()
        .filter_map(|p| proc_sample(p.pid, fleet.clk_tck))
        .map(|s| s.rss_kib)
        .sum();
    println!(
        "pods' RSS before any socket: {:.1} MiB; opening {} sockets in 10 steps, {} in flight",
        rss_baseline as f64 / 1024.0,
        args.idle_sockets,
        idle::CONNECT_CONCURRENCY
    );
    let phase1_started = Instant::now();
    let socket_steps = idle.open_sockets(rss_baseline).await;
    let phase1_s: f64 = socket_steps.iter().map(|s| s.seconds).sum();
    let opened: usize = socket_steps.iter().map(|s| s.attempted - s.failed).sum();
    let rss_sockets = socket_steps.last().map_or(rss_baseline, |s| s.rss_kib);
    let channel_steps = if args.channels_per_socket > 0 {
        println!(
            "opening {} channels per socket in 10 steps, {} in flight",
            args.channels_per_socket,
            idle::OPEN_CONCURRENCY
        );
        idle.open_channels(args.channels_per_socket, rss_sockets)
            .await
    } else {
        Vec::new()
    };
    let rss_channels = channel_steps.last().map_or(rss_sockets, |s| s.rss_kib);
    println!(
        "setup took {:.1}s; holding the sockets for {:?}",
        phase1_started.elapsed().as_secs_f64(),
        args.duration
    );

    let stop = CancellationToken::new();
    idle.supervise(stop.clone());
    let events = Arc::new(Events::default());
    let start = Instant::now();
    if let Some(at) = args.kill_pod_at {
        tokio::spawn(scenario::kill_pod(
            fleet.clone(),
            args.mode,
            start,
            at,
            events.clone(),
        ));
    }
    let sampler_stop = CancellationToken::new();
    let sampler = tokio::spawn({
        let fleet = fleet.clone();
        let stop = sampler_stop.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => fleet.sample_all(),
                }
            }
        }
    });
    tokio::time::sleep(args.duration).await;
    // After a disruption, the moved sockets get until the settle time to be back.
    if args.kill_pod_at.is_some() {
        let deadline = Instant::now() + args.settle;
        while idle.moving() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    stop.cancel();
    fleet.sample_all();
    let loadtest_process = proc_sample(std::process::id(), fleet.clk_tck).unwrap_or_default();
    sampler_stop.cancel();
    let _ = sampler.await;
    let event_list = events.list();
    let (sockets_open, channels_open) = idle.counts();
    let report = idle::IdleReport {
        sockets: args.idle_sockets,
        channels_per_socket: args.channels_per_socket,
        tenants: args.tenants,
        pods: args.pod_count(),
        connect_concurrency: idle::CONNECT_CONCURRENCY,
        open_concurrency: idle::OPEN_CONCURRENCY,
        reopen_per_socket: args.reopen_in_flight,
        fd_limit: idle.fd_limit,
        rss_baseline_kib: rss_baseline,
        rss_sockets_kib: rss_sockets,
        rss_channels_kib: rss_channels,
        kib_per_socket: socket_steps.last().map_or(0.0, |s| s.kib_per_socket),
        kib_per_channel: channel_steps.last().map_or(0.0, |s| s.kib_per_channel),
        connect_hello_per_s: opened as f64 / phase1_s.max(1e-9),
        bare_connect: Some(bare),
        socket_steps,
        channel_steps,
        sockets_open,
        channels_open,
        errors: idle.errors(),
        reconnect_retries: idle.retries(),
        recoveries: idle.recoveries(&event_list),
        socket_closes: idle.closes(),
        schema_violations: idle.violations(),
    };
    let mut figures = report.figures();
    figures.extend(ping.as_ref().map(ping_figure));
    let mut pod_resources = Vec::new();
    for p in fleet.all() {
        let s = p.sample(fleet.clk_tck).unwrap_or_default();
        pod_resources.push(PodReport {
            name: p.name.clone(),
            pid: p.pid,
            state: p.state(),
            rss_kib: s.rss_kib,
            peak_rss_kib: s.peak_rss_kib,
            cpu_seconds: s.cpu_seconds,
            uptime_s: p.started.elapsed().as_secs_f64(),
            log: p.log.display().to_string(),
            metrics: Vec::new(),
        });
    }
    idle.close_all().await;
    let problems = report.problems();
    let run = IdleRun {
        command: command_line(),
        binary: bin.display().to_string(),
        mode: match args.mode {
            Mode::Embedded => "embedded".into(),
            Mode::Cluster => "cluster".into(),
        },
        pods: args.pod_count(),
        host: Host {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            loadavg_start,
            loadavg_end: Host::loadavg(),
        },
        hold_s: args.duration.as_secs_f64(),
        baselines,
        ping_compare: ping,
        idle: report,
        figures,
        pod_resources,
        loadtest_process,
        events: event_list,
        problems,
    };
    print!("{}", render_idle(&run));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&run)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("json report written to {}", path.display());
    }
    Ok(if run.problems.is_empty() {
        0
    } else {
        EXIT_PROBLEMS
    })
}

fn render_idle(run: &IdleRun) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n== switchyard-loadtest: idle sockets, {} mode, {} pod(s), held {:.0}s",
        run.mode, run.pods, run.hold_s
    );
    let _ = writeln!(s, "binary: {}", run.binary);
    let _ = writeln!(
        s,
        "host: {} CPUs, load average {} at the start, {} at the end; open-file limit {}",
        run.host.cpus, run.host.loadavg_start, run.host.loadavg_end, run.idle.fd_limit
    );
    s.push_str(&report::render_measures(
        run.baselines.as_ref(),
        run.ping_compare.as_ref(),
    ));
    s.push_str(&run.idle.render());
    s.push_str(&report::render_resources(
        &run.pod_resources,
        &run.loadtest_process,
    ));
    s.push_str(&figures::render(&run.figures));
    if run.problems.is_empty() {
        let _ = writeln!(
            s,
            "\nverdict: OK (every socket and channel open, no errors)"
        );
    } else {
        let _ = writeln!(s, "\nverdict: PROBLEMS");
        for p in &run.problems {
            let _ = writeln!(s, "  - {p}");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_key_is_not_kept_in_the_command_line() {
        let argv = [
            "lt",
            "--target",
            "http://x",
            "--api-key",
            "sy_secret",
            "--api-key=sy_two",
        ];
        let c = redact_command(argv.iter().map(|s| s.to_string()));
        assert_eq!(c, "lt --target http://x --api-key *** --api-key=***");
    }
}
