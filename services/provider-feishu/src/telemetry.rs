//! The Feishu/Lark connector's series: described, and registered at zero at start so
//! `rate()` over them is defined before the first event or API call.

use metrics::{counter, describe_counter, describe_gauge, gauge};

/// Describes every Feishu series and registers the unlabelled ones and the common outcomes
/// at zero.
pub fn describe_metrics() {
    describe_counter!(
        "switchyard_feishu_api_calls_total",
        "Open Platform API calls, by route and outcome"
    );
    describe_counter!(
        "switchyard_feishu_events_total",
        "events received (long connection or HTTP), by outcome"
    );
    describe_counter!(
        "switchyard_feishu_events_acked_total",
        "long-connection event frames acknowledged to Feishu"
    );
    describe_counter!(
        "switchyard_feishu_fragments_dropped_total",
        "partial long-connection payloads dropped (incomplete or over the size limit)"
    );
    describe_counter!(
        "switchyard_feishu_connections_total",
        "long connections opened"
    );
    describe_counter!(
        "switchyard_feishu_reconnects_total",
        "long connections reopened after a drop"
    );
    describe_counter!(
        "switchyard_feishu_rate_limited_total",
        "API answers that asked the caller to slow down"
    );
    describe_counter!(
        "switchyard_feishu_apps_revoked_total",
        "apps whose credentials Feishu refused: their channels are closed"
    );
    describe_gauge!(
        "switchyard_feishu_long_connection_apps",
        "apps whose long connection this pod holds"
    );
    for outcome in ["stored", "duplicate", "retry"] {
        counter!("switchyard_feishu_events_total", "outcome" => outcome).absolute(0);
    }
    for name in [
        "switchyard_feishu_events_acked_total",
        "switchyard_feishu_fragments_dropped_total",
        "switchyard_feishu_connections_total",
        "switchyard_feishu_reconnects_total",
        "switchyard_feishu_rate_limited_total",
        "switchyard_feishu_apps_revoked_total",
    ] {
        counter!(name).absolute(0);
    }
    gauge!("switchyard_feishu_long_connection_apps").increment(0.0);
}
