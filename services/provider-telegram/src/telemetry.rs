//! The Telegram connector's series: described, and registered at zero at start so `rate()`
//! over them is defined before the first update or API call.

use metrics::{counter, describe_counter, describe_gauge, gauge};

/// Describes every Telegram series and registers the unlabelled ones and the common outcomes
/// at zero.
pub fn describe_metrics() {
    describe_counter!(
        "switchyard_telegram_api_calls_total",
        "Bot API calls, by method and outcome (ok, network, or the API's error code)"
    );
    describe_counter!(
        "switchyard_telegram_updates_total",
        "updates received (polled or pushed), by outcome"
    );
    describe_counter!(
        "switchyard_telegram_rate_limited_total",
        "Bot API answers 429 (the call waits retry_after)"
    );
    describe_counter!(
        "switchyard_telegram_send_limited_total",
        "sends refused because the send limit would hold them past their deadline"
    );
    describe_counter!(
        "switchyard_telegram_tokens_revoked_total",
        "bot tokens Telegram refused (401): their channels are closed"
    );
    describe_counter!(
        "switchyard_telegram_chats_migrated_total",
        "channels moved to a supergroup's new chat id after Telegram upgraded their group"
    );
    describe_gauge!(
        "switchyard_telegram_bots",
        "bots whose updates this pod receives"
    );
    for method in ["getUpdates", "sendMessage"] {
        counter!("switchyard_telegram_api_calls_total", "method" => method, "outcome" => "ok")
            .absolute(0);
    }
    for outcome in ["stored", "duplicate", "retry"] {
        counter!("switchyard_telegram_updates_total", "outcome" => outcome).absolute(0);
    }
    counter!("switchyard_telegram_rate_limited_total").absolute(0);
    counter!("switchyard_telegram_send_limited_total").absolute(0);
    counter!("switchyard_telegram_tokens_revoked_total").absolute(0);
    counter!("switchyard_telegram_chats_migrated_total").absolute(0);
    gauge!("switchyard_telegram_bots").increment(0.0);
}
