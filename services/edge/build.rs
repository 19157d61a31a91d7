//! Injects build information (version, git tag and revision, build time) at compile time so
//! the Card's `build` and `/health.build` come from the same constants.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!s.is_empty()).then_some(s)
}

/// `YYMMDDHHMM` in UTC, the format the protocol examples use.
fn build_time() -> String {
    if let Ok(fixed) = std::env::var("SWITCHYARD_BUILD_TIME") {
        return fixed;
    }
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!(
        "{:02}{:02}{:02}{:02}{:02}",
        y % 100,
        m,
        d,
        rem / 3600,
        (rem % 3600) / 60
    )
}

/// The revision: `SWITCHYARD_GIT_REVISION` when set (a container build, whose context has
/// no `.git`, passes it as a build argument), else the checkout's HEAD.
fn revision() -> String {
    if let Ok(r) = std::env::var("SWITCHYARD_GIT_REVISION") {
        let r = r.trim();
        if !r.is_empty() && r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return r.chars().take(12).collect();
        }
    }
    git(&["rev-parse", "--short=7", "HEAD"]).unwrap_or_else(|| "unknown".into())
}

fn main() {
    let rev = revision();
    let tag = git(&["describe", "--tags", "--abbrev=0"])
        .unwrap_or_else(|| format!("v{}", env!("CARGO_PKG_VERSION")));
    println!("cargo:rustc-env=SWITCHYARD_GIT_REV={rev}");
    println!("cargo:rustc-env=SWITCHYARD_GIT_TAG={tag}");
    println!("cargo:rustc-env=SWITCHYARD_BUILD_TIME={}", build_time());
    println!("cargo:rerun-if-changed=../../.git/HEAD");
    println!("cargo:rerun-if-changed=../../.git/refs");
    println!("cargo:rerun-if-env-changed=SWITCHYARD_BUILD_TIME");
    println!("cargo:rerun-if-env-changed=SWITCHYARD_GIT_REVISION");
}
