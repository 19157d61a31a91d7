//! The operator console in a real headless Chromium (Debian's `chromium` and
//! `chromium-driver`, driven over W3C WebDriver): sign in, see the bound channel and its
//! outbox depth, grant an approval and see the run finish, and no secret in any page's
//! source. Screenshots go to `$SWITCHYARD_ARTIFACTS_DIR` or `target/console-screenshots/`.
//!
//! When Chromium is missing the test runs `scripts/install-browser.sh`; it skips (printing
//! why) only when that cannot install it, and fails instead when
//! `SWITCHYARD_REQUIRE_BROWSER=1` (scripts/test.sh sets it once the install succeeded).

use std::path::PathBuf;
use std::time::Duration;

use switchyard_core::hoststore::ApprovalStatus;
use switchyard_e2e::PodOptions;
use switchyard_e2e::console::*;
use switchyard_e2e::webdriver::{Driver, find_browser};

fn artifacts_dir() -> PathBuf {
    match std::env::var_os("SWITCHYARD_ARTIFACTS_DIR") {
        Some(d) => PathBuf::from(d).join("console-screenshots"),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("target")
            .join("console-screenshots"),
    }
}

fn browser() -> Option<(PathBuf, PathBuf)> {
    if let Some(b) = find_browser() {
        return Some(b);
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/install-browser.sh");
    let installed = std::process::Command::new("bash")
        .arg(&script)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if installed { find_browser() } else { None }
}

/// How long a form's POST and its redirect may take to land in the browser.
const NAVIGATION: Duration = Duration::from_secs(10);
/// The charts' interval in this test: 60 points reach back 3 minutes, longer than the test.
const SAMPLE: Duration = Duration::from_secs(3);

/// The sum of every point of a chart's per-Card series, read from the page's SVG
/// (`data-values` of each `card:` series).
fn chart_total(html: &str, chart: &str) -> f64 {
    let start = html
        .find(&format!("id=\"chart-{chart}\""))
        .unwrap_or_else(|| panic!("chart {chart} drawn"));
    let end = start + html[start..].find("</figure>").expect("chart end");
    html[start..end]
        .split("<g class=\"series\" ")
        .skip(1)
        .filter(|g| g.starts_with("data-series=\"card:"))
        .map(|g| {
            let values = g
                .split("data-values=\"")
                .nth(1)
                .and_then(|v| v.split('"').next())
                .expect("data-values");
            values
                .split(',')
                .filter(|v| !v.is_empty())
                .map(|v| v.parse::<f64>().expect("a number"))
                .sum::<f64>()
        })
        .sum()
}

/// Inbound messages stored, from the pod's own /metrics.
async fn stored_total(metrics_url: &str) -> f64 {
    let text = reqwest::get(format!("{metrics_url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| {
            l.starts_with("switchyard_inbound_messages_total{") && l.contains("outcome=\"stored\"")
        })
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

/// Reloads a page with charts (the overview, a tenant's page) until its accepted chart's
/// total is `want` (the sampler closes an interval every [`SAMPLE`]).
async fn charts_until(b: &switchyard_e2e::webdriver::Session, url: &str, want: f64) -> String {
    let deadline = std::time::Instant::now() + SAMPLE * 5;
    loop {
        b.goto(url).await.unwrap();
        let html = b.source().await.unwrap();
        let total = chart_total(&html, "accepted");
        if total == want {
            return html;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the accepted chart shows {total}, the pod stored {want}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn operator_uses_the_console_in_chromium() {
    let Some((chromium, chromedriver)) = browser() else {
        let reason = "chromium and chromedriver are not installed and scripts/install-browser.sh could not install them";
        assert!(
            std::env::var("SWITCHYARD_REQUIRE_BROWSER").as_deref() != Ok("1"),
            "{reason}"
        );
        eprintln!("SKIPPED operator_uses_the_console_in_chromium: {reason}");
        return;
    };
    let shots = artifacts_dir();
    std::fs::create_dir_all(&shots).unwrap();
    let mut cf = ConsoleFixture::start_with(PodOptions::default().with(|c| {
        c.console.sample_interval = switchyard::config::Dur(SAMPLE);
    }))
    .await;
    let base = cf.console_url();
    let secrets = cf.secrets();
    let driver = Driver::start(&chromedriver).await.expect("chromedriver");
    let profile = tempfile::tempdir().unwrap();
    let b = driver
        .session(&chromium, profile.path())
        .await
        .expect("browser session");
    let mut sources = Vec::new();

    // Signed out, the console sends the browser to the sign-in form.
    b.goto(&base).await.unwrap();
    assert!(b.current_url().await.unwrap().ends_with("/console/login"));
    b.screenshot(&shots.join("01-login.png")).await.unwrap();
    b.css("#token")
        .await
        .unwrap()
        .send_keys(OPERATOR_TOKEN)
        .await
        .unwrap();
    b.css("#login").await.unwrap().click().await.unwrap();
    b.wait_for_url(NAVIGATION, |u| u.ends_with("/console"))
        .await
        .expect("signed in");
    let overview = b.source().await.unwrap();
    assert!(overview.contains(OPERATOR));
    b.screenshot(&shots.join("02-overview.png")).await.unwrap();
    sources.push(("overview", overview));

    // The charts are drawn from real data: the accepted series sums to what the pod stored,
    // and grows by exactly the messages sent next.
    let metrics = cf.fx.pod.metrics_url();
    let before = stored_total(&metrics).await;
    assert!(
        before >= cf.pending as f64,
        "the fixture's messages were stored"
    );
    charts_until(&b, &base, before).await;
    let sent = 5;
    for i in 0..sent {
        assert_eq!(cf.fx.inbound_text(&format!("chart-{i}"), "hi").await, 202);
        let _ = cf.fx.next_chat().await;
    }
    let after = stored_total(&metrics).await;
    assert_eq!(after, before + sent as f64);
    let html = charts_until(&b, &base, after).await;
    assert!(!html.contains("<script"), "no script on the overview");
    // A figure for docs/console.md.
    let docs_img = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/img");
    std::fs::create_dir_all(&docs_img).unwrap();
    b.screenshot(&docs_img.join("console-overview.png"))
        .await
        .unwrap();
    b.screenshot(&shots.join("02b-overview-charts.png"))
        .await
        .unwrap();

    // The tenant's page draws the tenant's own counts: every message above is this tenant's,
    // and the delivered chart stays empty, as none was acked.
    let tenant_url = format!("{base}/tenants/{}", cf.fx.pod.tenant.id);
    let html = charts_until(&b, &tenant_url, after).await;
    assert_eq!(chart_total(&html, "delivered"), 0.0);
    assert!(html.contains("id=\"chart-tools\""), "{html}");
    assert!(
        !html.contains("id=\"chart-sockets\""),
        "no deployment gauge on a tenant"
    );
    b.screenshot(&docs_img.join("console-tenant.png"))
        .await
        .unwrap();
    b.screenshot(&shots.join("02c-tenant-charts.png"))
        .await
        .unwrap();

    // The channels page's search finds the bound channel by the start of its id.
    let prefix = &cf.fx.channel_id[..cf.fx.channel_id.len() - 8];
    b.goto(&format!("{base}/channels")).await.unwrap();
    b.css("#f-q")
        .await
        .unwrap()
        .send_keys(prefix)
        .await
        .unwrap();
    b.css("#f-search").await.unwrap().click().await.unwrap();
    b.wait_for_url(NAVIGATION, |u| u.contains("/console/channels?"))
        .await
        .expect("the search ran");
    let found = b.source().await.unwrap();
    assert!(found.contains(&cf.fx.channel_id), "found by prefix");
    assert!(!found.contains(&cf.device_channel), "only the matches");
    b.screenshot(&shots.join("02d-channels-search.png"))
        .await
        .unwrap();
    // The browser holds a session cookie it cannot hand to scripts.
    let cookies = b.cookies().await.unwrap();
    let session = cookies
        .iter()
        .find(|c| c["name"] == "sy_console")
        .expect("session cookie");
    assert_eq!(session["httpOnly"], true);
    assert_eq!(session["sameSite"], "Strict");
    assert_ne!(session["value"], OPERATOR_TOKEN);

    // The bound channel and its outbox depth.
    b.goto(&format!("{base}/channels")).await.unwrap();
    let row = b
        .xpath(&format!("//tr[td//code[text()='{}']]", cf.fx.channel_id))
        .await
        .expect("the bound channel's row");
    let text = row.text().await.unwrap();
    assert!(
        text.contains("connected") && text.contains("bound"),
        "{text}"
    );
    let depth = b
        .xpath(&format!(
            "//tr[td//code[text()='{}']]//span[@class='depth']",
            cf.fx.channel_id
        ))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        depth,
        (cf.pending + sent).to_string(),
        "outbox depth: the fixture's messages and the charts' ones, none acked"
    );
    b.screenshot(&shots.join("03-channels.png")).await.unwrap();
    sources.push(("channels", b.source().await.unwrap()));

    b.goto(&format!("{base}/hosts")).await.unwrap();
    b.screenshot(&shots.join("04-hosts.png")).await.unwrap();
    sources.push(("hosts", b.source().await.unwrap()));

    // Grant the pending approval with its button.
    b.goto(&format!("{base}/approvals")).await.unwrap();
    b.screenshot(&shots.join("05-approvals.png")).await.unwrap();
    sources.push(("approvals", b.source().await.unwrap()));
    b.xpath(&format!(
        "//tr[td//code[text()='{}']]//button[text()='Grant']",
        cf.approval_id
    ))
    .await
    .expect("grant button")
    .click()
    .await
    .unwrap();
    // The grant is a form POST answered with a redirect to the approvals with a notice.
    b.wait_for_url(NAVIGATION, |u| u.contains("/console/approvals?notice="))
        .await
        .expect("back on the approvals after the grant");
    let notice = b
        .css("#notice")
        .await
        .expect("a notice after the grant")
        .text()
        .await
        .unwrap();
    assert!(notice.contains("granted by alice@example.com"), "{notice}");
    b.screenshot(&shots.join("06-granted.png")).await.unwrap();
    let store = switchyard::app::open_store(cf.fx.pod.config())
        .await
        .unwrap();
    let a = store.get_approval(&cf.approval_id).await.unwrap().unwrap();
    assert_eq!(
        (a.status, a.decided_by.as_deref()),
        (ApprovalStatus::Granted, Some(OPERATOR))
    );

    // The host hears the grant and finishes the run; the run page shows it.
    host_finishes_after_grant(&mut cf.host, &cf.run_id).await;
    let run_url = format!("{base}/runs/{}", cf.run_id);
    let mut state = String::new();
    for _ in 0..50 {
        b.goto(&run_url).await.unwrap();
        state = b.css("#run-state").await.unwrap().text().await.unwrap();
        if state == "completed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(state, "completed", "the run continued after the grant");
    let run_page = b.source().await.unwrap();
    assert!(run_page.contains("approval_granted") && run_page.contains("build dir cleaned"));
    b.screenshot(&shots.join("07-run.png")).await.unwrap();
    sources.push(("run", run_page));

    for (what, html) in &sources {
        assert_no_secret_in(what, html, &secrets);
    }

    // Log out with the header's button.
    b.xpath("//button[text()='Log out']")
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.wait_for_url(NAVIGATION, |u| u.ends_with("/console/login"))
        .await
        .expect("logged out");
    b.goto(&format!("{base}/channels")).await.unwrap();
    assert!(
        b.current_url().await.unwrap().ends_with("/console/login"),
        "the session ended"
    );
    b.close().await.unwrap();
    eprintln!("console screenshots in {}", shots.display());
}
