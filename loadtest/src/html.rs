//! The HTML report: one self-contained file (inline CSS and SVG, no script, no external
//! asset) with the summary table, thresholds and verdict, and plots over time of each flow's
//! throughput and latency percentiles and of the pods' CPU and RSS, with disruptions, stage
//! boundaries and the end of the load marked on every timeline.

use std::fmt::Write as _;

use crate::report::{EXIT_THRESHOLD, Report};

const W: f64 = 760.0;
const H: f64 = 230.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 28.0;
const BOTTOM: f64 = 32.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            _ => o.push(c),
        }
    }
    o
}

struct Line<'a> {
    label: String,
    color: &'a str,
    dashed: bool,
    values: &'a [Option<f64>],
}

/// A vertical line on the timeline.
struct Mark {
    at_s: f64,
    label: String,
    color: &'static str,
    dashed: bool,
}

/// A round step giving about five ticks up to `max`.
fn nice_step(max: f64) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let f = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    };
    f * mag
}

fn fmt_tick(v: f64) -> String {
    if v >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn chart(
    title: &str,
    unit: &str,
    t_s: &[f64],
    x_max: f64,
    lines: &[Line],
    marks: &[Mark],
) -> String {
    let y_max_data = lines
        .iter()
        .flat_map(|l| l.values.iter().flatten())
        .fold(0.0f64, |a, &b| a.max(b));
    let step = nice_step(y_max_data * 1.05);
    let y_max = ((y_max_data * 1.05 / step).ceil() * step).max(step);
    let x_max = x_max.max(1.0);
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let x = |t: f64| LEFT + t / x_max * pw;
    let y = |v: f64| TOP + ph - (v / y_max).min(1.0) * ph;
    let mut s = String::new();
    let _ = write!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img"><title>{t}</title><rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="#fff" stroke="#bbb"/><text x="{LEFT}" y="16" class="t">{t}</text>"##,
        t = escape(title)
    );
    // Y grid and labels.
    let mut v = 0.0;
    while v <= y_max + step / 2.0 {
        let yy = y(v);
        let _ = write!(
            s,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" class="a" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 4.0,
            yy + 4.0,
            fmt_tick(v)
        );
        v += step;
    }
    let _ = write!(
        s,
        r#"<text x="12" y="{:.1}" class="a" transform="rotate(-90 12 {:.1})" text-anchor="middle">{}</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        escape(unit)
    );
    // X ticks (seconds).
    let xs = nice_step(x_max);
    let mut t = 0.0;
    while t <= x_max + 1e-9 {
        let xx = x(t);
        let _ = write!(
            s,
            r##"<line x1="{xx:.1}" y1="{:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#bbb"/><text x="{xx:.1}" y="{:.1}" class="a" text-anchor="middle">{}s</text>"##,
            TOP + ph,
            TOP + ph + 4.0,
            TOP + ph + 16.0,
            fmt_tick(t)
        );
        t += xs;
    }
    for m in marks {
        if m.at_s < 0.0 || m.at_s > x_max {
            continue;
        }
        let xx = x(m.at_s);
        let _ = write!(
            s,
            r#"<line x1="{xx:.1}" y1="{TOP}" x2="{xx:.1}" y2="{:.1}" stroke="{c}" stroke-width="1.2"{d}><title>{l}</title></line><text x="{:.1}" y="{:.1}" class="m" fill="{c}">{l}</text>"#,
            TOP + ph,
            xx + 2.0,
            TOP + 10.0,
            c = m.color,
            d = if m.dashed {
                r#" stroke-dasharray="4 3""#
            } else {
                ""
            },
            l = escape(&m.label)
        );
    }
    // Series: a path broken where a sample is missing.
    let mut legend_x = W - RIGHT;
    for l in lines.iter().rev() {
        let mut d = String::new();
        let mut pen = false;
        for (i, v) in l.values.iter().enumerate() {
            match (v, t_s.get(i)) {
                (Some(v), Some(&t)) => {
                    let _ = write!(
                        d,
                        "{}{:.1} {:.1} ",
                        if pen { "L" } else { "M" },
                        x(t),
                        y(*v)
                    );
                    pen = true;
                }
                _ => pen = false,
            }
        }
        if !d.is_empty() {
            let _ = write!(
                s,
                r#"<path d="{}" fill="none" stroke="{}" stroke-width="1.6"{}/>"#,
                d.trim_end(),
                l.color,
                if l.dashed {
                    r#" stroke-dasharray="5 3""#
                } else {
                    ""
                }
            );
        }
        let w = 10.0 + 6.5 * l.label.len() as f64;
        legend_x -= w;
        let _ = write!(
            s,
            r#"<rect x="{legend_x:.1}" y="8" width="8" height="8" fill="{}"/><text x="{:.1}" y="16" class="a">{}</text>"#,
            l.color,
            legend_x + 10.0,
            escape(&l.label)
        );
    }
    s.push_str("</svg>");
    s
}

fn some(v: &[f64]) -> Vec<Option<f64>> {
    v.iter().copied().map(Some).collect()
}

/// Renders the whole report.
pub fn render(r: &Report) -> String {
    let series = &r.series;
    let t_s = &series.t_s;
    let x_max = t_s
        .last()
        .copied()
        .unwrap_or(r.duration_s)
        .max(r.duration_s);
    let mut marks: Vec<Mark> = r
        .events
        .iter()
        .map(|e| Mark {
            at_s: e.at_s,
            label: format!("{} {}", e.action, e.pod),
            color: "#c00",
            dashed: false,
        })
        .collect();
    marks.extend(
        series
            .stage_bounds_s
            .iter()
            .enumerate()
            .map(|(i, &t)| Mark {
                at_s: t,
                label: format!("stage {}", i + 2),
                color: "#888",
                dashed: true,
            }),
    );
    marks.push(Mark {
        at_s: series.load_end_s,
        label: "load ends".into(),
        color: "#555",
        dashed: true,
    });

    let mut h = String::new();
    let title = match &r.target_url {
        Some(t) => format!("switchyard-loadtest against {t}"),
        None => format!("switchyard-loadtest: {} mode, {} pod(s)", r.mode, r.pods),
    };
    let _ = write!(
        h,
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{t}</title><style>
body{{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}}
table{{border-collapse:collapse;margin:8px 0}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}
th{{background:#f4f4f4}}td:first-child,th:first-child{{text-align:left}}
.ok{{color:#080;font-weight:bold}}.bad{{color:#c00;font-weight:bold}}
code{{background:#f4f4f4;padding:1px 4px;word-break:break-all}}
svg{{display:block;margin:8px 0 16px}}svg .t{{font:bold 13px sans-serif}}svg .a{{font:11px sans-serif;fill:#444}}svg .m{{font:10px sans-serif}}
</style></head><body><h1>{t}</h1>"#,
        t = escape(&title)
    );
    let _ = write!(
        h,
        "<p><code>{}</code></p><p>{} tenant(s), {} channels, load {:.0} s, settle up to {:.0} s; webhook target {}; host {} CPUs, load average {} → {}</p>",
        escape(&r.command),
        r.tenants,
        r.channels,
        r.duration_s,
        r.settle_s,
        escape(&r.webhook_url),
        r.host.cpus,
        escape(&r.host.loadavg_start),
        escape(&r.host.loadavg_end)
    );
    if let Some(p) = &r.stages {
        let parts: Vec<String> = p
            .stages
            .iter()
            .map(|s| {
                format!(
                    "{:.0}/s → {:.0}/s over {:.0} s",
                    s.from_per_s, s.to_per_s, s.seconds
                )
            })
            .collect();
        let _ = write!(h, "<p>inbound stages: {}</p>", escape(&parts.join(", ")));
    }
    // Verdict and thresholds.
    let verdict = if r.breaches.is_empty() && r.problems.is_empty() {
        r#"<span class="ok">OK</span>"#.to_owned()
    } else if !r.breaches.is_empty() {
        format!(r#"<span class="bad">thresholds breached (exit status {EXIT_THRESHOLD})</span>"#)
    } else {
        r#"<span class="bad">problems</span>"#.to_owned()
    };
    let _ = write!(h, "<h2>Verdict: {verdict}</h2><ul>");
    for p in r.breaches.iter().chain(r.problems.iter()) {
        let _ = write!(h, "<li>{}</li>", escape(p));
    }
    for n in &r.notes {
        let _ = write!(h, "<li>note: {}</li>", escape(n));
    }
    h.push_str("</ul>");
    let t = &r.thresholds;
    let mut ts = Vec::new();
    if let Some(v) = t.max_p99_ms {
        ts.push(format!("p99 ≤ {v} ms"));
    }
    if let Some(v) = t.max_lost {
        ts.push(format!("lost ≤ {v}"));
    }
    if let Some(v) = t.max_dup {
        ts.push(format!("duplicate ids ≤ {v}"));
    }
    if let Some(v) = t.min_rate_per_s {
        ts.push(format!("deliveries ≥ {v}/s"));
    }
    if !ts.is_empty() {
        let _ = write!(h, "<p>thresholds: {}</p>", escape(&ts.join(", ")));
    }

    // Summary table.
    h.push_str("<h2>Flows</h2><table><tr><th>flow</th><th>sent</th><th>accepted</th><th>delivered</th><th>dup ids</th><th>lost</th><th>sent/s</th><th>deliv/s</th><th>p50 ms</th><th>p90 ms</th><th>p99 ms</th><th>max ms</th><th>ack p50</th><th>ack p99</th></tr>");
    for f in r.flows.iter().filter(|f| f.sent > 0) {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td></tr>",
            f.flow,
            f.sent,
            f.accepted,
            f.delivered,
            f.duplicate_ids,
            f.lost,
            f.sent_per_s,
            f.delivered_per_s,
            f.latency_ms.p50,
            f.latency_ms.p90,
            f.latency_ms.p99,
            f.latency_ms.max,
            f.ack_latency_ms.p50,
            f.ack_latency_ms.p99
        );
    }
    h.push_str("</table>");

    // Per flow: throughput and latency.
    for f in &series.flows {
        let Some(rep) = r.flows.iter().find(|x| x.flow == f.flow) else {
            continue;
        };
        if rep.sent == 0 {
            continue;
        }
        let _ = write!(h, "<h2>{}</h2>", escape(&f.flow));
        let offered = some(&f.offered_per_s);
        let sent = some(&f.sent_per_s);
        let delivered = some(&f.delivered_per_s);
        let mut lines = Vec::new();
        if !offered.is_empty() {
            lines.push(Line {
                label: "offered".into(),
                color: "#999",
                dashed: true,
                values: &offered,
            });
        }
        lines.push(Line {
            label: "sent".into(),
            color: COLORS[0],
            dashed: false,
            values: &sent,
        });
        lines.push(Line {
            label: "delivered".into(),
            color: COLORS[2],
            dashed: false,
            values: &delivered,
        });
        h.push_str(&chart(
            &format!("{} throughput", f.flow),
            "messages/s",
            t_s,
            x_max,
            &lines,
            &marks,
        ));
        let lat = [
            Line {
                label: "p50".into(),
                color: COLORS[2],
                dashed: false,
                values: &f.p50_ms,
            },
            Line {
                label: "p90".into(),
                color: COLORS[3],
                dashed: false,
                values: &f.p90_ms,
            },
            Line {
                label: "p99".into(),
                color: COLORS[1],
                dashed: false,
                values: &f.p99_ms,
            },
        ];
        h.push_str(&chart(
            &format!(
                "{} end-to-end latency (first arrivals of each second)",
                f.flow
            ),
            "ms",
            t_s,
            x_max,
            &lat,
            &marks,
        ));
    }

    // Pods.
    h.push_str("<h2>Pods</h2>");
    if series.resources.is_empty() {
        h.push_str("<p>No pod CPU or memory was measurable: give <code>--pod-pid</code> for a pod on this machine, or expose <code>process_resident_memory_bytes</code> and <code>process_cpu_seconds_total</code> on <code>--metrics-url</code>.</p>");
    } else {
        let rss: Vec<Line> = series
            .resources
            .iter()
            .enumerate()
            .map(|(i, x)| Line {
                label: format!("{} ({})", x.name, x.source),
                color: COLORS[i % COLORS.len()],
                dashed: false,
                values: &x.rss_mib,
            })
            .collect();
        h.push_str(&chart("pod RSS", "MiB", t_s, x_max, &rss, &marks));
        let cpu: Vec<Line> = series
            .resources
            .iter()
            .enumerate()
            .map(|(i, x)| Line {
                label: x.name.clone(),
                color: COLORS[i % COLORS.len()],
                dashed: false,
                values: &x.cpu_percent,
            })
            .collect();
        h.push_str(&chart(
            "pod CPU (100% = one core)",
            "% CPU",
            t_s,
            x_max,
            &cpu,
            &marks,
        ));
    }
    if !r.pod_resources.is_empty() {
        h.push_str("<table><tr><th>pod</th><th>pid</th><th>state</th><th>RSS MiB</th><th>peak MiB</th><th>CPU s</th></tr>");
        for p in &r.pod_resources {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{:?}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td></tr>",
                escape(&p.name),
                p.pid,
                p.state,
                p.rss_kib as f64 / 1024.0,
                p.peak_rss_kib as f64 / 1024.0,
                p.cpu_seconds
            );
        }
        h.push_str("</table>");
    }
    if !r.events.is_empty() {
        h.push_str("<h2>Events</h2><ul>");
        for e in &r.events {
            let _ = write!(
                h,
                "<li>{:.1} s: {} {} {}</li>",
                e.at_s,
                escape(&e.action),
                escape(&e.pod),
                escape(&e.detail)
            );
        }
        h.push_str("</ul>");
    }
    h.push_str("</body></html>\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_round() {
        assert_eq!(nice_step(100.0), 20.0);
        assert_eq!(nice_step(7.0), 2.0);
        assert_eq!(nice_step(0.0), 1.0);
        assert!((nice_step(0.3) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn charts_are_svg_with_gaps_and_marks() {
        let v = [Some(1.0), None, Some(3.0), Some(2.0)];
        let svg = chart(
            "a <b>",
            "ms",
            &[1.0, 2.0, 3.0, 4.0],
            4.0,
            &[Line {
                label: "p99".into(),
                color: "#000",
                dashed: false,
                values: &v,
            }],
            &[Mark {
                at_s: 2.5,
                label: "kill pod-1".into(),
                color: "#c00",
                dashed: false,
            }],
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("a &lt;b&gt;"), "titles are escaped");
        // Two pieces of path: the missing second breaks the line.
        let path = svg.split("<path d=\"").nth(1).unwrap();
        let d = &path[..path.find('"').unwrap()];
        assert_eq!(d.matches('M').count(), 2, "{d}");
        assert!(svg.contains("kill pod-1"));
    }
}
