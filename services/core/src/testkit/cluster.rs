//! The state every pod of a test cluster shares, held where production holds it: the
//! in-memory store, the in-process bus, the ephemeral store and a local file folder. Each
//! pod runs the real engine over them ([`FakeServices`](super::FakeServices) is a real
//! `CardServices` with a few switches), so what a test reads here is what the engine
//! wrote: bindings, stored messages, auth sessions, files, leases, provider state.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::FutureExt as _;
use serde_json::{Value, json};
use switchyard_protocol::ConnectionStatus;
use switchyard_protocol::descriptor::TargetView;

use super::TENANT;
use crate::bus::LocalBus;
use crate::crypto::{Cipher, Secret, UrlSigner, rows};
use crate::ephemeral::MemoryEphemeral;
use crate::files::LocalFileStore;
use crate::ids::{now_ms, random_secret};
use crate::memstore::MemoryStore;
use crate::model::{
    AuthSessionRecord, AuthStatus, ChannelRecord, ConnectorRecord, FileDirection, FileRecord,
    Tenant,
};
use crate::provider::{AuthStep, Binding, InboundMessage};
use crate::store::Store;

/// The Card every channel of a test cluster belongs to: its leases, state and secrets are
/// namespaced by it, as a mounted Card's are.
pub const CARD: &str = "im.test";

/// The xAgent connector every channel of a test cluster hangs off.
const CONNECTOR: &str = "conn_test";

/// How long a test cluster's auth sessions live (the engine's default).
const SESSION_TTL_MS: i64 = 10 * 60 * 1000;

/// A file in the cluster's file store.
#[derive(Debug, Clone)]
pub struct StoredFile {
    pub channel_id: String,
    pub filename: String,
    pub mime_type: Option<String>,
    pub bytes: Vec<u8>,
    pub direction: FileDirection,
}

/// An auth session as a client sees it (`auth.status`): the status on the wire (a canceled
/// session reads as failed), the provider's state, the last step's public view, and the
/// channel's binding once authenticated.
#[derive(Debug, Clone)]
pub struct AuthSession {
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

/// What every pod of a test cluster shares, and what a test steers: the switches stand for
/// what a test cannot cause on cue (every queue at its cap, a pod's commit backlog full),
/// the records list the calls the pods' providers made.
pub struct Cluster {
    pub(super) store: Arc<MemoryStore>,
    pub(super) bus: Arc<LocalBus>,
    pub eph: Arc<MemoryEphemeral>,
    pub(super) files: Arc<LocalFileStore>,
    dir: PathBuf,
    pub(super) cipher: Cipher,
    pub(super) signer: UrlSigner,
    /// The pods' commit backlogs are full: `accept_inbound` of a bound channel answers
    /// `Overloaded`.
    pub overloaded: AtomicBool,
    /// Set when a file starts streaming into the store, before its bytes are all there.
    pub storing: AtomicBool,
    /// Inbound files given up with `discard_inbound_file`.
    pub discarded: Mutex<Vec<String>>,
    /// `accept_inbound` calls (duplicates and refusals included).
    pub accept_calls: AtomicU64,
    /// Every `set_target_status` the core took, in order.
    pub(super) statuses: Mutex<Vec<(String, ConnectionStatus)>>,
    /// Every `rebind` the core took, in order: the channel, its new view and binding key.
    pub rebinds: Mutex<Vec<(String, TargetView, Option<String>)>>,
    /// Every step a provider handed to `advance_auth` and the core took, with its session.
    pub steps: Mutex<Vec<(String, AuthStep)>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs a call of the memory store, which answers without waiting.
fn now<T>(f: impl Future<Output = T>) -> T {
    f.now_or_never()
        .expect("the memory store answers without waiting")
}

impl Cluster {
    /// A fresh cluster: an empty store holding the test tenant and its connector.
    pub fn new() -> Arc<Self> {
        let store = Arc::new(MemoryStore::new());
        let at = now_ms();
        now(store.create_tenant(&Tenant {
            id: TENANT.into(),
            name: "test".into(),
            created_at: at,
        }))
        .expect("tenant");
        now(store.insert_connector(&ConnectorRecord {
            id: CONNECTOR.into(),
            tenant_id: TENANT.into(),
            card_id: CARD.into(),
            created_at: at,
            offline_since: None,
        }))
        .expect("connector");
        let dir = std::env::temp_dir().join(format!("switchyard-testkit-{}", random_secret(8)));
        Arc::new(Self {
            store,
            bus: Arc::new(LocalBus::new()),
            eph: Arc::new(MemoryEphemeral::new(100_000)),
            files: Arc::new(LocalFileStore::new(&dir).expect("the cluster's file folder")),
            dir,
            cipher: Cipher::from_base64(&[Secret::new(Cipher::generate_key())]).expect("key"),
            signer: UrlSigner::new(vec![Secret::new(random_secret(16))]).expect("signing key"),
            overloaded: AtomicBool::new(false),
            storing: AtomicBool::new(false),
            discarded: Mutex::default(),
            accept_calls: AtomicU64::new(0),
            statuses: Mutex::default(),
            rebinds: Mutex::default(),
            steps: Mutex::default(),
        })
    }

    /// The store every pod writes to.
    pub fn store(&self) -> &Arc<MemoryStore> {
        &self.store
    }

    /// Every channel's queue is at its cap (`true`): a new message is refused `Full`, a
    /// repeated one is still a duplicate.
    pub fn set_full(&self, full: bool) {
        self.store.set_queues_full(full);
    }

    /// The channel, created unbound when it does not exist yet.
    pub(super) fn channel(&self, channel_id: &str) -> ChannelRecord {
        if let Some(ch) = now(self.store.get_channel(channel_id)).expect("store") {
            return ch;
        }
        let at = now_ms();
        let ch = ChannelRecord {
            id: channel_id.into(),
            tenant_id: TENANT.into(),
            connector_id: CONNECTOR.into(),
            card_id: CARD.into(),
            route_socket: None,
            profiles: vec!["xagent.im.v2".into()],
            status: ConnectionStatus::Created,
            view: json!({}),
            binding: None,
            binding_key: None,
            created_at: at,
            updated_at: at,
        };
        now(self.store.insert_channel(&ch)).expect("channel");
        ch
    }

    /// Tells every pod's binding cache that these channels changed, as the engine does.
    fn announce(&self, channel_id: &str) {
        now(crate::bindings::announce(
            self.bus.as_ref(),
            &[channel_id.to_owned()],
        ));
    }

    /// Binds `channel_id` (replacing its binding) as the core does after a successful auth.
    pub fn bind(&self, channel_id: &str, credentials: Value) -> Binding {
        let ch = self.channel(channel_id);
        let blob = self
            .cipher
            .encrypt_json(&rows::channel(&ch.id), &credentials);
        now(self.store.set_channel_binding(
            &ch.id,
            Some(&blob),
            ch.binding_key.as_deref(),
            ConnectionStatus::Connected,
            &ch.view,
            now_ms(),
        ))
        .expect("bind");
        self.announce(channel_id);
        Binding {
            channel_id: channel_id.into(),
            tenant_id: TENANT.into(),
            credentials,
        }
    }

    /// Releases the channel's binding, as `auth.logout` does.
    pub fn unbind(&self, channel_id: &str) {
        let ch = self.channel(channel_id);
        now(self.store.set_channel_binding(
            &ch.id,
            None,
            None,
            ConnectionStatus::Created,
            &json!({}),
            now_ms(),
        ))
        .expect("unbind");
        self.announce(channel_id);
    }

    /// Every bound channel's binding, oldest channel first.
    pub fn bindings(&self) -> Vec<Binding> {
        now(self.store.bound_channels(CARD))
            .expect("store")
            .iter()
            .filter_map(|ch| self.decrypt(ch))
            .collect()
    }

    fn decrypt(&self, ch: &ChannelRecord) -> Option<Binding> {
        let blob = ch.binding.as_ref()?;
        let credentials = self
            .cipher
            .decrypt_json(&rows::channel(&ch.id), blob)
            .expect("credentials decrypt");
        Some(Binding {
            channel_id: ch.id.clone(),
            tenant_id: ch.tenant_id.clone(),
            credentials,
        })
    }

    /// The binding of a bound channel; panics when it is not bound.
    pub fn binding(&self, channel_id: &str) -> Binding {
        now(self.store.get_channel(channel_id))
            .expect("store")
            .and_then(|ch| self.decrypt(&ch))
            .expect("bound channel")
    }

    /// The stored inbound messages, in the order they were stored, with their channel.
    pub fn inbound(&self) -> Vec<(String, InboundMessage)> {
        self.store
            .outbox_rows()
            .into_iter()
            .map(|r| {
                let p = &r.payload;
                let text = |k: &str| p.get(k).and_then(Value::as_str).map(str::to_owned);
                let files = p
                    .get("files")
                    .cloned()
                    .map(|f| serde_json::from_value(f).expect("stored files"))
                    .unwrap_or_default();
                (
                    r.channel_id,
                    InboundMessage {
                        message_id: r.message_id,
                        text: text("text"),
                        sender_id: text(crate::engine::SENDER_ID),
                        sender_name: text("sender_name"),
                        files,
                    },
                )
            })
            .collect()
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

    fn stored_file(&self, rec: &FileRecord) -> StoredFile {
        StoredFile {
            channel_id: rec.channel_id.clone(),
            filename: rec.filename.clone(),
            mime_type: Some(rec.mime_type.clone()),
            bytes: std::fs::read(self.dir.join(&rec.storage_key)).expect("the file's bytes"),
            direction: rec.direction,
        }
    }

    /// A stored file; panics when there is none.
    pub fn file(&self, file_ref: &str) -> StoredFile {
        let rec = now(self.store.get_file(file_ref))
            .expect("store")
            .expect("stored file");
        self.stored_file(&rec)
    }

    /// Every stored file, by file_ref.
    pub fn files(&self) -> BTreeMap<String, StoredFile> {
        self.store
            .file_refs()
            .iter()
            .filter_map(|r| now(self.store.get_file(r)).expect("store"))
            .map(|rec| (rec.file_ref.clone(), self.stored_file(&rec)))
            .collect()
    }

    /// An uploaded (outbound) file of `channel_id`, as `POST /files/uploads` stores it.
    pub fn add_upload(
        &self,
        channel_id: &str,
        file_ref: &str,
        filename: &str,
        mime: &str,
        bytes: &[u8],
    ) {
        let ch = self.channel(channel_id);
        let storage_key = format!("{}/{}/{file_ref}", ch.tenant_id, ch.id);
        let path = self.dir.join(&storage_key);
        std::fs::create_dir_all(path.parent().expect("a folder")).expect("upload folder");
        std::fs::write(&path, bytes).expect("upload bytes");
        let at = now_ms();
        now(self.store.insert_file(&FileRecord {
            file_ref: file_ref.into(),
            tenant_id: ch.tenant_id.clone(),
            channel_id: ch.id.clone(),
            direction: FileDirection::Outbound,
            filename: filename.into(),
            mime_type: mime.into(),
            file_type: super::file_type(mime).into(),
            byte_size: bytes.len() as u64,
            storage_key,
            created_at: at,
            expires_at: at + 3_600_000,
        }))
        .expect("upload record");
    }

    /// The pod holding an unexpired lease of the Card, if any.
    pub fn lease_holder(&self, name: &str) -> Option<String> {
        now(self.store.get_lease(&format!("{CARD}:{name}")))
            .expect("store")
            .filter(|l| l.expires_at > now_ms())
            .map(|l| l.holder)
    }

    /// The Card's provider state under `key`.
    pub fn kv(&self, key: &str) -> Option<String> {
        now(self.store.kv_get(CARD, key)).expect("store")
    }

    /// The keys of the Card's provider state, sorted.
    pub fn kv_keys(&self) -> Vec<String> {
        self.store.kv_keys(CARD)
    }

    /// Opens a pending auth session of `channel_id` holding the provider's `state`, as the
    /// core does before `auth_start` answers (`state` is null then) or after it.
    pub fn open_session(&self, session_id: &str, channel_id: &str, state: Value) {
        let ch = self.channel(channel_id);
        let at = now_ms();
        let mut rec = AuthSessionRecord {
            id: session_id.into(),
            channel_id: ch.id,
            flow_id: String::new(),
            status: AuthStatus::Pending,
            state: None,
            public: json!({}),
            created_at: at,
            expires_at: at + SESSION_TTL_MS,
        };
        self.seal_state(&mut rec, &state);
        now(self.store.insert_auth_session(&rec)).expect("auth session");
    }

    fn seal_state(&self, rec: &mut AuthSessionRecord, state: &Value) {
        rec.state = (!state.is_null()).then(|| {
            self.cipher
                .encrypt_json(&rows::auth_session(&rec.id), state)
        });
    }

    fn record(&self, session_id: &str) -> AuthSessionRecord {
        now(self.store.get_auth_session(session_id))
            .expect("store")
            .expect("session")
    }

    /// Edits the provider state of a session, as time passing would change what it holds.
    pub fn edit_session_state(&self, session_id: &str, edit: impl FnOnce(&mut Value)) {
        let mut rec = self.record(session_id);
        let mut state = self.state_of(&rec);
        edit(&mut state);
        self.seal_state(&mut rec, &state);
        now(self.store.update_auth_session(&rec)).expect("auth session");
    }

    /// `auth.cancel` as the core runs it: the session ends and forgets its state.
    pub fn cancel_session(&self, session_id: &str) {
        let mut rec = self.record(session_id);
        rec.status = AuthStatus::Canceled;
        rec.state = None;
        rec.public = json!({"message": "authentication canceled", "code": "auth_canceled"});
        now(self.store.update_auth_session(&rec)).expect("auth session");
    }

    fn state_of(&self, rec: &AuthSessionRecord) -> Value {
        rec.state
            .as_ref()
            .map(|blob| {
                self.cipher
                    .decrypt_json(&rows::auth_session(&rec.id), blob)
                    .expect("session state decrypts")
            })
            .unwrap_or(Value::Null)
    }

    /// An auth session as a client sees it; panics when there is none.
    pub fn session(&self, id: &str) -> AuthSession {
        let rec = self.record(id);
        let public = |k: &str| rec.public.get(k).and_then(Value::as_str).map(str::to_owned);
        let ch = now(self.store.get_channel(&rec.channel_id))
            .expect("store")
            .expect("the session's channel");
        let authenticated = rec.status == AuthStatus::Authenticated;
        AuthSession {
            channel_id: rec.channel_id.clone(),
            status: match rec.status {
                AuthStatus::Canceled => AuthStatus::Failed,
                s => s,
            },
            state: self.state_of(&rec),
            qr_code_text: public("qr_code_text"),
            qr_code_image: public("qr_code_image"),
            message: public("message").unwrap_or_default(),
            poll_interval_ms: rec
                .public
                .get("poll_interval_millis")
                .and_then(Value::as_u64)
                .unwrap_or(0),
            credentials: authenticated
                .then(|| self.decrypt(&ch).map(|b| b.credentials))
                .flatten(),
            binding_key: authenticated.then(|| ch.binding_key.clone()).flatten(),
            failure_code: public("code"),
        }
    }

    /// Every auth session kept, as clients see them.
    pub fn sessions(&self) -> Vec<AuthSession> {
        self.store
            .auth_session_ids()
            .iter()
            .map(|id| self.session(id))
            .collect()
    }

    pub(super) fn count_accept(&self) {
        self.accept_calls.fetch_add(1, Ordering::SeqCst);
    }
}
