//! The state every pod of a test cluster shares: what the store, the file store and the
//! ephemeral hold in production.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use switchyard_protocol::ConnectionStatus;
use switchyard_protocol::descriptor::TargetView;

use super::TENANT;
use crate::ephemeral::MemoryEphemeral;
use crate::ids::now_ms;
use crate::model::{AuthStatus, FileDirection};
use crate::provider::{AuthStep, Binding, InboundMessage};

/// A file in the cluster's file store.
#[derive(Debug, Clone)]
pub struct StoredFile {
    pub channel_id: String,
    pub filename: String,
    pub mime_type: Option<String>,
    pub bytes: Vec<u8>,
    pub direction: FileDirection,
}

/// An auth session as the core keeps it: status, provider state and the last step's public
/// view.
#[derive(Debug, Clone)]
pub struct Session {
    pub channel_id: String,
    pub status: AuthStatus,
    pub state: Value,
    pub qr_code_text: Option<String>,
    pub qr_code_image: Option<String>,
    pub message: String,
    pub poll_interval_ms: u64,
    pub credentials: Option<Value>,
    pub binding_key: Option<String>,
    pub failure_code: Option<String>,
}

impl Session {
    fn pending(channel_id: &str, state: Value) -> Self {
        Self {
            channel_id: channel_id.into(),
            status: AuthStatus::Pending,
            state,
            qr_code_text: None,
            qr_code_image: None,
            message: String::new(),
            poll_interval_ms: 0,
            credentials: None,
            binding_key: None,
            failure_code: None,
        }
    }
}

pub(super) struct Lease {
    pub(super) holder: String,
    pub(super) generation: i64,
    pub(super) expires_at: i64,
}

/// What every pod of a test cluster shares. Tests read and steer it directly: the switches
/// (`full`, `overloaded`) make every pod's `accept_inbound` refuse as the real core does.
#[derive(Default)]
pub struct Cluster {
    pub bindings: Mutex<Vec<Binding>>,
    /// Stored inbound messages, in order, with their channel.
    pub inbound: Mutex<Vec<(String, InboundMessage)>>,
    pub files: Mutex<HashMap<String, StoredFile>>,
    /// Every `set_target_status` call, in order.
    pub statuses: Mutex<Vec<(String, ConnectionStatus)>>,
    /// Every `rebind` the core took, in order: the channel, its new view and binding key.
    pub rebinds: Mutex<Vec<(String, TargetView, Option<String>)>>,
    pub kv: Mutex<HashMap<String, String>>,
    /// What `secret_put` stored, by key.
    pub secrets: Mutex<HashMap<String, Value>>,
    pub(super) leases: Mutex<HashMap<String, Lease>>,
    /// Auth sessions by id.
    pub sessions: Mutex<HashMap<String, Session>>,
    /// Every step a provider handed to `advance_auth` and the core took, with its session.
    pub steps: Mutex<Vec<(String, AuthStep)>>,
    pub eph: Arc<MemoryEphemeral>,
    /// The channel queues are full: `accept_inbound` answers `Full` for new messages.
    pub full: AtomicBool,
    /// The pods' commit backlogs are full: `accept_inbound` answers `Overloaded`.
    pub overloaded: AtomicBool,
    /// Set when a file starts streaming into the store, before its bytes are all there.
    pub storing: AtomicBool,
    /// Inbound files given up with `discard_inbound_file`.
    pub discarded: Mutex<Vec<String>>,
    pub(super) next_file: AtomicU64,
    /// `accept_inbound` calls (duplicates and refusals included).
    pub accept_calls: AtomicU64,
}

impl Cluster {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            next_file: AtomicU64::new(1),
            ..Default::default()
        })
    }

    /// Binds `channel_id` (replacing its binding) as the core does after a successful auth.
    pub fn bind(&self, channel_id: &str, credentials: Value) -> Binding {
        let binding = Binding {
            channel_id: channel_id.into(),
            tenant_id: TENANT.into(),
            credentials,
        };
        let mut b = self.bindings.lock().unwrap();
        b.retain(|x| x.channel_id != channel_id);
        b.push(binding.clone());
        binding
    }

    pub fn unbind(&self, channel_id: &str) {
        self.bindings
            .lock()
            .unwrap()
            .retain(|x| x.channel_id != channel_id);
    }

    /// The binding of a bound channel; panics when it is not bound.
    pub fn binding(&self, channel_id: &str) -> Binding {
        self.find_binding(channel_id).expect("bound channel")
    }

    pub(super) fn find_binding(&self, channel_id: &str) -> Option<Binding> {
        self.bindings
            .lock()
            .unwrap()
            .iter()
            .find(|b| b.channel_id == channel_id)
            .cloned()
    }

    pub fn inbound(&self) -> Vec<(String, InboundMessage)> {
        self.inbound.lock().unwrap().clone()
    }

    pub fn statuses(&self) -> Vec<(String, ConnectionStatus)> {
        self.statuses.lock().unwrap().clone()
    }

    /// The statuses reported for one channel, in order.
    pub fn statuses_of(&self, channel_id: &str) -> Vec<ConnectionStatus> {
        self.statuses
            .lock()
            .unwrap()
            .iter()
            .filter(|(c, _)| c == channel_id)
            .map(|(_, s)| *s)
            .collect()
    }

    /// A stored file; panics when there is none.
    pub fn file(&self, file_ref: &str) -> StoredFile {
        self.files
            .lock()
            .unwrap()
            .get(file_ref)
            .cloned()
            .expect("stored file")
    }

    /// An uploaded (outbound) file of `channel_id`.
    pub fn add_upload(
        &self,
        channel_id: &str,
        file_ref: &str,
        filename: &str,
        mime: &str,
        bytes: &[u8],
    ) {
        self.files.lock().unwrap().insert(
            file_ref.into(),
            StoredFile {
                channel_id: channel_id.into(),
                filename: filename.into(),
                mime_type: Some(mime.into()),
                bytes: bytes.to_vec(),
                direction: FileDirection::Outbound,
            },
        );
    }

    /// The pod holding an unexpired lease, if any.
    pub fn lease_holder(&self, name: &str) -> Option<String> {
        let leases = self.leases.lock().unwrap();
        leases
            .get(name)
            .filter(|l| l.expires_at > now_ms())
            .map(|l| l.holder.clone())
    }

    pub fn kv(&self, key: &str) -> Option<String> {
        self.kv.lock().unwrap().get(key).cloned()
    }

    /// Opens a pending auth session of `channel_id` holding the provider's `state`, as the
    /// core does before `auth_start` answers (`state` is null then) or after it.
    pub fn open_session(&self, session_id: &str, channel_id: &str, state: Value) {
        self.sessions
            .lock()
            .unwrap()
            .insert(session_id.into(), Session::pending(channel_id, state));
    }

    /// An auth session; panics when there is none.
    pub fn session(&self, id: &str) -> Session {
        self.sessions
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .expect("session")
    }

    /// Applies an auth step to a session as the core does: a success binds the session's
    /// channel, a terminal step forgets the provider state. A missing session is left alone.
    pub fn apply(&self, session_id: &str, step: AuthStep) {
        let mut bind = None;
        {
            let mut sessions = self.sessions.lock().unwrap();
            let Some(s) = sessions.get_mut(session_id) else {
                return;
            };
            match step {
                AuthStep::Pending {
                    status,
                    qr_code_text,
                    qr_code_image,
                    message,
                    poll_interval_ms,
                    state,
                    ..
                } => {
                    s.status = status;
                    s.qr_code_text = qr_code_text;
                    s.qr_code_image = qr_code_image;
                    s.message = message;
                    s.poll_interval_ms = poll_interval_ms;
                    s.state = state;
                }
                AuthStep::Authenticated {
                    credentials,
                    binding_key,
                    ..
                } => {
                    s.status = AuthStatus::Authenticated;
                    s.credentials = Some(credentials.clone());
                    s.binding_key = binding_key;
                    s.state = Value::Null;
                    bind = Some((s.channel_id.clone(), credentials));
                }
                AuthStep::Failed { code, message } => {
                    s.status = AuthStatus::Failed;
                    s.message = message;
                    s.failure_code = Some(code);
                    s.state = Value::Null;
                }
            }
        }
        if let Some((ch, c)) = bind {
            self.bind(&ch, c);
        }
    }
}
