//! The agent-host series: described, and registered at zero at start so `rate()` over them
//! and the chart's "hosts lost" alert are defined before the first host connects.

use metrics::{counter, describe_counter, describe_gauge, gauge};
use switchyard_protocol::hosts::RunState;

/// Describes every agent-host series and registers them at zero (run transitions for every
/// state).
pub fn describe_metrics() {
    describe_gauge!(
        "switchyard_host_sockets",
        "agent-host connections open on this pod"
    );
    describe_counter!("switchyard_host_runs_created_total", "runs created");
    describe_counter!(
        "switchyard_host_run_transitions_total",
        "run state changes, by the state entered"
    );
    describe_counter!(
        "switchyard_host_run_events_total",
        "run events stored from hosts"
    );
    describe_counter!(
        "switchyard_host_run_rejections_total",
        "runs a host refused, by Connector API error code"
    );
    describe_counter!(
        "switchyard_host_accept_timeouts_total",
        "dispatched runs no host accepted in time (re-queued)"
    );
    describe_counter!(
        "switchyard_host_artifacts_uploaded_total",
        "artifacts hosts uploaded"
    );
    describe_counter!(
        "switchyard_host_bad_messages_total",
        "host messages refused as malformed or out of order, by error code"
    );
    describe_counter!(
        "switchyard_host_operator_notices_total",
        "run failures that need an operator (quota, policy), by error code"
    );
    gauge!("switchyard_host_sockets").increment(0.0);
    for state in RunState::ALL {
        counter!("switchyard_host_run_transitions_total", "to" => state.as_str()).absolute(0);
    }
    for name in [
        "switchyard_host_runs_created_total",
        "switchyard_host_run_events_total",
        "switchyard_host_accept_timeouts_total",
        "switchyard_host_artifacts_uploaded_total",
    ] {
        counter!(name).absolute(0);
    }
}
