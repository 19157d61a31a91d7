//! Operator credentials against a real pod (issue 23, finding 4): guessing is bounded per
//! source address (sign-in and Bearer alike) without locking out the operator elsewhere, the
//! limiter fails closed when the ephemeral store fails, rotating a token ends the sessions
//! opened with it, and the operator API says 401 before it looks at the request.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::process::Stdio;
use std::time::Duration;

use switchyard::config::Config;
use switchyard_e2e::console::{Answer, ConsoleClient};
use switchyard_e2e::{Pod, PodOptions, eventually, free_port};
use tokio::process::{Child, Command};

const OPERATOR: &str = "alice@example.com";
/// 32 random bytes, hex (`openssl rand -hex 32`).
const TOKEN: &str = "9f2c4e81b7a35d60c1e8f4a2b9d07c3e5a61f8d2c4b7e09a3f5d1c8b6e2a4f70";
const ROTATED: &str = "3b8e1f6a9c2d4e70b5a18f3c6d9e2b4a7c1f0e5d8b3a6c9f2e4d7b0a1c5e8f36";

fn tokens(c: &mut Config, token: &str) {
    c.operator_tokens = serde_json::from_value(serde_json::json!(format!("{OPERATOR}={token}")))
        .expect("operator tokens");
}

/// Where the console and the operator API are served.
fn admin(pod: &Pod) -> String {
    pod.admin_url()
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("address")
}

fn tally(statuses: &[u16]) -> BTreeMap<u16, usize> {
    let mut m = BTreeMap::new();
    for s in statuses {
        *m.entry(*s).or_insert(0) += 1;
    }
    m
}

async fn redis_on(port: u16) -> Child {
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn redis-server");
    eventually(
        Duration::from_secs(10),
        "redis-server to listen",
        || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
                .map(drop)
        },
    )
    .await;
    child
}

/// The guessing attack: wrong tokens from one address, through the sign-in form and as
/// Bearer tokens on the console and on `/admin/v1`; the operator, elsewhere, signs in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guessing_is_bounded_per_source_and_the_operator_still_gets_in() {
    let pod = Pod::start(PodOptions::default().with(|c| tokens(c, TOKEN))).await;
    let base = admin(&pod);

    let mut signin = ConsoleClient::from_address(&base, ip("127.0.0.2"));
    let mut statuses = Vec::new();
    for i in 0..40 {
        statuses.push(signin.login(&format!("{:064x}", i)).await.status);
    }
    let signin_tally = tally(&statuses);

    let mut bearer_api = ConsoleClient::from_address(&base, ip("127.0.0.5"));
    let mut statuses = Vec::new();
    for i in 0..120 {
        let a: Answer = bearer_api
            .get_bearer(
                "/admin/v1/hosts?tenant=nobody",
                &format!("{:064x}", i + 1000),
            )
            .await;
        statuses.push(a.status);
    }
    let api_tally = tally(&statuses);

    let mut bearer_console = ConsoleClient::from_address(&base, ip("127.0.0.6"));
    let mut statuses = Vec::new();
    for i in 0..120 {
        let a = bearer_console
            .get_bearer("/console/channels", &format!("{:064x}", i + 2000))
            .await;
        statuses.push(a.status);
    }
    let console_tally = tally(&statuses);

    // The operator, from another address, right after all of that.
    let mut operator = ConsoleClient::from_address(&base, ip("127.0.0.3"));
    let operator_signin = operator.login(TOKEN).await.status;
    let operator_api = operator
        .get_bearer(&format!("/admin/v1/hosts?tenant={}", pod.tenant.id), TOKEN)
        .await
        .status;
    // The right token from a source that has guessed too often.
    let locked_source_right_token = bearer_api
        .get_bearer(&format!("/admin/v1/hosts?tenant={}", pod.tenant.id), TOKEN)
        .await
        .status;

    println!(
        "guessing: sign-in x40 {signin_tally:?}; /admin/v1 Bearer x120 {api_tally:?}; \
         /console Bearer x120 {console_tally:?}; operator elsewhere: sign-in {operator_signin}, \
         /admin/v1 {operator_api}; right token from the guessing source {locked_source_right_token}"
    );
    assert_eq!(
        signin_tally,
        BTreeMap::from([(401, 10), (429, 30)]),
        "sign-in guesses"
    );
    assert_eq!(
        api_tally,
        BTreeMap::from([(401, 10), (429, 110)]),
        "/admin/v1 Bearer guesses"
    );
    assert_eq!(
        console_tally,
        BTreeMap::from([(401, 10), (429, 110)]),
        "/console Bearer guesses"
    );
    assert_eq!(operator_signin, 303, "the operator signs in from elsewhere");
    assert_eq!(operator_api, 200);
    assert_eq!(locked_source_right_token, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_api_says_401_before_reading_the_request() {
    let pod = Pod::start(PodOptions::default().with(|c| tokens(c, TOKEN))).await;
    let mut c = ConsoleClient::new(&admin(&pod));
    // No token, and a query the handler would refuse (no tenant): the token comes first.
    assert_eq!(c.get("/admin/v1/approvals").await.status, 401);
    assert_eq!(c.get("/admin/v1/hosts").await.status, 401);
    let r = c
        .http
        .post(format!("{}/admin/v1/approvals/x/grant", admin(&pod)))
        .body("not json")
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status(), 401);
    // With the token, the request's own faults are reported.
    assert_eq!(c.get_bearer("/admin/v1/approvals", TOKEN).await.status, 400);
}

/// Sessions live in the shared ephemeral store (Redis here, as in a cluster): rotating the
/// token ends the sessions opened with the old one; the new token's sessions work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_a_token_ends_its_sessions() {
    let port = free_port();
    let _redis = redis_on(port).await;
    let prefix = format!("op_rotate_{}", switchyard_core::ids::random_secret(4));
    let mut pod = Pod::start(PodOptions::default().with(|c| {
        tokens(c, TOKEN);
        c.redis_url = Some(format!("redis://127.0.0.1:{port}"));
        c.redis_key_prefix = prefix.clone();
    }))
    .await;
    let mut old = ConsoleClient::new(&admin(&pod));
    assert_eq!(old.login(TOKEN).await.status, 303);
    assert_eq!(old.get("/console/channels").await.status, 200);

    pod.restart_with(|c| tokens(c, ROTATED)).await;
    let mut old = ConsoleClient {
        base: admin(&pod),
        ..old
    };
    let r = eventually(Duration::from_secs(20), "the pod to serve again", || {
        let c = old.http.clone();
        let url = format!("{}/livez", admin(&pod));
        async move { c.get(url).send().await.ok().map(drop) }
    });
    r.await;
    let r = old.get("/console/channels").await;
    assert_eq!(
        (r.status, r.location()),
        (303, Some("/console/login")),
        "a session opened with a rotated token has ended"
    );
    let mut new = ConsoleClient::new(&admin(&pod));
    assert_eq!(new.login(TOKEN).await.status, 401, "the old token is gone");
    assert_eq!(new.login(ROTATED).await.status, 303);
    assert_eq!(new.get("/console/channels").await.status, 200);
}

/// With the ephemeral store down, the limiter cannot count: operator authentication is
/// refused (503) instead of letting guesses through uncounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limiter_fails_closed_when_the_store_fails() {
    let port = free_port();
    let mut redis = redis_on(port).await;
    let prefix = format!("op_closed_{}", switchyard_core::ids::random_secret(4));
    let pod = Pod::start(PodOptions::default().with(|c| {
        tokens(c, TOKEN);
        c.redis_url = Some(format!("redis://127.0.0.1:{port}"));
        c.redis_key_prefix = prefix.clone();
    }))
    .await;
    let mut c = ConsoleClient::new(&admin(&pod));
    let path = format!("/admin/v1/hosts?tenant={}", pod.tenant.id);
    assert_eq!(c.get_bearer(&path, TOKEN).await.status, 200);

    let _ = redis.kill().await;
    let mut statuses = Vec::new();
    for i in 0..20 {
        statuses.push(c.get_bearer(&path, &format!("{:064x}", i)).await.status);
        statuses.push(c.login(&format!("{:064x}", i + 100)).await.status);
    }
    let down = tally(&statuses);
    println!("ephemeral store down: 20 Bearer + 20 sign-in guesses {down:?}");
    assert_eq!(
        down,
        BTreeMap::from([(503, 40)]),
        "guesses are not judged uncounted"
    );
}
