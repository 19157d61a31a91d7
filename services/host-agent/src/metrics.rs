//! Live host metrics for `heartbeat`: CPU use from `/proc/stat` deltas and used memory
//! (`MemTotal - MemAvailable` from `/proc/meminfo`).

/// CPU time counters of the aggregate `cpu` line, in jiffies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    pub idle: u64,
    pub total: u64,
}

/// Parses the first (`cpu `) line of `/proc/stat`. `guest` and `guest_nice` are already
/// counted in `user` and `nice`, so they are left out of the total.
pub fn parse_proc_stat(text: &str) -> Option<CpuTimes> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    if v.len() < 4 {
        return None;
    }
    let total: u64 = v.iter().take(8).sum();
    // idle + iowait
    let idle = v[3] + v.get(4).copied().unwrap_or(0);
    Some(CpuTimes { idle, total })
}

/// Used memory in MiB from `/proc/meminfo` text.
pub fn parse_meminfo_used_mb(text: &str) -> Option<u64> {
    let field = |name: &str| -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
    };
    let total = field("MemTotal:")?;
    let available = field("MemAvailable:")?;
    Some(total.saturating_sub(available) / 1024)
}

/// CPU busy percentage between two readings, 0..=100.
pub fn cpu_pct(prev: CpuTimes, now: CpuTimes) -> f64 {
    let total = now.total.saturating_sub(prev.total);
    let idle = now.idle.saturating_sub(prev.idle);
    if total == 0 {
        return 0.0;
    }
    let busy = total.saturating_sub(idle) as f64 * 100.0 / total as f64;
    (busy * 10.0).round().clamp(0.0, 1000.0) / 10.0
}

/// Remembers the previous `/proc/stat` reading so each heartbeat reports the CPU use since
/// the one before.
#[derive(Debug, Default)]
pub struct CpuSampler {
    prev: Option<CpuTimes>,
}

impl CpuSampler {
    /// A sampler primed with a first reading.
    pub fn new() -> Self {
        Self {
            prev: read_cpu_times(),
        }
    }

    /// CPU use since the previous call (or since `new`); 0 when `/proc/stat` is unreadable.
    pub fn sample(&mut self) -> f64 {
        let Some(now) = read_cpu_times() else {
            return 0.0;
        };
        let pct = self.prev.map_or(0.0, |prev| cpu_pct(prev, now));
        self.prev = Some(now);
        pct
    }
}

fn read_cpu_times() -> Option<CpuTimes> {
    parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// Used memory in MiB; 0 when `/proc/meminfo` is unreadable.
pub fn memory_used_mb() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| parse_meminfo_used_mb(&t))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat() {
        let text = "cpu  100 5 50 800 20 1 2 3 40 0\ncpu0 1 2 3 4\nintr 1\n";
        let t = parse_proc_stat(text).unwrap();
        assert_eq!(t.idle, 820);
        assert_eq!(t.total, 100 + 5 + 50 + 800 + 20 + 1 + 2 + 3);
        assert!(parse_proc_stat("intr 1\n").is_none());
        assert!(parse_proc_stat("cpu  1 x 3 4\n").is_none());
    }

    #[test]
    fn cpu_percentages() {
        let a = CpuTimes {
            idle: 800,
            total: 1000,
        };
        let b = CpuTimes {
            idle: 850,
            total: 1200,
        };
        assert_eq!(cpu_pct(a, b), 75.0);
        assert_eq!(cpu_pct(a, a), 0.0);
        let all_idle = CpuTimes {
            idle: 1000,
            total: 1200,
        };
        assert_eq!(cpu_pct(a, all_idle), 0.0);
    }

    #[test]
    fn parses_meminfo() {
        let text =
            "MemTotal:       16384000 kB\nMemFree:         100 kB\nMemAvailable:    8192000 kB\n";
        assert_eq!(parse_meminfo_used_mb(text), Some(8000));
        assert_eq!(parse_meminfo_used_mb("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn real_proc_values_are_sane() {
        let mut s = CpuSampler::new();
        // Burn a little CPU so the delta is not empty.
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let pct = s.sample();
        assert!((0.0..=100.0).contains(&pct), "{pct}");
        let used = memory_used_mb();
        let total = std::fs::read_to_string("/proc/meminfo")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|r| r.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap()
            / 1024;
        assert!(used > 0 && used < total, "used {used} of {total} MiB");
    }
}
