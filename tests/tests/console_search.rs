//! The console's search (tenant, Card, status, id prefix) on the channels, bindings, failures
//! and runs pages of a real pod, the filter kept on the next page's link, odd input refused,
//! the tenant page's own counts, and the overview's charts drawn as inline SVG under a CSP
//! that allows no script.

use switchyard_e2e::console::*;

fn has(body: &str, id: &str) -> bool {
    body.contains(&format!("<code>{id}</code>")) || body.contains(&format!(">{id}</a>"))
}

#[tokio::test]
async fn search_narrows_every_list_page() {
    let cf = ConsoleFixture::start().await;
    let pod = &cf.fx.pod;
    let mut c = ConsoleClient::new(&pod.admin_url());
    assert_eq!(c.login(OPERATOR_TOKEN).await.status, 303);
    let tenant = pod.tenant.id.clone();
    let channel = cf.fx.channel_id.clone();
    let prefix = &channel[..channel.len() - 6];

    // Channels: by id prefix, tenant, status; a filter that matches nothing shows nothing.
    let all = c.get("/console/channels").await;
    assert!(has(&all.body, &channel), "unfiltered");
    assert!(all.body.contains("id=\"f-q\""), "the search form");
    let r = c.get(&format!("/console/channels?q={prefix}")).await;
    assert_eq!(r.status, 200);
    assert!(has(&r.body, &channel));
    assert!(
        r.body.contains(&format!("value=\"{prefix}\"")),
        "the form keeps the search"
    );
    assert!(!has(&r.body, &cf.device_channel), "another channel's id");
    let r = c
        .get(&format!(
            "/console/channels?tenant={tenant}&status=connected"
        ))
        .await;
    assert!(has(&r.body, &channel), "{}", r.body);
    let r = c.get("/console/channels?tenant=ten_nobody").await;
    assert!(!has(&r.body, &channel) && r.body.contains("nothing here"));
    let r = c
        .get(&format!("/console/channels?q={prefix}&status=revoked"))
        .await;
    assert!(!has(&r.body, &channel));
    // Bindings: the Card filter.
    let card = "im.webhook";
    let r = c
        .get(&format!("/console/bindings?card={card}&q={prefix}"))
        .await;
    assert!(has(&r.body, &channel), "{}", r.body);
    let r = c
        .get(&format!("/console/bindings?card=im.nothing&q={prefix}"))
        .await;
    assert!(!has(&r.body, &channel));

    // Runs: by state and by tenant of the run.
    let run_tenant = pod.tenant.id.clone();
    let r = c.get("/console/runs?status=awaiting_approval").await;
    assert!(has(&r.body, &cf.run_id), "{}", r.body);
    let r = c.get("/console/runs?status=completed").await;
    assert!(!has(&r.body, &cf.run_id));
    let r = c
        .get(&format!(
            "/console/runs?tenant={run_tenant}&q={}",
            &cf.run_id[..8]
        ))
        .await;
    assert!(has(&r.body, &cf.run_id));
    assert!(!r.body.contains("name=\"card\""), "runs have no Card");

    // Failures: the status set is closed; the search rides along the next-page link.
    let r = c
        .get("/console/failures?status=failed&tenant=ten_nobody")
        .await;
    assert_eq!(r.status, 200);
    assert!(r.body.contains("nothing here"));

    // Odd input is refused, never put in a query or a page.
    for bad in [
        "/console/failures?status=pending%27--",
        "/console/channels?q=cch%25",
        "/console/runs?q=%3Cscript%3E",
    ] {
        let r = c.get(bad).await;
        assert_eq!(r.status, 400, "{bad}");
        assert!(!r.body.contains("<script>"));
    }

    // The tenant page: its own counts now, links to its filtered pages, and its own charts.
    let r = c.get(&format!("/console/tenants/{tenant}")).await;
    assert_eq!(r.status, 200);
    assert!(r.body.contains("id=\"tenant-now\""), "{}", r.body);
    assert!(
        r.body
            .contains(&format!("/console/failures?tenant={tenant}"))
    );
    assert!(
        r.body.contains("The tenant&#39;s own messages")
            || r.body.contains("The tenant's own messages")
    );
    assert!(r.body.contains("id=\"chart-accepted\""));
    assert!(r.body.contains("id=\"chart-tool-latency\""));
}

#[tokio::test]
async fn the_overview_draws_its_charts_without_a_script() {
    let cf = ConsoleFixture::start().await;
    let pod = &cf.fx.pod;
    let mut c = ConsoleClient::new(&pod.admin_url());
    assert_eq!(c.login(OPERATOR_TOKEN).await.status, 303);
    let r = c.get("/console").await;
    assert_eq!(r.status, 200);
    let csp = r
        .headers
        .get("content-security-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    assert!(
        !csp.contains("script-src"),
        "no script source allowed: {csp}"
    );
    for id in [
        "accepted",
        "delivered",
        "failed",
        "latency",
        "outbox",
        "outbox-age",
        "sockets",
        "channels",
        "tools",
        "tool-latency",
    ] {
        assert!(r.body.contains(&format!("id=\"chart-{id}\"")), "chart {id}");
    }
    assert!(r.body.contains("<svg"));
    assert!(!r.body.contains("<script"), "no script in the page");
}
