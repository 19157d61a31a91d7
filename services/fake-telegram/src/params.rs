//! Method parameters as the Bot API accepts them: query string, JSON, url-encoded form or
//! multipart/form-data (whose file parts are uploads).

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{FromRequest, Multipart, Request};
use axum::http::header;
use serde_json::{Map, Value};

#[derive(Debug, Clone)]
pub(crate) struct Upload {
    pub filename: Option<String>,
    pub content_type: Option<String>,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Default)]
pub(crate) struct Params {
    pub values: Map<String, Value>,
    pub uploads: HashMap<String, Upload>,
}

impl Params {
    pub fn str(&self, name: &str) -> Option<String> {
        match self.values.get(name)? {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        }
    }

    pub fn i64(&self, name: &str) -> Option<i64> {
        match self.values.get(name)? {
            Value::Number(n) => n.as_i64(),
            Value::String(s) => s.trim().parse().ok(),
            _ => None,
        }
    }

    pub fn bool(&self, name: &str) -> bool {
        match self.values.get(name) {
            Some(Value::Bool(b)) => *b,
            Some(Value::String(s)) => s == "true" || s == "1",
            _ => false,
        }
    }

    /// An object given as JSON or as a JSON string (form encodings).
    pub fn object(&self, name: &str) -> Option<Value> {
        match self.values.get(name)? {
            v @ Value::Object(_) => Some(v.clone()),
            Value::String(s) => serde_json::from_str(s).ok().filter(Value::is_object),
            _ => None,
        }
    }

    /// A list of strings given as a JSON array or as its JSON text (form encodings); None when
    /// absent or not such a list.
    pub fn list(&self, name: &str) -> Option<Vec<String>> {
        let v = match self.values.get(name)? {
            Value::String(s) => serde_json::from_str(s).ok()?,
            v => v.clone(),
        };
        v.as_array()?
            .iter()
            .map(|i| i.as_str().map(str::to_owned))
            .collect()
    }

    /// `reply_to_message_id`, or the newer `reply_parameters.message_id`.
    pub fn reply_to(&self) -> Option<i64> {
        self.i64("reply_to_message_id").or_else(|| {
            self.object("reply_parameters")
                .and_then(|o| o.get("message_id").and_then(Value::as_i64))
        })
    }
}

fn merge_form(values: &mut Map<String, Value>, raw: &[u8]) {
    for (k, v) in url::form_urlencoded::parse(raw) {
        values.insert(k.into_owned(), Value::String(v.into_owned()));
    }
}

/// Reads every parameter of a request; an unreadable body is an error text for a 400.
pub(crate) async fn read(req: Request<Body>) -> Result<Params, String> {
    let mut p = Params::default();
    if let Some(q) = req.uri().query() {
        merge_form(&mut p.values, q.as_bytes());
    }
    let ctype = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if ctype.starts_with("multipart/form-data") {
        let mut mp = Multipart::from_request(req, &())
            .await
            .map_err(|_| "Bad Request: invalid multipart body".to_owned())?;
        loop {
            let field = match mp.next_field().await {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(_) => return Err("Bad Request: invalid multipart body".into()),
            };
            let name = field.name().unwrap_or_default().to_owned();
            let filename = field.file_name().map(str::to_owned);
            let content_type = field.content_type().map(str::to_owned);
            let bytes = field
                .bytes()
                .await
                .map_err(|_| "Bad Request: invalid multipart body".to_owned())?;
            if filename.is_some() {
                p.uploads.insert(
                    name,
                    Upload {
                        filename,
                        content_type,
                        bytes: bytes.to_vec(),
                    },
                );
            } else {
                p.values.insert(
                    name,
                    Value::String(String::from_utf8_lossy(&bytes).into_owned()),
                );
            }
        }
        return Ok(p);
    }
    let body = axum::body::to_bytes(req.into_body(), 64 * 1024 * 1024)
        .await
        .map_err(|_| "Bad Request: body could not be read".to_owned())?;
    if body.is_empty() {
        return Ok(p);
    }
    if ctype.starts_with("application/json") {
        match serde_json::from_slice::<Value>(&body) {
            Ok(Value::Object(m)) => p.values.extend(m),
            _ => return Err("Bad Request: can't parse JSON object".into()),
        }
    } else {
        merge_form(&mut p.values, &body);
    }
    Ok(p)
}
