//! Gateway payloads, parsed once into typed packets (`developers/events/gateway-events.mdx`;
//! opcodes and close codes from `developers/topics/opcodes-and-status-codes.mdx`).

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

/// GUILD_MESSAGES | DIRECT_MESSAGES | MESSAGE_CONTENT.
pub(crate) const INTENTS: u64 = (1 << 9) | (1 << 12) | (1 << 15);

#[derive(Debug)]
pub(crate) enum Incoming {
    Hello {
        heartbeat_interval: Duration,
    },
    Dispatch {
        seq: u64,
        event: Event,
    },
    /// The Gateway asks for a heartbeat now.
    Heartbeat,
    Reconnect,
    InvalidSession {
        resumable: bool,
    },
    HeartbeatAck,
    Other,
}

#[derive(Debug)]
pub(crate) enum Event {
    Ready {
        session_id: String,
        resume_url: String,
    },
    Resumed,
    MessageCreate(Box<MessageCreate>),
    Other,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default)]
pub(crate) struct User {
    pub id: String,
    pub username: String,
    pub global_name: Option<String>,
    pub bot: bool,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default)]
pub(crate) struct Attachment {
    pub id: String,
    pub filename: String,
    pub size: u64,
    pub url: String,
    pub content_type: Option<String>,
}

/// MESSAGE_CREATE: a message object with the Gateway's extra `guild_id`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default)]
pub(crate) struct MessageCreate {
    pub id: String,
    pub channel_id: String,
    pub guild_id: Option<String>,
    pub author: User,
    pub content: String,
    pub mentions: Vec<User>,
    pub attachments: Vec<Attachment>,
    pub webhook_id: Option<String>,
    #[serde(rename = "type")]
    pub kind: u64,
}

#[derive(Deserialize)]
struct Raw {
    op: u64,
    #[serde(default)]
    d: Value,
    #[serde(default)]
    s: Option<u64>,
    #[serde(default)]
    t: Option<String>,
}

/// Parses one text frame; None when it is not a Gateway payload.
pub(crate) fn parse(text: &str) -> Option<Incoming> {
    let raw: Raw = serde_json::from_str(text).ok()?;
    Some(match raw.op {
        0 => {
            let seq = raw.s?;
            let event = match raw.t.as_deref() {
                Some("READY") => Event::Ready {
                    session_id: raw.d.get("session_id")?.as_str()?.to_owned(),
                    resume_url: raw
                        .d
                        .get("resume_gateway_url")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                },
                Some("RESUMED") => Event::Resumed,
                Some("MESSAGE_CREATE") => match serde_json::from_value(raw.d) {
                    Ok(m) => Event::MessageCreate(Box::new(m)),
                    Err(_) => Event::Other,
                },
                _ => Event::Other,
            };
            Incoming::Dispatch { seq, event }
        }
        1 => Incoming::Heartbeat,
        7 => Incoming::Reconnect,
        9 => Incoming::InvalidSession {
            resumable: raw.d.as_bool().unwrap_or(false),
        },
        10 => Incoming::Hello {
            heartbeat_interval: Duration::from_millis(
                raw.d.get("heartbeat_interval")?.as_u64()?.max(1),
            ),
        },
        11 => Incoming::HeartbeatAck,
        _ => Incoming::Other,
    })
}

pub(crate) fn identify(token: &str) -> String {
    json!({"op": 2, "d": {
        "token": token,
        "intents": INTENTS,
        "properties": {"os": std::env::consts::OS, "browser": "switchyard", "device": "switchyard"},
    }})
    .to_string()
}

pub(crate) fn resume(token: &str, session_id: &str, seq: u64) -> String {
    json!({"op": 6, "d": {"token": token, "session_id": session_id, "seq": seq}}).to_string()
}

pub(crate) fn heartbeat(seq: Option<u64>) -> String {
    json!({"op": 1, "d": seq}).to_string()
}

/// What a close code asks of the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CloseKind {
    /// 4004: the token is refused.
    Revoked,
    /// 4010 to 4014: reconnecting cannot help (bad shard, version or intents).
    Fatal,
    /// 4007, 4009: reconnect with a new session.
    NewSession,
    /// Anything else: reconnect and resume.
    Resume,
}

pub(crate) fn close_kind(code: u16) -> CloseKind {
    match code {
        4004 => CloseKind::Revoked,
        4010..=4014 => CloseKind::Fatal,
        4007 | 4009 => CloseKind::NewSession,
        _ => CloseKind::Resume,
    }
}

/// The URL with the version and encoding the connection uses (also when resuming).
pub(crate) fn with_query(url: &str) -> String {
    if url.contains('?') {
        url.to_owned()
    } else {
        format!("{url}?v=10&encoding=json")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_payloads() {
        assert!(matches!(
            parse(r#"{"op":10,"d":{"heartbeat_interval":41250},"s":null,"t":null}"#),
            Some(Incoming::Hello { heartbeat_interval }) if heartbeat_interval == Duration::from_millis(41250)
        ));
        assert!(matches!(
            parse(r#"{"op":11}"#),
            Some(Incoming::HeartbeatAck)
        ));
        assert!(matches!(
            parse(r#"{"op":7,"d":null}"#),
            Some(Incoming::Reconnect)
        ));
        assert!(matches!(
            parse(r#"{"op":9,"d":false}"#),
            Some(Incoming::InvalidSession { resumable: false })
        ));
        let ready = r#"{"op":0,"s":1,"t":"READY","d":{"v":10,"session_id":"abc","resume_gateway_url":"wss://r.example"}}"#;
        match parse(ready) {
            Some(Incoming::Dispatch {
                seq: 1,
                event:
                    Event::Ready {
                        session_id,
                        resume_url,
                    },
            }) => {
                assert_eq!(
                    (session_id.as_str(), resume_url.as_str()),
                    ("abc", "wss://r.example")
                );
            }
            other => panic!("{other:?}"),
        }
        let m = r#"{"op":0,"s":5,"t":"MESSAGE_CREATE","d":{"id":"9","channel_id":"7","author":{"id":"3","username":"ada","global_name":"Ada"},"content":"hi","mentions":[],"attachments":[{"id":"1","filename":"a.png","size":3,"url":"https://cdn/a.png"}],"type":0}}"#;
        match parse(m) {
            Some(Incoming::Dispatch {
                seq: 5,
                event: Event::MessageCreate(m),
            }) => {
                assert_eq!(m.author.global_name.as_deref(), Some("Ada"));
                assert!(m.guild_id.is_none());
                assert_eq!(m.attachments[0].filename, "a.png");
            }
            other => panic!("{other:?}"),
        }
        assert!(parse("not json").is_none());
        assert_eq!(INTENTS, 37376);
    }

    #[test]
    fn close_codes_and_urls() {
        assert_eq!(close_kind(4004), CloseKind::Revoked);
        assert_eq!(close_kind(4014), CloseKind::Fatal);
        assert_eq!(close_kind(4009), CloseKind::NewSession);
        assert_eq!(close_kind(4000), CloseKind::Resume);
        assert_eq!(close_kind(1006), CloseKind::Resume);
        assert_eq!(
            with_query("wss://g.example"),
            "wss://g.example?v=10&encoding=json"
        );
        assert!(identify("t").contains("\"intents\":37376"));
        let hb: Value = serde_json::from_str(&heartbeat(None)).unwrap();
        assert_eq!(hb, json!({"op": 1, "d": null}));
    }
}
