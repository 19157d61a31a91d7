//! Load stages: a rate profile made of linear ramps (`--ramp 0:1000/s:60s,1000/s:1000/s:300s`)
//! and an optional soak that holds the last rate (`--soak 1h`). Operation `n` is due when the
//! integral of the rate reaches `n`, so a ramp from 0 to 1000/s over 60 s starts 30 000
//! operations, spread as the rate grows.

use std::time::Duration;

use serde::Serialize;

use crate::args::parse_duration;

/// One stage: the rate goes linearly from `from_per_s` to `to_per_s` over `seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stage {
    pub from_per_s: f64,
    pub to_per_s: f64,
    pub seconds: f64,
}

impl Stage {
    fn ops(&self) -> f64 {
        (self.from_per_s + self.to_per_s) / 2.0 * self.seconds
    }
}

/// A rate profile; the load lasts as long as its stages together.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Profile {
    pub stages: Vec<Stage>,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let num = t.strip_suffix("/s").unwrap_or(t);
    match num.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r >= 0.0 => Ok(r),
        _ => Err(format!(
            "invalid rate {s:?}; use a number of operations per second such as 1000/s"
        )),
    }
}

/// `FROM:TO:DURATION` (a ramp) or `RATE:DURATION` (a steady stage), comma separated:
/// `0:1000/s:60s,1000/s:1000/s:300s`.
pub fn parse_ramp(s: &str) -> Result<Profile, String> {
    let mut stages = Vec::new();
    for part in s.split(',').map(str::trim) {
        let fields: Vec<&str> = part.split(':').collect();
        let (from, to, dur) = match fields.as_slice() {
            [from, to, dur] => (parse_rate(from)?, parse_rate(to)?, *dur),
            [rate, dur] => {
                let r = parse_rate(rate)?;
                (r, r, *dur)
            }
            _ => {
                return Err(format!(
                    "invalid stage {part:?}; use FROM:TO:DURATION (0:1000/s:60s) or RATE:DURATION (500/s:5m)"
                ));
            }
        };
        let d = parse_duration(dur)?;
        if d.is_zero() {
            return Err(format!("stage {part:?} has no duration"));
        }
        stages.push(Stage {
            from_per_s: from,
            to_per_s: to,
            seconds: d.as_secs_f64(),
        });
    }
    let p = Profile { stages };
    if p.peak() <= 0.0 {
        return Err("every stage of --ramp has rate 0".into());
    }
    Ok(p)
}

impl Profile {
    pub fn constant(rate: f64, d: Duration) -> Self {
        Self {
            stages: vec![Stage {
                from_per_s: rate,
                to_per_s: rate,
                seconds: d.as_secs_f64(),
            }],
        }
    }

    /// Holds the last stage's final rate for `d` more (a soak after the ramp).
    pub fn with_soak(mut self, d: Duration) -> Self {
        let last = self.stages.last().map_or(0.0, |s| s.to_per_s);
        self.stages.push(Stage {
            from_per_s: last,
            to_per_s: last,
            seconds: d.as_secs_f64(),
        });
        self
    }

    pub fn total(&self) -> Duration {
        Duration::from_secs_f64(self.stages.iter().map(|s| s.seconds).sum())
    }

    pub fn peak(&self) -> f64 {
        self.stages
            .iter()
            .flat_map(|s| [s.from_per_s, s.to_per_s])
            .fold(0.0, f64::max)
    }

    /// The same shape with every rate multiplied by `factor` (a flow whose own rate is the
    /// peak of the inbound ramp).
    pub fn scaled(&self, factor: f64) -> Self {
        Self {
            stages: self
                .stages
                .iter()
                .map(|s| Stage {
                    from_per_s: s.from_per_s * factor,
                    to_per_s: s.to_per_s * factor,
                    seconds: s.seconds,
                })
                .collect(),
        }
    }

    /// The offered rate `t` into the load.
    pub fn rate_at(&self, t: Duration) -> f64 {
        let mut t = t.as_secs_f64();
        for s in &self.stages {
            if t < s.seconds {
                return s.from_per_s + (s.to_per_s - s.from_per_s) * t / s.seconds;
            }
            t -= s.seconds;
        }
        0.0
    }

    /// Operations the profile starts in total.
    pub fn expected_ops(&self) -> f64 {
        self.stages.iter().map(Stage::ops).sum()
    }

    /// When operation `n` (0-based) is due, counted from the start; `None` past the end.
    pub fn due(&self, n: u64) -> Option<Duration> {
        let mut before = 0.0;
        let mut offset = 0.0;
        let n = n as f64;
        for s in &self.stages {
            let ops = s.ops();
            if n < before + ops {
                let m = n - before;
                // m = r0 t + a t^2 with a = (r1 - r0) / (2 D); the root that is reached
                // first, in the form that is stable for a = 0 and a < 0.
                let a = (s.to_per_s - s.from_per_s) / (2.0 * s.seconds);
                let b = s.from_per_s;
                let t = if m <= 0.0 {
                    0.0
                } else {
                    2.0 * m / (b + (b * b + 4.0 * a * m).max(0.0).sqrt())
                };
                return Some(Duration::from_secs_f64(offset + t.min(s.seconds)));
            }
            before += ops;
            offset += s.seconds;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ramps_and_steady_stages() {
        let p = parse_ramp("0:1000/s:60s,1000/s:1000/s:300s").unwrap();
        assert_eq!(p.stages.len(), 2);
        assert_eq!(p.stages[0].to_per_s, 1000.0);
        assert_eq!(p.total(), Duration::from_secs(360));
        assert_eq!(p.peak(), 1000.0);
        let s = parse_ramp("50:2m").unwrap();
        assert_eq!((s.stages[0].from_per_s, s.stages[0].seconds), (50.0, 120.0));
        assert!(parse_ramp("0:0:10s").is_err());
        assert!(parse_ramp("10/s").is_err());
        assert!(parse_ramp("x:10:5s").is_err());
        assert!(parse_ramp("1:10:0s").is_err());
        assert!(parse_ramp("-1:10:5s").is_err());
    }

    #[test]
    fn operations_follow_the_rate() {
        // 0 -> 100/s over 10 s: 500 operations, half of them in the last 2.93 s.
        let p = parse_ramp("0:100:10s").unwrap();
        assert_eq!(p.expected_ops(), 500.0);
        assert_eq!(p.due(0), Some(Duration::ZERO));
        let t = p.due(125).unwrap().as_secs_f64();
        assert!((t - 5.0).abs() < 1e-9, "{t}");
        assert!(p.due(499).is_some());
        assert_eq!(p.due(500), None);
        // Steady: exactly n / rate.
        let c = Profile::constant(20.0, Duration::from_secs(2));
        assert_eq!(c.due(10), Some(Duration::from_millis(500)));
        assert_eq!(c.due(40), None);
        // Down ramp and a soak after it.
        let d = parse_ramp("100:0:10s")
            .unwrap()
            .with_soak(Duration::from_secs(5));
        let t = d.due(375).unwrap().as_secs_f64();
        assert!((t - 5.0).abs() < 1e-9, "{t}");
        assert_eq!(d.due(500), None, "the soak holds the last rate: 0");
        let up = parse_ramp("0:10:10s")
            .unwrap()
            .with_soak(Duration::from_secs(10));
        assert_eq!(up.expected_ops(), 150.0);
        assert_eq!(up.due(50), Some(Duration::from_secs(10)));
        assert_eq!(up.due(60), Some(Duration::from_secs(11)));
        assert!((up.rate_at(Duration::from_secs(5)) - 5.0).abs() < 1e-9);
        assert_eq!(up.scaled(0.5).peak(), 5.0);
    }
}
