//! The seed's timeouts table ("Таймауты"), its keepalive and heartbeat intervals, the issue's
//! host-lost deadline, and the host agent's reconnect back-off ("Retry Policy", network
//! timeout row).
//!
//! Durations (de)serialise as whole seconds so an operator config reads `register = 10`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Every deadline of Connector API v1. `Default` is the seed's values; each is configurable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Timeouts {
    /// `register` must be answered with `register_ack` within this (seed: 10 s).
    #[serde(with = "secs")]
    pub register: Duration,
    /// `heartbeat` must be answered with `heartbeat_ack` within this (seed: 5 s).
    #[serde(with = "secs")]
    pub heartbeat_response: Duration,
    /// `create_run` must be answered with `run_accepted` within this, else the run is
    /// re-queued (seed: 30 s).
    #[serde(with = "secs")]
    pub create_run_accept: Duration,
    /// A `run_event` must be delivered within this, else the socket reconnects (seed: 60 s).
    #[serde(with = "secs")]
    pub event_delivery: Duration,
    /// `cancel_run` must be confirmed with `run_cancelled` within this (seed: 15 s).
    #[serde(with = "secs")]
    pub cancel_confirm: Duration,
    /// How long an `upload_url` stays valid (seed: 300 s).
    #[serde(with = "secs")]
    pub upload_url_ttl: Duration,
    /// How long a `download_url` stays valid. The seed names only the upload URL; we use the
    /// same 300 s.
    #[serde(with = "secs")]
    pub download_url_ttl: Duration,
    /// WebSocket ping/pong interval (seed "Transport": every 30 s); a missed pong closes.
    #[serde(with = "secs")]
    pub keepalive: Duration,
    /// How often a host agent sends `heartbeat` (seed: "каждые 30s").
    #[serde(with = "secs")]
    pub heartbeat_interval: Duration,
    /// A host with no heartbeat for this long is lost (issue 5 point 4: within 90 s; not in
    /// the seed).
    #[serde(with = "secs")]
    pub host_lost_after: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        let s = Duration::from_secs;
        Self {
            register: s(10),
            heartbeat_response: s(5),
            create_run_accept: s(30),
            event_delivery: s(60),
            cancel_confirm: s(15),
            upload_url_ttl: s(300),
            download_url_ttl: s(300),
            keepalive: s(30),
            heartbeat_interval: s(30),
            host_lost_after: s(90),
        }
    }
}

/// A [`Timeouts`] value that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimeoutsError {
    #[error("timeout {0} must be greater than zero")]
    Zero(&'static str),
    #[error("heartbeat_response must be shorter than heartbeat_interval")]
    HeartbeatResponseTooLong,
    #[error("host_lost_after must be longer than heartbeat_interval")]
    HostLostTooSoon,
}

impl Timeouts {
    /// Checks a configured value: every timeout positive, the heartbeat answered before the
    /// next one is due, and a host not declared lost before it missed a heartbeat.
    pub fn validate(&self) -> Result<(), TimeoutsError> {
        let all = [
            ("register", self.register),
            ("heartbeat_response", self.heartbeat_response),
            ("create_run_accept", self.create_run_accept),
            ("event_delivery", self.event_delivery),
            ("cancel_confirm", self.cancel_confirm),
            ("upload_url_ttl", self.upload_url_ttl),
            ("download_url_ttl", self.download_url_ttl),
            ("keepalive", self.keepalive),
            ("heartbeat_interval", self.heartbeat_interval),
            ("host_lost_after", self.host_lost_after),
        ];
        if let Some((name, _)) = all.iter().find(|(_, d)| d.is_zero()) {
            return Err(TimeoutsError::Zero(name));
        }
        if self.heartbeat_response >= self.heartbeat_interval {
            return Err(TimeoutsError::HeartbeatResponseTooLong);
        }
        if self.host_lost_after <= self.heartbeat_interval {
            return Err(TimeoutsError::HostLostTooSoon);
        }
        Ok(())
    }
}

/// The reconnect back-off steps of the seed before it settles on [`RECONNECT_CEILING`].
pub const RECONNECT_STEPS: [Duration; 5] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
    Duration::from_secs(16),
];
/// "затем каждые 30s".
pub const RECONNECT_CEILING: Duration = Duration::from_secs(30);

/// Delay before reconnect attempt `attempt`, counted from 0 (the first reconnect after a
/// drop waits 1 s): 1, 2, 4, 8, 16 s, then 30 s for ever. No jitter: the caller adds it.
pub fn reconnect_delay(attempt: u32) -> Duration {
    RECONNECT_STEPS
        .get(attempt as usize)
        .copied()
        .unwrap_or(RECONNECT_CEILING)
}

mod secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_seed_table() {
        let t = Timeouts::default();
        let secs = |d: Duration| d.as_secs();
        assert_eq!(secs(t.register), 10);
        assert_eq!(secs(t.heartbeat_response), 5);
        assert_eq!(secs(t.create_run_accept), 30);
        assert_eq!(secs(t.event_delivery), 60);
        assert_eq!(secs(t.cancel_confirm), 15);
        assert_eq!(secs(t.upload_url_ttl), 300);
        assert_eq!(secs(t.download_url_ttl), 300);
        assert_eq!(secs(t.keepalive), 30);
        assert_eq!(secs(t.heartbeat_interval), 30);
        assert_eq!(secs(t.host_lost_after), 90);
        assert_eq!(t.validate(), Ok(()));
    }

    #[test]
    fn backoff_schedule() {
        let got: Vec<u64> = (0..9).map(|a| reconnect_delay(a).as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 8, 16, 30, 30, 30, 30]);
        assert_eq!(reconnect_delay(u32::MAX), Duration::from_secs(30));
    }

    #[test]
    fn config_in_seconds_with_defaults_for_missing_keys() {
        let t: Timeouts =
            serde_json::from_str(r#"{"create_run_accept": 2, "host_lost_after": 3}"#).unwrap();
        assert_eq!(t.create_run_accept, Duration::from_secs(2));
        assert_eq!(t.host_lost_after, Duration::from_secs(3));
        assert_eq!(t.register, Duration::from_secs(10));
        let back: Timeouts =
            serde_json::from_value(serde_json::to_value(Timeouts::default()).unwrap()).unwrap();
        assert_eq!(back, Timeouts::default());
        assert_eq!(
            serde_json::to_value(Timeouts::default()).unwrap()["upload_url_ttl"],
            300
        );
        assert!(serde_json::from_str::<Timeouts>(r#"{"regster": 1}"#).is_err());
    }

    #[test]
    fn validation() {
        let ok = Timeouts::default();
        let t = Timeouts {
            cancel_confirm: Duration::ZERO,
            ..ok
        };
        assert_eq!(t.validate(), Err(TimeoutsError::Zero("cancel_confirm")));
        let t = Timeouts {
            heartbeat_response: Duration::from_secs(30),
            ..ok
        };
        assert_eq!(t.validate(), Err(TimeoutsError::HeartbeatResponseTooLong));
        let t = Timeouts {
            host_lost_after: Duration::from_secs(30),
            ..ok
        };
        assert_eq!(t.validate(), Err(TimeoutsError::HostLostTooSoon));
    }
}
