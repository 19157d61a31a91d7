//! The Discord connector's series: described, and registered at zero at start so `rate()`
//! over them is defined before the first message or API call.

use metrics::{counter, describe_counter, describe_gauge, gauge};

/// Describes every Discord series and registers the unlabelled ones and the common outcomes
/// at zero.
pub fn describe_metrics() {
    describe_counter!(
        "switchyard_discord_api_calls_total",
        "Discord REST calls, by route and outcome"
    );
    describe_counter!(
        "switchyard_discord_rate_limited_total",
        "Discord 429 answers, by scope (route or global)"
    );
    describe_counter!(
        "switchyard_discord_messages_total",
        "MESSAGE_CREATE dispatches handled, by outcome"
    );
    describe_counter!(
        "switchyard_discord_gateway_connections_total",
        "Gateway connections opened"
    );
    describe_counter!(
        "switchyard_discord_gateway_identifies_total",
        "Gateway sessions started with Identify"
    );
    describe_counter!(
        "switchyard_discord_gateway_resumes_total",
        "Gateway sessions resumed after a drop or a takeover"
    );
    describe_counter!(
        "switchyard_discord_gateway_zombies_total",
        "Gateway connections closed because a heartbeat was not acknowledged"
    );
    describe_counter!(
        "switchyard_discord_tokens_revoked_total",
        "bot tokens Discord refused: their channels are marked revoked"
    );
    describe_gauge!(
        "switchyard_discord_gateway_bots",
        "bots this pod runs a Gateway task for (holding the lease or waiting for it)"
    );
    for c in [
        "switchyard_discord_gateway_connections_total",
        "switchyard_discord_gateway_identifies_total",
        "switchyard_discord_gateway_resumes_total",
        "switchyard_discord_gateway_zombies_total",
        "switchyard_discord_tokens_revoked_total",
    ] {
        counter!(c).absolute(0);
    }
    for outcome in ["stored", "duplicate", "ignored", "retry", "refused"] {
        counter!("switchyard_discord_messages_total", "outcome" => outcome).absolute(0);
    }
    gauge!("switchyard_discord_gateway_bots").set(0.0);
}
