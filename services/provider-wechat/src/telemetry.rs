//! The WeChat connector's series: described, and registered at zero at start so `rate()`
//! over them is defined before the first message or API call.

use metrics::{counter, describe_counter, describe_gauge, gauge};

/// Describes every WeChat series and registers the unlabelled ones and the common outcomes
/// at zero.
pub fn describe_metrics() {
    describe_counter!(
        "switchyard_wechat_api_calls_total",
        "iLink API calls, by endpoint and outcome"
    );
    describe_counter!(
        "switchyard_wechat_messages_total",
        "messages received from WeChat, by outcome"
    );
    describe_counter!("switchyard_wechat_sent_total", "messages sent to WeChat");
    describe_counter!(
        "switchyard_wechat_send_limited_total",
        "sends refused because the send limit would hold them past their deadline"
    );
    describe_counter!(
        "switchyard_wechat_session_pauses_total",
        "bots paused because iLink answered errcode -14 (session timeout)"
    );
    describe_gauge!(
        "switchyard_wechat_bots",
        "bots whose messages this pod long-polls"
    );
    for endpoint in ["getupdates", "sendmessage"] {
        counter!("switchyard_wechat_api_calls_total", "endpoint" => endpoint, "outcome" => "ok")
            .absolute(0);
    }
    for outcome in ["stored", "duplicate", "retry"] {
        counter!("switchyard_wechat_messages_total", "outcome" => outcome).absolute(0);
    }
    counter!("switchyard_wechat_sent_total").absolute(0);
    counter!("switchyard_wechat_send_limited_total").absolute(0);
    counter!("switchyard_wechat_session_pauses_total").absolute(0);
    gauge!("switchyard_wechat_bots").increment(0.0);
}
