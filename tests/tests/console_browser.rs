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
    let mut cf = ConsoleFixture::start().await;
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
        .xpath(&format!("//tr[td/code[text()='{}']]", cf.fx.channel_id))
        .await
        .expect("the bound channel's row");
    let text = row.text().await.unwrap();
    assert!(
        text.contains("connected") && text.contains("bound"),
        "{text}"
    );
    let depth = b
        .xpath(&format!(
            "//tr[td/code[text()='{}']]//span[@class='depth']",
            cf.fx.channel_id
        ))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(depth, cf.pending.to_string(), "outbox depth");
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
        "//tr[td/code[text()='{}']]//button[text()='Grant']",
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
