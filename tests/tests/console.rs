//! The operator console through a real pod's admin listener: sign-in and sessions, CSRF,
//! every page, keyset pagination, key management, an approval granted with the operator's
//! name reaching the host and the run finishing, and no secret in any page.

use std::time::{Duration, Instant};

use switchyard_core::hoststore::ApprovalStatus;
use switchyard_core::model::{ChannelRecord, ConnectorRecord};
use switchyard_e2e::console::*;
use switchyard_e2e::{Pod, PodOptions, eventually};
use switchyard_protocol::ConnectionStatus;
use switchyard_protocol::hosts::HostMessage;

#[tokio::test]
async fn sign_in_pages_decisions_and_no_secrets() {
    let mut cf = ConsoleFixture::start().await;
    let pod = &cf.fx.pod;
    let mut c = ConsoleClient::new(&pod.admin_url());
    let mut pages: Vec<(String, String)> = Vec::new();

    // Not on the public listener.
    let public = reqwest::get(format!("{}/console/login", pod.root_url()))
        .await
        .unwrap();
    assert_eq!(public.status(), 404);

    // Signed out: pages send to the sign-in form; POSTs are refused.
    let r = c.get("/console/channels").await;
    assert_eq!((r.status, r.location()), (303, Some("/console/login")));
    let r = c
        .post(
            &format!("/console/approvals/{}/grant", cf.approval_id),
            &[("csrf", "x")],
        )
        .await;
    assert_eq!(r.status, 403);

    // The sign-in form's CSRF token must come back with its cookie.
    let form = c.get("/console/login").await;
    assert_eq!(form.status, 200);
    assert!(form.body.contains("type=\"password\""));
    let r = c
        .post(
            "/console/login",
            &[("csrf", "forged"), ("token", OPERATOR_TOKEN)],
        )
        .await;
    assert_eq!(r.status, 403, "forged sign-in CSRF");
    let r = c.login("not-the-token-at-all").await;
    assert_eq!(r.status, 401);
    assert!(!r.set_cookies().iter().any(|s| s.starts_with("sy_console=")));
    let r = c.login(pod.api_key()).await;
    assert_eq!(r.status, 401, "a tenant's API key is not an operator token");

    let r = c.login(OPERATOR_TOKEN).await;
    assert_eq!((r.status, r.location()), (303, Some("/console")));
    let session = r
        .set_cookies()
        .into_iter()
        .find(|s| s.starts_with("sy_console="))
        .expect("session cookie");
    assert!(session.contains("HttpOnly") && session.contains("SameSite=Strict"));
    assert!(!session.contains("Secure"), "plain HTTP: {session}");
    let session_value = c
        .cookies
        .iter()
        .find(|(k, _)| k == "sy_console")
        .map(|(_, v)| v.clone())
        .expect("kept");
    assert_ne!(
        session_value, OPERATOR_TOKEN,
        "the cookie holds a session, not the token"
    );
    // Behind a TLS proxy the cookie is Secure.
    let via_tls = c
        .http
        .get(format!("{}/console/login", pod.admin_url()))
        .header("x-forwarded-proto", "https")
        .send()
        .await
        .unwrap();
    assert!(
        via_tls
            .headers()
            .get_all("set-cookie")
            .iter()
            .any(|v| v.to_str().unwrap().contains("; Secure"))
    );

    // Overview.
    let o = c.get("/console").await;
    assert_eq!(o.status, 200, "{}", o.body);
    assert!(o.body.contains(OPERATOR), "the operator's name is shown");
    assert!(o.body.contains("pending approvals"));
    assert_eq!(
        o.headers.get("cache-control").unwrap(),
        "no-store",
        "pages are never cached"
    );
    assert!(
        o.headers
            .get("content-security-policy")
            .unwrap()
            .to_str()
            .unwrap()
            .contains("default-src 'none'")
    );
    let csrf = o.csrf();
    pages.push(("overview".into(), o.body));

    // Channels: the bound webhook channel with its outbox depth, masked target, status.
    let ch = c.get("/console/channels").await;
    assert_eq!(ch.status, 200);
    let row = row_of(&ch.body, &cf.fx.channel_id);
    assert!(row.contains("connected"), "{row}");
    assert!(
        row.contains(&format!("<span class=\"depth\">{}</span>", cf.pending)),
        "outbox depth in {row}"
    );
    assert!(row.contains("im.webhook"));
    pages.push(("channels".into(), ch.body));
    let b = c.get("/console/bindings").await;
    let row = row_of(&b.body, &cf.fx.channel_id);
    assert!(row.contains("bound"), "{row}");
    assert!(
        b.body.contains(&cf.device_channel),
        "the device binding is listed"
    );
    pages.push(("bindings".into(), b.body));

    // Connectors, tenants, hosts, runs, failures.
    let k = c.get("/console/connectors").await;
    let row = row_of(&k.body, &cf.fx.connector_id);
    assert!(
        row.contains("online") && row.contains("im.webhook"),
        "{row}"
    );
    pages.push(("connectors".into(), k.body));
    let t = c.get("/console/tenants").await;
    assert!(t.body.contains(&pod.tenant.id) && t.body.contains(&pod.tenant.name));
    pages.push(("tenants".into(), t.body));
    let h = c.get("/console/hosts").await;
    let row = row_of(&h.body, &cf.host_id);
    assert!(
        row.contains(&cf.host_name) && row.contains("online"),
        "{row}"
    );
    assert!(row.contains("coder"), "the host's agents: {row}");
    pages.push(("hosts".into(), h.body));
    let runs = c.get("/console/runs").await;
    let row = row_of(&runs.body, &cf.run_id);
    assert!(row.contains("awaiting_approval"), "{row}");
    assert!(
        row.contains("clean the &lt;build&gt; dir"),
        "values are escaped: {row}"
    );
    pages.push(("runs".into(), runs.body));
    let f = c.get("/console/failures").await;
    assert_eq!(f.status, 200);
    pages.push(("failures".into(), f.body));

    // Pending approvals; a grant needs the session's CSRF token.
    let a = c.get("/console/approvals").await;
    assert!(row_of(&a.body, &cf.approval_id).contains("rm -rf /tmp/build"));
    pages.push(("approvals".into(), a.body));
    let grant = format!("/console/approvals/{}/grant", cf.approval_id);
    let r = c.post(&grant, &[("csrf", "wrong")]).await;
    assert_eq!(r.status, 403, "CSRF");
    let store = switchyard::app::open_store(pod.config()).await.unwrap();
    assert_eq!(
        store
            .get_approval(&cf.approval_id)
            .await
            .unwrap()
            .unwrap()
            .status,
        ApprovalStatus::Pending
    );
    let r = c.post(&grant, &[("csrf", &csrf)]).await;
    assert_eq!(r.status, 303, "{}", r.body);
    let decided = store.get_approval(&cf.approval_id).await.unwrap().unwrap();
    assert_eq!(decided.status, ApprovalStatus::Granted);
    assert_eq!(decided.decided_by.as_deref(), Some(OPERATOR));
    let notice = c.get(r.location().unwrap()).await;
    assert!(notice.body.contains("granted by alice@example.com"));
    let HostMessage::ApprovalGranted(g) = host_finishes_after_grant(&mut cf.host, &cf.run_id).await
    else {
        panic!("the host hears the grant")
    };
    assert_eq!(g.approved_by, OPERATOR);
    let run_path = format!("/console/runs/{}", cf.run_id);
    let run_page = eventually(Duration::from_secs(10), "run completed", || {
        let http = c.http.clone();
        let url = format!("{}{run_path}", pod.admin_url());
        let cookie = format!("sy_console={session_value}");
        async move {
            let body = http
                .get(url)
                .header("cookie", cookie)
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            body.contains(">completed<").then_some(body)
        }
    })
    .await;
    assert!(
        run_page.contains("approval_granted"),
        "event log: {run_page}"
    );
    assert!(run_page.contains("build dir cleaned"));
    pages.push(("run".into(), run_page));
    // Deciding twice: a clear conflict.
    let r = c.post(&grant, &[("csrf", &csrf)]).await;
    assert_eq!(r.status, 409);

    // Keys: created (shown once, in that answer only), listed with last use, revoked.
    let tenant_path = format!("/console/tenants/{}", pod.tenant.id);
    let created = c
        .post(&format!("{tenant_path}/keys"), &[("csrf", &csrf)])
        .await;
    assert_eq!(created.status, 200, "{}", created.body);
    assert_eq!(created.headers.get("cache-control").unwrap(), "no-store");
    let new_key = between(&created.body, "<code id=\"new-key\">", "</code>");
    assert!(new_key.starts_with("sy_"), "{new_key}");
    let new_key_id = pod_key_id(&store, &pod.tenant.id, &pod.tenant.key_id).await;
    let tp = eventually(Duration::from_secs(10), "last use recorded", || {
        let http = c.http.clone();
        let url = format!("{}{tenant_path}", pod.admin_url());
        let cookie = format!("sy_console={session_value}");
        let key_id = pod.tenant.key_id.clone();
        async move {
            let body = http
                .get(url)
                .header("cookie", cookie)
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            // The fixture's key was used (hello): its last-use cell is a time, not "—".
            let row = row_of(&body, &key_id);
            (!row.contains("<td>—</td>")).then_some(body)
        }
    })
    .await;
    assert!(tp.contains(&new_key_id));
    assert!(!tp.contains(new_key), "the new key is never shown again");
    pages.push(("tenant".into(), tp));
    let r = c
        .post(
            &format!("/console/keys/{new_key_id}/revoke"),
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(r.status, 303);
    assert!(
        store
            .get_api_key(&new_key_id)
            .await
            .unwrap()
            .unwrap()
            .revoked_at
            .is_some()
    );
    let tp = c.get(r.location().unwrap()).await;
    assert!(row_of(&tp.body, &new_key_id).contains("revoked"));
    pages.push(("tenant after revoke".into(), tp.body));

    // A Bearer operator token works without a session (scripts); an API key does not.
    let bearer = c
        .http
        .get(format!("{}/console/channels", pod.admin_url()))
        .bearer_auth(OPERATOR_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(bearer.status(), 200);
    let bearer = c
        .http
        .get(format!("{}/console/channels", pod.admin_url()))
        .bearer_auth(pod.api_key())
        .send()
        .await
        .unwrap();
    assert_eq!(bearer.status(), 401);

    // No secret in any page: operator token, API keys (old and new), the webhook signing
    // secret, the host's pairing code, the deployment's signing and encryption keys.
    let mut secrets = cf.secrets();
    secrets.push(new_key.to_owned());
    for (what, html) in &pages {
        assert_no_secret_in(what, html, &secrets);
    }

    // Logout ends the session everywhere (the cookie no longer works).
    let r = c.post("/console/logout", &[("csrf", &csrf)]).await;
    assert_eq!((r.status, r.location()), (303, Some("/console/login")));
    let stale = c
        .http
        .get(format!("{}/console", pod.admin_url()))
        .header("cookie", format!("sy_console={session_value}"))
        .send()
        .await
        .unwrap();
    assert_eq!(stale.status(), 303);
}

/// The key of `tenant_id` that is not `old` (the one the console just created).
async fn pod_key_id(
    store: &std::sync::Arc<dyn switchyard_core::Store>,
    tenant_id: &str,
    old: &str,
) -> String {
    store
        .tenant_keys(tenant_id)
        .await
        .unwrap()
        .into_iter()
        .find(|k| k.id != old)
        .expect("new key")
        .id
}

fn between<'a>(s: &'a str, start: &str, end: &str) -> &'a str {
    let a = s.find(start).unwrap_or_else(|| panic!("{start} in {s}")) + start.len();
    let b = s[a..].find(end).expect("end") + a;
    &s[a..b]
}

/// The `<tr>` holding `needle`.
fn row_of(html: &str, needle: &str) -> String {
    // The first occurrence inside a table row (the needle may also appear in a notice or a
    // form above the table).
    html.match_indices(needle)
        .find_map(|(at, _)| {
            let start = html[..at].rfind("<tr>")?;
            if html[start..at].contains("</tr>") {
                return None;
            }
            let end = html[at..].find("</tr>")? + at;
            Some(html[start..end].to_owned())
        })
        .unwrap_or_else(|| panic!("{needle} not in a table row: {html}"))
}

fn ids_on(html: &str, prefix: &str) -> Vec<String> {
    html.match_indices(&format!("<code>{prefix}"))
        .map(|(i, _)| {
            let rest = &html[i + "<code>".len()..];
            rest[..rest.find('<').unwrap()].to_owned()
        })
        .collect()
}

/// Seeds channels straight into the store (one transaction), for pagination and timing.
async fn seed_channels(pod: &Pod, n: usize) -> (String, Vec<String>) {
    let store = switchyard::app::open_store(pod.config()).await.unwrap();
    let conn = ConnectorRecord {
        id: "conn_seeded".into(),
        tenant_id: pod.tenant.id.clone(),
        card_id: "im.webhook".into(),
        created_at: 1,
        // Offline since now, inside the grace: offline since long ago, it is the pod's
        // janitor's to deregister, maybe before the channels below reference it.
        offline_since: Some(switchyard_core::ids::now_ms()),
    };
    store.insert_connector(&conn).await.unwrap();
    let url = format!(
        "sqlite://{}",
        pod.data_dir().join("switchyard.db").display()
    );
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let id = format!("cch_seed{i:07}");
        let rec = ChannelRecord {
            id: id.clone(),
            tenant_id: pod.tenant.id.clone(),
            connector_id: conn.id.clone(),
            card_id: conn.card_id.clone(),
            route_socket: None,
            profiles: vec![],
            status: ConnectionStatus::Connected,
            view: serde_json::json!({"display_name": format!("chat {i}")}),
            binding: Some(vec![0; 8]),
            binding_key: None,
            created_at: 1,
            updated_at: 1,
        };
        sqlx::query(
            "INSERT INTO channels (id, tenant_id, connector_id, card_id, route_socket, profiles, \
             status, view, binding, binding_key, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, NULL, '[]', $5, $6, $7, NULL, 1, 1)",
        )
        .bind(&rec.id)
        .bind(&rec.tenant_id)
        .bind(&rec.connector_id)
        .bind(&rec.card_id)
        .bind(rec.status.as_str())
        .bind(rec.view.to_string())
        .bind(rec.binding.clone())
        .execute(&mut *tx)
        .await
        .unwrap();
        ids.push(id);
    }
    tx.commit().await.unwrap();
    pool.close().await;
    (conn.id, ids)
}

#[tokio::test]
async fn pages_walk_keyset_cursors() {
    let pod = Pod::start(PodOptions::default().with(|c| {
        c.operator_tokens =
            serde_json::from_value(serde_json::json!(format!("{OPERATOR}={OPERATOR_TOKEN}")))
                .unwrap();
    }))
    .await;
    let (_, seeded) = seed_channels(&pod, 120).await;
    let mut c = ConsoleClient::new(&pod.admin_url());
    assert_eq!(c.login(OPERATOR_TOKEN).await.status, 303);
    let mut seen = Vec::new();
    let mut path = "/console/channels".to_owned();
    let mut pages = 0;
    loop {
        let p = c.get(&path).await;
        assert_eq!(p.status, 200);
        let ids = ids_on(&p.body, "cch_seed");
        assert!(ids.len() <= 50, "a page holds at most 50 rows");
        seen.extend(ids);
        pages += 1;
        match p.body.find("rel=\"next\" href=\"") {
            Some(i) => {
                let rest = &p.body[i + "rel=\"next\" href=\"".len()..];
                path = rest[..rest.find('"').unwrap()].replace("&amp;", "&");
            }
            None => break,
        }
        assert!(pages < 10, "pagination ends");
    }
    assert_eq!(pages, 3, "120 rows in pages of 50");
    assert_eq!(seen, seeded, "every channel once, in order");
    let o = c.get("/console").await;
    assert!(o.body.contains("<b>120</b>channels"), "{}", o.body);
}

/// 100k channels: the channels page (first and deep pages), the bindings page and the
/// overview stay fast because each is one indexed keyset query or a bounded count. The page
/// times are a figure (docs/console.md), printed, not asserted: run it by hand with
/// `cargo nextest run -p switchyard-e2e --test console --run-ignored all --no-capture pages_stay`.
/// What it asserts is what the pages show with that many rows.
#[tokio::test]
#[ignore = "a figure run by hand (seeds 100k channels)"]
async fn pages_stay_fast_with_100k_channels() {
    let pod = Pod::start(PodOptions::default().with(|c| {
        c.operator_tokens =
            serde_json::from_value(serde_json::json!(format!("{OPERATOR}={OPERATOR_TOKEN}")))
                .unwrap();
    }))
    .await;
    // The seeding is one write transaction of several seconds, longer than SQLite's busy
    // timeout: let the pod finish its own startup writes first.
    eventually(Duration::from_secs(30), "pod ready", || async {
        (pod.readyz().await == Some(200)).then_some(())
    })
    .await;
    let t0 = Instant::now();
    let (_, seeded) = seed_channels(&pod, 100_000).await;
    eprintln!("seeded 100000 channels in {:?}", t0.elapsed());
    let mut c = ConsoleClient::new(&pod.admin_url());
    assert_eq!(c.login(OPERATOR_TOKEN).await.status, 303);
    let deep = format!("/console/channels?after={}", seeded[77_777]);
    for (name, path) in [
        ("overview", "/console"),
        ("channels", "/console/channels"),
        ("channels (page after row 77777)", deep.as_str()),
        ("bindings", "/console/bindings"),
        ("connectors", "/console/connectors"),
    ] {
        // Warm once, then the median of five loads.
        let _ = c.get(path).await;
        let mut times = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            let p = c.get(path).await;
            times.push(t.elapsed());
            assert_eq!(p.status, 200, "{name}");
        }
        times.sort();
        let median = times[2];
        eprintln!("console page {name}: median {median:?} (of {times:?})");
    }
    let p = c.get(&deep).await;
    assert!(p.body.contains(&seeded[77_778]) && !p.body.contains(&seeded[77_777]));
    let o = c.get("/console").await;
    assert!(o.body.contains("<b>10000+</b>channels"), "bounded count");
}
