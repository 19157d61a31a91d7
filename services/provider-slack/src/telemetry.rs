//! The Slack connector's series: described, and registered at zero so `rate()` over them is
//! defined before the first event or API call.

use metrics::{counter, describe_counter, describe_gauge, gauge};

/// Describes every Slack series and registers the unlabelled ones and the common outcomes at
/// zero.
pub fn describe_metrics() {
    describe_counter!(
        "switchyard_slack_api_calls_total",
        "Slack Web API calls, by method and outcome"
    );
    describe_counter!(
        "switchyard_slack_events_total",
        "events received (Socket Mode or HTTP), by outcome"
    );
    describe_counter!(
        "switchyard_slack_envelopes_acked_total",
        "Socket Mode envelopes acknowledged to Slack"
    );
    describe_counter!(
        "switchyard_slack_connections_total",
        "Socket Mode connections opened"
    );
    describe_counter!(
        "switchyard_slack_reconnects_total",
        "Socket Mode connections reopened (a drop, a refresh or a disconnect)"
    );
    describe_counter!(
        "switchyard_slack_rate_limited_total",
        "Web API answers 429 with a Retry-After"
    );
    describe_counter!(
        "switchyard_slack_bindings_revoked_total",
        "bindings whose tokens Slack refused: their channels are marked revoked"
    );
    describe_gauge!(
        "switchyard_slack_socket_apps",
        "apps whose Socket Mode connection this pod runs"
    );
    for outcome in ["stored", "duplicate", "ignored", "retry"] {
        counter!("switchyard_slack_events_total", "outcome" => outcome).absolute(0);
    }
    for name in [
        "switchyard_slack_envelopes_acked_total",
        "switchyard_slack_connections_total",
        "switchyard_slack_reconnects_total",
        "switchyard_slack_rate_limited_total",
        "switchyard_slack_bindings_revoked_total",
    ] {
        counter!(name).absolute(0);
    }
    gauge!("switchyard_slack_socket_apps").increment(0.0);
}
