//! Enrollment and `run` end to end over real TLS: the fake server is served by the pod's
//! mTLS listener code (`switchyard_hosts_tls::server::serve`) with a real host CA.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{FakeServer, create_run, script};
use switchyard_host_agent::enroll::{EnrollArgs, EnrollError, enroll};
use switchyard_host_agent::token::Secret;
use switchyard_host_agent::transport::TransportKind;
use switchyard_host_agent::{RunArgs, run};
use switchyard_hosts_tls::pki::HostCa;
use switchyard_hosts_tls::server::server_config;
use switchyard_protocol::hosts::HostMessage;
use switchyard_protocol::hosts::message::RunEvent;
use tokio_util::sync::CancellationToken;

fn args(server: &str, token: &str, state_dir: &Path, ca: Option<&Path>) -> EnrollArgs {
    EnrollArgs {
        server: server.to_owned(),
        token: Secret::new(token.to_owned()),
        state_dir: state_dir.to_owned(),
        ca: ca.map(Path::to_owned),
        csr_name: "lab-box".into(),
    }
}

#[tokio::test]
async fn enroll_then_run_over_mutual_tls() {
    let ca = HostCa::generate("test host CA").unwrap();
    let (cert, key) = ca
        .server_certificate(&["127.0.0.1".into(), "localhost".into()])
        .unwrap();
    let mut server =
        FakeServer::start_tls(server_config(&ca.cert_pem(), &cert, &key).unwrap()).await;
    *server.state.enroll.lock().unwrap() = Some((ca.clone(), "good-token".into()));
    let base = server.base.to_string();
    let dir = tempfile::tempdir().unwrap();
    let state_dir = dir.path().join("state");
    let ca_file = dir.path().join("server-ca.pem");
    std::fs::write(&ca_file, ca.cert_pem()).unwrap();

    // The public roots do not know the host CA.
    let e = enroll(args(&base, "good-token", &state_dir, None))
        .await
        .unwrap_err();
    assert!(matches!(e, EnrollError::Unreachable { .. }), "{e}");
    assert!(
        e.to_string().contains("UnknownIssuer"),
        "the cause is shown: {e}"
    );
    assert!(!state_dir.exists(), "nothing written on failure");
    // A wrong token: 401 with the server's code.
    let e = enroll(args(&base, "bad-token", &state_dir, Some(&ca_file)))
        .await
        .unwrap_err();
    assert!(matches!(e, EnrollError::Rejected { .. }), "{e}");
    assert!(e.to_string().contains("invalid_token"), "{e}");
    assert!(
        !e.to_string().contains("bad-token"),
        "the token is never shown"
    );
    // Nobody listening.
    let e = enroll(args("http://127.0.0.1:9", "good-token", &state_dir, None))
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("cannot reach the server at http://127.0.0.1:9/hosts/v1/enroll"),
        "{e}"
    );
    let e = enroll(args("ftp://x", "t", &state_dir, None))
        .await
        .unwrap_err();
    assert!(matches!(e, EnrollError::BadUrl(_)), "{e}");

    let id = enroll(args(&base, "good-token", &state_dir, Some(&ca_file)))
        .await
        .unwrap();
    assert_eq!(id.host_id, "host-tls");
    assert_eq!(id.tenant_id, "tenant-1");
    assert_eq!(id.name, "lab-box");
    let mode = |f: &str| {
        std::fs::metadata(state_dir.join(f))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("key.pem"), 0o600);
    assert_eq!(mode(""), 0o700, "the state dir is private");
    assert!(
        std::fs::read_to_string(state_dir.join("key.pem"))
            .unwrap()
            .contains("PRIVATE KEY")
    );
    assert!(
        std::fs::read_to_string(state_dir.join("cert.pem"))
            .unwrap()
            .contains("BEGIN CERTIFICATE")
    );
    assert_eq!(
        std::fs::read_to_string(state_dir.join("ca.pem")).unwrap(),
        ca.cert_pem()
    );
    // Enrolled already: refused before asking the server.
    let e = enroll(args(&base, "good-token", &state_dir, Some(&ca_file)))
        .await
        .unwrap_err();
    assert!(matches!(e, EnrollError::AlreadyEnrolled(_)), "{e}");
    // The token is used up.
    let e = enroll(args(
        &base,
        "good-token",
        &dir.path().join("other"),
        Some(&ca_file),
    ))
    .await
    .unwrap_err();
    assert!(matches!(e, EnrollError::Rejected { .. }), "{e}");

    // `run` insists on the https listener.
    let config = dir.path().join("host.toml");
    let worker = script(
        dir.path(),
        "w.sh",
        "read goal\necho \"tls: $goal\"\necho out > \"$SWITCHYARD_RUN_ARTIFACTS/o.txt\"\n",
    );
    std::fs::write(
        &config,
        format!(
            "[[agents]]\nagent_id = \"a1\"\nruntime = \"exec\"\ncommand = [{:?}]\n",
            worker.display().to_string()
        ),
    )
    .unwrap();
    let run_args = |server: String, transport| RunArgs {
        server,
        state_dir: state_dir.clone(),
        config: config.clone(),
        transport,
        backoff_scale_ms: 20,
    };
    let e = run(
        run_args(base.replace("https", "http"), TransportKind::Wss),
        CancellationToken::new(),
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("must be the https:// URL"), "{e}");

    for transport in [TransportKind::Wss, TransportKind::Https] {
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run(run_args(base.clone(), transport), shutdown.clone()));
        let HostMessage::Register(r) = server.expect_type("register").await.msg else {
            unreachable!()
        };
        assert_eq!(r.connector_id, "host-tls", "{transport:?}");
        server.expect_type("heartbeat").await;
        let run_id = format!("r-{transport:?}");
        server.push(create_run(&run_id, "a1", "over mTLS"));
        let done = server.expect_event(&run_id, "completion").await;
        let HostMessage::RunEvent(e) = done.msg else {
            unreachable!()
        };
        let RunEvent::Completion(c) = e.event else {
            unreachable!()
        };
        assert_eq!(c.summary.as_deref(), Some("tls: over mTLS"));
        assert_eq!(c.artifacts.len(), 1, "the PUT went over mTLS too");
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
    assert!(server.state.peer_certs.load(Ordering::SeqCst) >= 4);
    assert_eq!(
        server.state.no_cert.load(Ordering::SeqCst),
        0,
        "every hosts API call presented the client certificate"
    );
}
