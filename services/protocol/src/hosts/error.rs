//! Error codes of Connector API v1 (seed "Коды ошибок") and the retry policy the seed assigns
//! to them ("Retry Policy"), as data.
//!
//! On the wire a code is the bare number (`"code": 4005`); [`HostErrorCode::name`] is the
//! stable snake_case name used in logs, metrics labels and the store.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::timeouts::reconnect_delay;

/// Every error code of the seed. The numeric value is the wire value and never changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "u16", into = "u16")]
pub enum HostErrorCode {
    /// 4001 Invalid request format.
    InvalidRequestFormat,
    /// 4002 Unknown message type.
    UnknownMessageType,
    /// 4003 Agent not found.
    AgentNotFound,
    /// 4004 Run not found.
    RunNotFound,
    /// 4005 Agent busy (max concurrent runs).
    AgentBusy,
    /// 4006 Quota exceeded.
    QuotaExceeded,
    /// 4007 Unauthorized action.
    UnauthorizedAction,
    /// 4008 Approval denied.
    ApprovalDenied,
    /// 5001 Connector internal error.
    ConnectorInternalError,
    /// 5002 Adapter error.
    AdapterError,
}

/// A number that is not one of the seed's error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown Connector API error code {0}")]
pub struct UnknownErrorCode(pub u16);

impl HostErrorCode {
    /// All codes in table order.
    pub const ALL: [Self; 10] = [
        Self::InvalidRequestFormat,
        Self::UnknownMessageType,
        Self::AgentNotFound,
        Self::RunNotFound,
        Self::AgentBusy,
        Self::QuotaExceeded,
        Self::UnauthorizedAction,
        Self::ApprovalDenied,
        Self::ConnectorInternalError,
        Self::AdapterError,
    ];

    /// The numeric wire value.
    pub fn code(self) -> u16 {
        match self {
            Self::InvalidRequestFormat => 4001,
            Self::UnknownMessageType => 4002,
            Self::AgentNotFound => 4003,
            Self::RunNotFound => 4004,
            Self::AgentBusy => 4005,
            Self::QuotaExceeded => 4006,
            Self::UnauthorizedAction => 4007,
            Self::ApprovalDenied => 4008,
            Self::ConnectorInternalError => 5001,
            Self::AdapterError => 5002,
        }
    }

    pub fn from_code(code: u16) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.code() == code)
    }

    /// Stable snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            Self::InvalidRequestFormat => "invalid_request_format",
            Self::UnknownMessageType => "unknown_message_type",
            Self::AgentNotFound => "agent_not_found",
            Self::RunNotFound => "run_not_found",
            Self::AgentBusy => "agent_busy",
            Self::QuotaExceeded => "quota_exceeded",
            Self::UnauthorizedAction => "unauthorized_action",
            Self::ApprovalDenied => "approval_denied",
            Self::ConnectorInternalError => "connector_internal_error",
            Self::AdapterError => "adapter_error",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    /// The meaning, as the seed's table words it.
    pub fn description(self) -> &'static str {
        match self {
            Self::InvalidRequestFormat => "Invalid request format",
            Self::UnknownMessageType => "Unknown message type",
            Self::AgentNotFound => "Agent not found",
            Self::RunNotFound => "Run not found",
            Self::AgentBusy => "Agent busy (max concurrent runs)",
            Self::QuotaExceeded => "Quota exceeded",
            Self::UnauthorizedAction => "Unauthorized action",
            Self::ApprovalDenied => "Approval denied",
            Self::ConnectorInternalError => "Connector internal error",
            Self::AdapterError => "Adapter error",
        }
    }

    /// 5xxx codes are faults of the connector (host) side; 4xxx of the request.
    pub fn is_connector_fault(self) -> bool {
        self.code() >= 5000
    }

    /// The seed's retry policy for this code. Codes the seed's table does not list get
    /// [`RetryPolicy::Fail`]: retrying an invalid or unauthorised request cannot succeed.
    pub fn retry_policy(self) -> RetryPolicy {
        match self {
            // "5001/5002 | Мгновенный retry × 3, затем fail"
            Self::ConnectorInternalError | Self::AdapterError => {
                RetryPolicy::Immediate { max_retries: 3 }
            }
            // "4005 | Отложить run в очередь, retry через 60s"
            Self::AgentBusy => RetryPolicy::Requeue {
                after: Duration::from_secs(60),
            },
            // "4006 | Остановить run, уведомить operator"
            Self::QuotaExceeded => RetryPolicy::StopAndNotifyOperator,
            Self::InvalidRequestFormat
            | Self::UnknownMessageType
            | Self::AgentNotFound
            | Self::RunNotFound
            | Self::UnauthorizedAction
            | Self::ApprovalDenied => RetryPolicy::Fail,
        }
    }
}

impl From<HostErrorCode> for u16 {
    fn from(c: HostErrorCode) -> u16 {
        c.code()
    }
}

impl TryFrom<u16> for HostErrorCode {
    type Error = UnknownErrorCode;
    fn try_from(code: u16) -> Result<Self, Self::Error> {
        Self::from_code(code).ok_or(UnknownErrorCode(code))
    }
}

impl std::fmt::Display for HostErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.code(), self.name())
    }
}

/// What to do after a failure, as the seed's "Retry Policy" table says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryPolicy {
    /// Retry at once, at most `max_retries` times after the first attempt, then fail.
    Immediate { max_retries: u32 },
    /// Put the run back in the queue and try again after `after`.
    Requeue { after: Duration },
    /// Stop the run and notify the operator.
    StopAndNotifyOperator,
    /// Reconnect with the back-off of [`reconnect_delay`] (network timeouts), without limit.
    Reconnect,
    /// No retry: the failure is final for the request that caused it.
    Fail,
}

/// The next step of a [`RetryPolicy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryStep {
    /// Try again after this delay (zero for an immediate retry).
    RetryAfter(Duration),
    /// Put the run back in the queue; dispatch it again after this delay.
    Requeue(Duration),
    /// Stop the run and tell the operator.
    StopAndNotifyOperator,
    /// Give up: the run (or request) fails.
    Fail,
}

impl RetryPolicy {
    /// The seed's policy for a network timeout: 1, 2, 4, 8, 16 s, then every 30 s.
    pub fn for_network_timeout() -> Self {
        Self::Reconnect
    }

    /// What to do after a failure when `retries_done` retries have already been made
    /// (0 after the first failed attempt).
    pub fn next_step(self, retries_done: u32) -> RetryStep {
        match self {
            Self::Immediate { max_retries } if retries_done < max_retries => {
                RetryStep::RetryAfter(Duration::ZERO)
            }
            Self::Immediate { .. } | Self::Fail => RetryStep::Fail,
            Self::Requeue { after } => RetryStep::Requeue(after),
            Self::StopAndNotifyOperator => RetryStep::StopAndNotifyOperator,
            Self::Reconnect => RetryStep::RetryAfter(reconnect_delay(retries_done)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_names_and_descriptions_match_the_seed_table() {
        let table = [
            (4001, "invalid_request_format", "Invalid request format"),
            (4002, "unknown_message_type", "Unknown message type"),
            (4003, "agent_not_found", "Agent not found"),
            (4004, "run_not_found", "Run not found"),
            (4005, "agent_busy", "Agent busy (max concurrent runs)"),
            (4006, "quota_exceeded", "Quota exceeded"),
            (4007, "unauthorized_action", "Unauthorized action"),
            (4008, "approval_denied", "Approval denied"),
            (5001, "connector_internal_error", "Connector internal error"),
            (5002, "adapter_error", "Adapter error"),
        ];
        assert_eq!(table.len(), HostErrorCode::ALL.len());
        for (c, (num, name, desc)) in HostErrorCode::ALL.into_iter().zip(table) {
            assert_eq!(c.code(), num);
            assert_eq!(c.name(), name);
            assert_eq!(c.description(), desc);
            assert_eq!(HostErrorCode::from_code(num), Some(c));
            assert_eq!(HostErrorCode::from_name(name), Some(c));
            assert_eq!(c.is_connector_fault(), num >= 5000);
        }
        assert_eq!(HostErrorCode::from_code(4009), None);
        assert_eq!(HostErrorCode::from_name("busy"), None);
    }

    #[test]
    fn wire_form_is_the_bare_number() {
        let j = serde_json::to_string(&HostErrorCode::AgentBusy).unwrap();
        assert_eq!(j, "4005");
        let c: HostErrorCode = serde_json::from_str("5002").unwrap();
        assert_eq!(c, HostErrorCode::AdapterError);
        let e = serde_json::from_str::<HostErrorCode>("4999").unwrap_err();
        assert!(
            e.to_string()
                .contains("unknown Connector API error code 4999")
        );
        assert!(serde_json::from_str::<HostErrorCode>("\"4005\"").is_err());
        assert_eq!(
            HostErrorCode::QuotaExceeded.to_string(),
            "4006 quota_exceeded"
        );
    }

    #[test]
    fn retry_policies_follow_the_seed() {
        use HostErrorCode::*;
        for c in [ConnectorInternalError, AdapterError] {
            assert_eq!(c.retry_policy(), RetryPolicy::Immediate { max_retries: 3 });
        }
        assert_eq!(
            AgentBusy.retry_policy(),
            RetryPolicy::Requeue {
                after: Duration::from_secs(60)
            }
        );
        assert_eq!(
            QuotaExceeded.retry_policy(),
            RetryPolicy::StopAndNotifyOperator
        );
        for c in [
            InvalidRequestFormat,
            UnknownMessageType,
            AgentNotFound,
            RunNotFound,
            UnauthorizedAction,
            ApprovalDenied,
        ] {
            assert_eq!(c.retry_policy(), RetryPolicy::Fail, "{c}");
        }
    }

    #[test]
    fn immediate_retry_three_times_then_fail() {
        let p = HostErrorCode::AdapterError.retry_policy();
        let steps: Vec<_> = (0..5).map(|n| p.next_step(n)).collect();
        let now = RetryStep::RetryAfter(Duration::ZERO);
        assert_eq!(
            steps,
            [now, now, now, RetryStep::Fail, RetryStep::Fail],
            "retries 1..=3 at once, the 4th failure is final"
        );
    }

    #[test]
    fn other_steps() {
        assert_eq!(
            HostErrorCode::AgentBusy.retry_policy().next_step(7),
            RetryStep::Requeue(Duration::from_secs(60))
        );
        assert_eq!(
            HostErrorCode::QuotaExceeded.retry_policy().next_step(0),
            RetryStep::StopAndNotifyOperator
        );
        assert_eq!(
            HostErrorCode::AgentNotFound.retry_policy().next_step(0),
            RetryStep::Fail
        );
        let net = RetryPolicy::for_network_timeout();
        let delays: Vec<_> = (0..7)
            .map(|n| match net.next_step(n) {
                RetryStep::RetryAfter(d) => d.as_secs(),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30]);
    }
}
