//! A tiny W3C WebDriver client over reqwest: enough to drive Debian's chromedriver and
//! headless Chromium through a page (navigate, find, type, click, read the source, take a
//! screenshot, read cookies).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

/// The W3C element reference key.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Paths of the Chromium binary and its driver, when both are installed.
pub fn find_browser() -> Option<(PathBuf, PathBuf)> {
    let which = |names: &[&str]| {
        names.iter().find_map(|n| {
            std::env::var_os("PATH").and_then(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join(n))
                    .find(|f| f.is_file())
            })
        })
    };
    Some((
        which(&["chromium", "chromium-browser"])?,
        which(&["chromedriver"])?,
    ))
}

/// A chromedriver process on a loopback port; killed on drop.
pub struct Driver {
    child: Child,
    pub url: String,
    http: reqwest::Client,
}

impl Driver {
    pub async fn start(chromedriver: &Path) -> anyhow::Result<Self> {
        let port = crate::free_port();
        let child = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let d = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
        };
        for _ in 0..100 {
            if let Ok(r) = d.http.get(format!("{}/status", d.url)).send().await
                && let Ok(v) = r.json::<Value>().await
                && v["value"]["ready"] == true
            {
                return Ok(d);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        anyhow::bail!("chromedriver did not become ready")
    }

    /// A headless Chromium session with a fresh profile.
    pub async fn session(&self, chromium: &Path, profile: &Path) -> anyhow::Result<Session> {
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1400,1000", "--no-first-run", "--no-default-browser-check",
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
        }}});
        let v = call(
            &self.http,
            reqwest::Method::POST,
            &format!("{}/session", self.url),
            Some(caps),
        )
        .await?;
        let id = v["sessionId"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("no sessionId in {v}"))?;
        Ok(Session {
            base: format!("{}/session/{id}", self.url),
            http: self.http.clone(),
        })
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<Value>,
) -> anyhow::Result<Value> {
    let mut req = http.request(method, url).timeout(Duration::from_secs(60));
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await?;
    let status = r.status();
    let v: Value = r.json().await?;
    if !status.is_success() {
        anyhow::bail!("webdriver {url}: {status} {}", v["value"]);
    }
    Ok(v["value"].clone())
}

/// One browser session.
pub struct Session {
    base: String,
    http: reqwest::Client,
}

/// An element of the current page.
pub struct Element<'a> {
    session: &'a Session,
    id: String,
}

impl Session {
    async fn cmd(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        call(&self.http, method, &format!("{}{path}", self.base), body).await
    }

    pub async fn goto(&self, url: &str) -> anyhow::Result<()> {
        self.cmd(reqwest::Method::POST, "/url", Some(json!({"url": url})))
            .await?;
        Ok(())
    }

    pub async fn current_url(&self) -> anyhow::Result<String> {
        Ok(self
            .cmd(reqwest::Method::GET, "/url", None)
            .await?
            .as_str()
            .unwrap_or_default()
            .to_owned())
    }

    /// Waits until the current URL satisfies `arrived`, polling for at most `within`, and
    /// returns it. A click that submits a form can return before Chromium has navigated
    /// (chromedriver does not always see the form's navigation start, notably on a loaded
    /// machine), so the URL and the page right after the click may still be the old ones.
    pub async fn wait_for_url(
        &self,
        within: Duration,
        arrived: impl Fn(&str) -> bool,
    ) -> anyhow::Result<String> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let url = self.current_url().await?;
            if arrived(&url) {
                return Ok(url);
            }
            if tokio::time::Instant::now() >= deadline {
                let page = self.source().await.unwrap_or_default();
                let heading = page
                    .split_once("<h1>")
                    .and_then(|(_, rest)| rest.split_once("</h1>"))
                    .map_or("", |(h, _)| h);
                anyhow::bail!("still at {url} (page {heading:?}) after {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn source(&self) -> anyhow::Result<String> {
        Ok(self
            .cmd(reqwest::Method::GET, "/source", None)
            .await?
            .as_str()
            .unwrap_or_default()
            .to_owned())
    }

    async fn find_by(&self, using: &str, value: &str) -> anyhow::Result<Element<'_>> {
        let v = self
            .cmd(
                reqwest::Method::POST,
                "/element",
                Some(json!({"using": using, "value": value})),
            )
            .await?;
        let id = v[ELEMENT]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("no element for {value}: {v}"))?;
        Ok(Element {
            session: self,
            id: id.to_owned(),
        })
    }

    pub async fn css(&self, selector: &str) -> anyhow::Result<Element<'_>> {
        self.find_by("css selector", selector).await
    }

    pub async fn xpath(&self, xpath: &str) -> anyhow::Result<Element<'_>> {
        self.find_by("xpath", xpath).await
    }

    /// A PNG of the viewport, written to `path`.
    pub async fn screenshot(&self, path: &Path) -> anyhow::Result<()> {
        let v = self.cmd(reqwest::Method::GET, "/screenshot", None).await?;
        let png =
            base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap_or_default())?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, png)?;
        Ok(())
    }

    /// The cookies of the current page, as the browser holds them.
    pub async fn cookies(&self) -> anyhow::Result<Vec<Value>> {
        Ok(self
            .cmd(reqwest::Method::GET, "/cookie", None)
            .await?
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    pub async fn close(self) -> anyhow::Result<()> {
        self.cmd(reqwest::Method::DELETE, "", None).await?;
        Ok(())
    }
}

impl Element<'_> {
    pub async fn send_keys(&self, text: &str) -> anyhow::Result<()> {
        self.session
            .cmd(
                reqwest::Method::POST,
                &format!("/element/{}/value", self.id),
                Some(json!({"text": text})),
            )
            .await?;
        Ok(())
    }

    pub async fn click(&self) -> anyhow::Result<()> {
        self.session
            .cmd(
                reqwest::Method::POST,
                &format!("/element/{}/click", self.id),
                Some(json!({})),
            )
            .await?;
        Ok(())
    }

    pub async fn text(&self) -> anyhow::Result<String> {
        Ok(self
            .session
            .cmd(
                reqwest::Method::GET,
                &format!("/element/{}/text", self.id),
                None,
            )
            .await?
            .as_str()
            .unwrap_or_default()
            .to_owned())
    }
}
