//! The open-file limit (RLIMIT_NOFILE) of the loadtest, which the pods it starts inherit.
//! The workspace forbids `unsafe`, so there is no `setrlimit` call: the soft limit is raised
//! to the hard limit with util-linux `prlimit --pid` on this very process, when it exists.
//! Above the hard limit only the shell (`ulimit -n`, as root or with a higher hard limit)
//! can help.

/// `(soft, hard)` from `/proc/self/limits`; `u64::MAX` for unlimited.
pub fn read() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse(&text)
}

fn parse(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    let mut it = line["Max open files".len()..].split_whitespace();
    let num = |s: Option<&str>| match s? {
        "unlimited" => Some(u64::MAX),
        n => n.parse().ok(),
    };
    Some((num(it.next())?, num(it.next())?))
}

/// Raises the soft limit to the hard one; returns the soft limit in force afterwards and a
/// note of what was done.
pub fn raise() -> (u64, String) {
    let Some((soft, hard)) = read() else {
        return (0, "could not read /proc/self/limits".into());
    };
    if soft >= hard {
        return (soft, format!("open-file limit {soft} (the hard limit)"));
    }
    let ok = std::process::Command::new("prlimit")
        .args([
            "--pid",
            &std::process::id().to_string(),
            &format!("--nofile={hard}:{hard}"),
        ])
        .status()
        .is_ok_and(|s| s.success());
    match read() {
        Some((now, _)) if ok && now > soft => (
            now,
            format!("open-file limit raised from {soft} to {now} (hard limit) with prlimit"),
        ),
        _ => (
            soft,
            format!(
                "open-file limit {soft} (hard {hard}); could not raise it with prlimit: run `ulimit -n {hard}` first"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_limits() {
        let t = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n";
        assert_eq!(parse(t), Some((1024, 524288)));
        let u = "Max open files            unlimited            unlimited            files\n";
        assert_eq!(parse(u), Some((u64::MAX, u64::MAX)));
        assert!(read().is_some());
    }
}
