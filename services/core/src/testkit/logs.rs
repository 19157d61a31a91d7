//! Everything a test binary logs, kept to grep for secrets.

use std::sync::{Arc, Mutex, OnceLock};

static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Captures everything logged in this test binary, at trace level for every crate. Only the
/// first call installs the subscriber; later ones do nothing.
pub fn init_logs() {
    init_logs_with("trace");
}

/// [`init_logs`] with an `EnvFilter` directive of the caller's (end-to-end tests keep their
/// pods' dependencies at info, or the log outgrows the test).
pub fn init_logs_with(filter: &str) {
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let writer = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_ansi(false)
            .with_writer(move || LogWriter(writer.clone()))
            .try_init();
        buf
    });
}

/// What was logged since [`init_logs`], empty before it.
pub fn captured_logs() -> String {
    LOGS.get()
        .map(|b| String::from_utf8_lossy(&b.lock().unwrap_or_else(|p| p.into_inner())).into_owned())
        .unwrap_or_default()
}
