//! The credentials of a bound channel, the names derived from them, and the sealed store of
//! the peers' reply tokens. Nothing here logs or prints a token.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use chacha20poly1305::aead::{Aead, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use switchyard_core::crypto::{Secret, hmac_sha256, sha256_hex};
use switchyard_protocol::descriptor::TargetView;

#[derive(Clone)]
pub(crate) struct Credentials {
    pub token: Secret,
    pub bot_id: String,
    /// The WeChat user who scanned the QR code: the default recipient.
    pub user_id: String,
    /// Root for this bot's calls (the confirmation's `baseurl` when accepted, else api_base).
    pub base_url: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("bot", &bot_key(&self.bot_id))
            .finish_non_exhaustive()
    }
}

impl Credentials {
    pub fn from_stored(v: &Value) -> Option<Self> {
        let token = v.get("bot_token")?.as_str().filter(|t| !t.is_empty())?;
        Some(Self {
            token: Secret::new(token),
            bot_id: v.get("ilink_bot_id")?.as_str()?.to_owned(),
            user_id: v
                .get("ilink_user_id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            base_url: v.get("base_url")?.as_str()?.to_owned(),
        })
    }

    pub fn to_stored(&self) -> Value {
        json!({
            "bot_token": self.token.expose(),
            "ilink_bot_id": self.bot_id,
            "ilink_user_id": self.user_id,
            "base_url": self.base_url,
        })
    }

    pub fn key(&self) -> String {
        bot_key(&self.bot_id)
    }

    pub fn token_fp(&self) -> String {
        token_fingerprint(&self.token)
    }

    /// `微信 0069***.bot`, as the protocol's example shows a WeChat account.
    pub fn view(&self) -> TargetView {
        let hint = mask_account(&self.bot_id);
        TargetView {
            display_name: format!("微信 {hint}"),
            account_hint: Some(hint),
        }
    }
}

/// Public name of a bot in lease, cursor and kv keys: a hash of its id.
pub(crate) fn bot_key(bot_id: &str) -> String {
    sha256_hex(format!("wechat-bot:{bot_id}").as_bytes())[..32].to_owned()
}

/// One channel per WeChat bot within a tenant.
pub(crate) fn binding_key(bot_id: &str) -> String {
    sha256_hex(format!("wechat-binding:{bot_id}").as_bytes())
}

pub(crate) fn token_fingerprint(token: &Secret) -> String {
    sha256_hex(format!("switchyard.wechat.token:{}", token.expose()).as_bytes())[..32].to_owned()
}

/// `0069***.bot` from `0069abcdef@im.bot`: enough to recognise, not to address.
pub(crate) fn mask_account(id: &str) -> String {
    let (local, domain) = id.split_once('@').unwrap_or((id, ""));
    let head: String = local.chars().take(4).collect();
    let tail = domain.rsplit('.').next().unwrap_or("");
    if tail.is_empty() {
        format!("{head}***")
    } else {
        format!("{head}***.{tail}")
    }
}

/// The latest reply token of each peer of a bot, and who wrote last. Kept in the provider's
/// key/value store sealed with a key derived from the bot token, which itself lives only in
/// the encrypted binding: the store never holds a readable context token.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Peers {
    /// peer -> (context_token, last seen ms)
    pub tokens: std::collections::BTreeMap<String, (String, i64)>,
    pub last: Option<String>,
}

/// Most peers remembered per bot; the least recently seen go first.
const MAX_PEERS: usize = 512;

impl Peers {
    pub fn note(&mut self, peer: &str, token: &str, at: i64) -> bool {
        let changed = self.tokens.get(peer).map(|(t, _)| t.as_str()) != Some(token)
            || self.last.as_deref() != Some(peer);
        self.tokens.insert(peer.to_owned(), (token.to_owned(), at));
        self.last = Some(peer.to_owned());
        while self.tokens.len() > MAX_PEERS {
            let oldest = self
                .tokens
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => {
                    self.tokens.remove(&k);
                }
                None => break,
            }
        }
        changed
    }

    pub fn token(&self, peer: &str) -> Option<&str> {
        self.tokens.get(peer).map(|(t, _)| t.as_str())
    }

    fn cipher(token: &Secret) -> ChaCha20Poly1305 {
        let k = hmac_sha256(token.expose().as_bytes(), b"switchyard.wechat.peers.v1");
        ChaCha20Poly1305::new(Key::from_slice(&k))
    }

    pub fn seal(&self, token: &Secret) -> String {
        let mut nonce = [0u8; 12];
        rand::Rng::fill(&mut rand::rng(), &mut nonce);
        let plain = serde_json::to_vec(self).unwrap_or_default();
        let ct = Self::cipher(token)
            .encrypt(Nonce::from_slice(&nonce), plain.as_slice())
            .unwrap_or_default();
        let mut out = nonce.to_vec();
        out.extend_from_slice(&ct);
        STANDARD.encode(out)
    }

    /// Empty or unreadable (another token sealed it, or it was forgotten) reads as no peers.
    pub fn open(sealed: &str, token: &Secret) -> Self {
        let Ok(raw) = STANDARD.decode(sealed) else {
            return Self::default();
        };
        if raw.len() < 13 {
            return Self::default();
        }
        Self::cipher(token)
            .decrypt(Nonce::from_slice(&raw[..12]), &raw[12..])
            .ok()
            .and_then(|p| serde_json::from_slice(&p).ok())
            .unwrap_or_default()
    }
}

pub(crate) fn peers_key(bot_key: &str) -> String {
    format!("peers:{bot_key}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_sealing() {
        let c = Credentials {
            token: Secret::new("abc@im.bot:secret-token-value"),
            bot_id: "0069f1a2@im.bot".into(),
            user_id: "o9cq80x@im.wechat".into(),
            base_url: "https://ilinkai.weixin.qq.com".into(),
        };
        assert!(!format!("{c:?}").contains("secret"));
        assert_eq!(c.view().display_name, "微信 0069***.bot");
        assert!(!c.key().contains("0069"));
        let back = Credentials::from_stored(&c.to_stored()).unwrap();
        assert_eq!(back.bot_id, c.bot_id);

        let mut p = Peers::default();
        assert!(p.note("u1", "ctx-secret-1", 1));
        assert!(!p.note("u1", "ctx-secret-1", 2));
        let sealed = p.seal(&c.token);
        assert!(!sealed.contains("ctx-secret"));
        assert_eq!(Peers::open(&sealed, &c.token), p);
        assert_eq!(
            Peers::open(&sealed, &Secret::new("other")),
            Peers::default()
        );
        assert_eq!(Peers::open("", &c.token), Peers::default());
        for i in 0..(MAX_PEERS + 5) {
            p.note(&format!("p{i}"), "t", 10 + i as i64);
        }
        assert_eq!(p.tokens.len(), MAX_PEERS);
        assert!(p.token("u1").is_none(), "the oldest peer went first");
    }
}
