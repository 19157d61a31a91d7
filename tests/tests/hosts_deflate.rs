//! permessage-deflate (RFC 7692) on the Connector API v1 WebSocket (issue 9): a client that
//! offers it gets it, its compressed messages are understood, the server's larger messages
//! come back compressed, and a decompression bomb closes the socket with 1009 instead of
//! being inflated. The client here is written against the RFCs byte by byte (not with the
//! server's WebSocket library), so the test checks the wire, not the library against itself.

use std::sync::Arc;
use std::time::Duration;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use serde_json::{Value, json};
use switchyard_e2e::hosts::{bind_device_channel, enroll_host, tool};
use switchyard_e2e::{Pod, PodOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

const DEFLATE_TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

struct RawClient {
    io: TlsStream<TcpStream>,
    buf: Vec<u8>,
    deflate: Compress,
    inflate: Decompress,
}

struct InFrame {
    opcode: u8,
    compressed: bool,
    payload: Vec<u8>,
}

impl RawClient {
    /// TLS with the host's certificate, then the upgrade offering permessage-deflate;
    /// returns the client and the server's `Sec-WebSocket-Extensions` answer.
    async fn connect(
        host: &switchyard_xagent_sim::host::EnrolledHost,
        jwt: &str,
    ) -> (Self, String) {
        let cfg = switchyard_hosts_tls::client::client_config(
            &host.ca_pem,
            Some(&host.cert_pem),
            Some(&host.key_pem),
        )
        .expect("client config");
        let addr = host.tls_url.trim_start_matches("https://").to_owned();
        let tcp = TcpStream::connect(&addr).await.expect("tcp");
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut io = tokio_rustls::TlsConnector::from(Arc::<rustls::ClientConfig>::clone(&cfg))
            .connect(name, tcp)
            .await
            .expect("tls");
        let req = format!(
            "GET /hosts/v1/ws HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\
             Authorization: Bearer {jwt}\r\n\r\n"
        );
        io.write_all(req.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        let head_end = loop {
            let mut chunk = [0u8; 4096];
            let n = io.read(&mut chunk).await.expect("read the upgrade answer");
            assert!(n > 0, "connection closed during the upgrade");
            buf.extend_from_slice(&chunk[..n]);
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        assert!(head.starts_with("HTTP/1.1 101"), "upgrade answer: {head}");
        let ext = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("sec-websocket-extensions")
                    .then(|| v.trim().to_owned())
            })
            .unwrap_or_default();
        buf.drain(..head_end);
        let client = Self {
            io,
            buf,
            deflate: Compress::new(Compression::default(), false),
            inflate: Decompress::new(false),
        };
        (client, ext)
    }

    /// One masked client frame; `compress` sets RSV1 and deflates the payload.
    async fn send(&mut self, opcode: u8, payload: &[u8], compress: bool) {
        let body = if compress {
            let mut out = Vec::with_capacity(payload.len() / 2 + 64);
            self.deflate
                .compress_vec(payload, &mut out, FlushCompress::Sync)
                .unwrap();
            while out.capacity() == out.len() {
                out.reserve(out.len());
                self.deflate
                    .compress_vec(&[], &mut out, FlushCompress::Sync)
                    .unwrap();
            }
            assert!(out.ends_with(&DEFLATE_TAIL));
            out.truncate(out.len() - 4);
            out
        } else {
            payload.to_vec()
        };
        let mut frame = vec![0x80 | if compress { 0x40 } else { 0 } | opcode];
        let len = body.len();
        if len < 126 {
            frame.push(0x80 | len as u8);
        } else if len <= u16::MAX as usize {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            frame.push(0x80 | 127);
            frame.extend_from_slice(&(len as u64).to_be_bytes());
        }
        let mask = [0x37, 0xfa, 0x21, 0x3d];
        frame.extend_from_slice(&mask);
        frame.extend(body.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.io.write_all(&frame).await.unwrap();
    }

    async fn fill(&mut self, n: usize) -> bool {
        while self.buf.len() < n {
            let mut chunk = [0u8; 16384];
            match tokio::time::timeout(Duration::from_secs(20), self.io.read(&mut chunk)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return false,
                Ok(Ok(k)) => self.buf.extend_from_slice(&chunk[..k]),
                Err(_) => panic!("no frame from the server within 20 s"),
            }
        }
        true
    }

    /// The next server frame (unmasked, unfragmented), inflated when RSV1 is set.
    async fn recv(&mut self) -> Option<InFrame> {
        if !self.fill(2).await {
            return None;
        }
        let (b0, b1) = (self.buf[0], self.buf[1]);
        assert_eq!(b1 & 0x80, 0, "server frames are not masked");
        assert_ne!(b0 & 0x80, 0, "the server sends whole messages");
        let (len, at) = match b1 & 0x7f {
            126 => {
                assert!(self.fill(4).await);
                (u16::from_be_bytes([self.buf[2], self.buf[3]]) as usize, 4)
            }
            127 => {
                assert!(self.fill(10).await);
                (
                    u64::from_be_bytes(self.buf[2..10].try_into().unwrap()) as usize,
                    10,
                )
            }
            n => (n as usize, 2),
        };
        assert!(self.fill(at + len).await, "frame cut short");
        let raw: Vec<u8> = self.buf.drain(..at + len).skip(at).collect();
        let compressed = b0 & 0x40 != 0;
        let payload = if compressed {
            let mut input = raw;
            input.extend_from_slice(&DEFLATE_TAIL);
            let mut out = Vec::with_capacity(input.len() * 8 + 1024);
            loop {
                let before = self.inflate.total_in();
                self.inflate
                    .decompress_vec(&input, &mut out, FlushDecompress::Sync)
                    .expect("the server's deflate stream inflates");
                let used = (self.inflate.total_in() - before) as usize;
                input.drain(..used);
                if input.is_empty() {
                    break;
                }
                out.reserve(out.len().max(1024));
            }
            out
        } else {
            raw
        };
        Some(InFrame {
            opcode: b0 & 0x0f,
            compressed,
            payload,
        })
    }

    /// The next text message as JSON, answering pings on the way.
    async fn next_json(&mut self) -> (Value, bool, usize) {
        loop {
            let f = self.recv().await.expect("the socket stays open");
            match f.opcode {
                0x1 => {
                    let v = serde_json::from_slice(&f.payload).expect("JSON text");
                    return (v, f.compressed, f.payload.len());
                }
                0x9 => self.send(0xA, &f.payload, false).await,
                0xA => {}
                op => panic!("unexpected opcode {op}"),
            }
        }
    }
}

/// Reads messages until one of type `ty`; returns it, whether it came compressed, its size.
async fn skip_to(c: &mut RawClient, ty: &str) -> (Value, bool, usize) {
    loop {
        let m = c.next_json().await;
        if m.0["type"] == ty {
            return m;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressing_host_negotiates_deflate_and_a_bomb_closes_with_1009() {
    let pod = Pod::start(PodOptions::default()).await;
    let host = enroll_host(&pod, &pod.tenant.id, "deflate-box").await;
    let jwt = host.jwt().await;
    let (mut c, ext) = RawClient::connect(&host, &jwt).await;
    assert!(
        ext.starts_with("permessage-deflate"),
        "the server accepts the offer: {ext:?}"
    );

    // register and capabilities, compressed: the server inflates and answers.
    c.send(0x1, host.register_msg().to_json().as_bytes(), true)
        .await;
    let (ack, _, _) = c.next_json().await;
    assert_eq!(ack["type"], "register_ack", "{ack}");
    let caps = host.capabilities_msg(&["a", "b"]).unwrap();
    c.send(0x1, caps.to_json().as_bytes(), true).await;
    // A heartbeat, compressed, is answered on the same socket.
    c.send(0x1, host.heartbeat().to_json().as_bytes(), true)
        .await;
    skip_to(&mut c, "heartbeat_ack").await;

    // xAgent starts a run with a long goal: the create_run the host gets is well over the
    // compression threshold and arrives compressed, and inflates to the goal sent.
    let pairing = ack["config"]["pairing_code"]
        .as_str()
        .expect("pairing code in register_ack")
        .to_owned();
    let (_sim, conn, ch) = bind_device_channel(&pod, "deflate-box", &pairing).await;
    let goal = "summarise the quarterly report and list every open question; ".repeat(40);
    let started = tool(
        &conn,
        &ch,
        "agent_run_start",
        json!({"goal": goal, "agent_id": "a"}),
    )
    .await;
    assert!(started["result"]["run_id"].is_string(), "{started}");
    let (run, compressed, len) = skip_to(&mut c, "create_run").await;
    assert_eq!(run["goal"], goal.as_str());
    assert!(len > switchyard::host_ws::COMPRESS_FROM);
    assert!(compressed, "a {len}-byte create_run goes out compressed");

    // An uncompressed frame on the same socket is fine too (RSV1 is per message).
    c.send(0x1, host.heartbeat().to_json().as_bytes(), false)
        .await;
    skip_to(&mut c, "heartbeat_ack").await;

    // A bomb: 64 MiB of spaces deflate to ~64 KiB; the limit (limits.max_frame_bytes, 1 MiB)
    // holds after inflation, so the server closes with 1009 rather than allocating 64 MiB.
    let bomb = vec![b' '; 64 * 1024 * 1024];
    c.send(0x1, &bomb, true).await;
    let close = loop {
        match c.recv().await {
            Some(f) if f.opcode == 0x8 => break f,
            Some(_) => continue,
            None => panic!("the socket closed without a close frame"),
        }
    };
    assert!(close.payload.len() >= 2, "the close frame has a code");
    let code = u16::from_be_bytes([close.payload[0], close.payload[1]]);
    assert_eq!(code, 1009, "message too big");

    // The pod is fine: the host reconnects (plain tungstenite, no deflate) and registers.
    let (_conn, cfg) = host.online(&["a"]).await;
    assert!(cfg["pairing_code"].is_string());
}
