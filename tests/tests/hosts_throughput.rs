//! Figures for the closing note, not a pass/fail gate: how many runs per second one pod
//! dispatches to hosts, and how many run events per second it stores. Ignored by default;
//! run with
//!
//! ```text
//! cargo test -p switchyard-e2e --test hosts_throughput -- --ignored --nocapture
//! ```
//!
//! Knobs: `HOSTS_TP_HOSTS` (default 4), `HOSTS_TP_RUNS` (runs per host, default 100),
//! `HOSTS_TP_EVENTS` (events per run, default 50).

use std::time::{Duration, Instant};

use serde_json::json;
use switchyard_e2e::hosts::*;
use switchyard_e2e::{Pod, PodOptions};
use switchyard_protocol::hosts::message::{ContextBundle, RunConstraints};
use switchyard_protocol::hosts::{HostMessage, Peer, format_rfc3339, parse_from};

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement; run with --ignored --nocapture"]
async fn dispatch_and_event_throughput() {
    let n_hosts = knob("HOSTS_TP_HOSTS", 4);
    let runs_per_host = knob("HOSTS_TP_RUNS", 100);
    let events_per_run = knob("HOSTS_TP_EVENTS", 50);
    let pod = Pod::start(PodOptions::default().with(|c| {
        c.hosts.max_active_runs_per_tenant = 1_000_000;
    }))
    .await;
    let hosts = switchyard::app::admin_hosts(pod.config()).await.unwrap();

    // Phase 1: dispatch. Runs are queued while the hosts are connected; each host accepts
    // every create_run at once. Measured: first queue -> last create_run received.
    let mut enrolled = Vec::new();
    let mut conns = Vec::new();
    for i in 0..n_hosts {
        let h = enroll_host(&pod, &pod.tenant.id, &format!("tp-{i}")).await;
        let (c, _) = h.online(&["agent"]).await;
        enrolled.push(h);
        conns.push(c);
    }
    for h in &enrolled {
        while hosts
            .hub()
            .store()
            .list_agents(&h.host_id)
            .await
            .unwrap()
            .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let t0 = Instant::now();
    let mut receivers = Vec::new();
    for mut c in conns {
        let want = runs_per_host;
        receivers.push(tokio::spawn(async move {
            let mut ids = Vec::with_capacity(want);
            while ids.len() < want {
                match c.recv_within(Duration::from_secs(60)).await {
                    Some(HostMessage::CreateRun(cr)) => {
                        if !ids.contains(&cr.run_id) {
                            let acc = format!(
                                r#"{{"type":"run_accepted","run_id":"{}","status":"running"}}"#,
                                cr.run_id
                            );
                            c.send_raw(&acc).await;
                            ids.push(cr.run_id);
                        }
                    }
                    Some(_) => {}
                    None => panic!("host stopped receiving after {} runs", ids.len()),
                }
            }
            (c, ids)
        }));
    }
    let mut creators = Vec::new();
    for h in &enrolled {
        let host = hosts
            .hub()
            .store()
            .get_host(&h.host_id)
            .await
            .unwrap()
            .unwrap();
        let hosts = hosts.clone();
        creators.push(tokio::spawn(async move {
            for i in 0..runs_per_host {
                hosts
                    .start_run(
                        &host,
                        switchyard_core::hosts::NewRun {
                            agent_id: "agent".into(),
                            goal: format!("run {i}"),
                            context_bundle: ContextBundle::default(),
                            constraints: RunConstraints::default(),
                            channel_id: None,
                            parent_run_id: None,
                        },
                    )
                    .await
                    .unwrap();
            }
        }));
    }
    for c in creators {
        c.await.unwrap();
    }
    let queued_in = t0.elapsed();
    let mut per_host = Vec::new();
    for r in receivers {
        per_host.push(r.await.unwrap());
    }
    let dispatched_in = t0.elapsed();
    let total_runs = n_hosts * runs_per_host;

    // Phase 2: events. Every host streams events for its runs as fast as it can; measured
    // until the store holds all of them (each run's completion is the last).
    let t1 = Instant::now();
    let mut senders = Vec::new();
    for (mut c, ids) in per_host {
        senders.push(tokio::spawn(async move {
            for id in &ids {
                for seq in 1..=events_per_run {
                    let (event, payload) = if seq == events_per_run {
                        ("completion", json!({"summary": "done"}))
                    } else {
                        ("progress", json!({"message": format!("step {seq}")}))
                    };
                    let m = json!({"type": "run_event", "run_id": id, "seq": seq, "event": event,
                        "timestamp": format_rfc3339(switchyard_core::ids::now_ms()), "payload": payload});
                    let m = parse_from(Peer::Host, &m.to_string()).unwrap();
                    c.send(&m).await;
                }
            }
            (c, ids)
        }));
    }
    let mut all_ids = Vec::new();
    let mut keep = Vec::new();
    for s in senders {
        let (c, ids) = s.await.unwrap();
        keep.push(c);
        all_ids.extend(ids);
    }
    let sent_in = t1.elapsed();
    for id in &all_ids {
        loop {
            let run = hosts.hub().store().get_run(id).await.unwrap().unwrap();
            if run.state.is_terminal() {
                assert_eq!(run.event_count as usize, events_per_run);
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let stored_in = t1.elapsed();
    let total_events = total_runs * events_per_run;
    println!(
        "hosts throughput (one debug pod, SQLite, {n_hosts} hosts):\n  dispatch: {total_runs} runs queued in {:.2}s, all create_run received in {:.2}s = {:.0} runs/s\n  events: {total_events} run_events sent in {:.2}s, all stored in {:.2}s = {:.0} events/s",
        queued_in.as_secs_f64(),
        dispatched_in.as_secs_f64(),
        total_runs as f64 / dispatched_in.as_secs_f64(),
        sent_in.as_secs_f64(),
        stored_in.as_secs_f64(),
        total_events as f64 / stored_in.as_secs_f64(),
    );
    drop(keep);
}
