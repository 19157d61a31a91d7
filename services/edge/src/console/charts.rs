//! The console's charts: the pods' pulse rows summed into series for the last hour, drawn as
//! inline SVG (no script, no outside asset: the console's CSP allows neither). Every series
//! carries its values in `data-values` (comma-separated, empty where no pod reported) and its
//! last value in `data-last`, and a `<title>` a pointer shows, so what is drawn can be read
//! back.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::html::esc;
use super::pulse::{POINTS, PodRows, Row, quantile};

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Stable name for `data-series` (`card:im.webhook`, `pod:…`, `all`, `p99`).
    pub key: String,
    pub label: String,
    /// One value per point, oldest first; None where nothing was reported.
    pub values: Vec<Option<f64>>,
    /// The deployment's line, drawn thicker than a pod's.
    pub bold: bool,
}

/// A chart of several series over the same points.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    pub id: &'static str,
    pub title: &'static str,
    pub series: Vec<Series>,
}

const PALETTE: [&str; 8] = [
    "#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#bf3989", "#0a7d8c", "#57606a",
];
const W: f64 = 420.0;
const H: f64 = 150.0;
const LEFT: f64 = 44.0;
const RIGHT: f64 = 8.0;
const TOP: f64 = 10.0;
const BOTTOM: f64 = 22.0;

/// A value as the charts print it: whole numbers plainly, others with 3 significant digits.
pub fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// The top of the y axis: 1, 2 or 5 times a power of ten, at least `max`.
fn ceiling(max: f64) -> f64 {
    if !max.is_finite() || max <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(max.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|c| *c >= max)
        .unwrap_or(10.0 * p)
}

/// The chart as an `<svg>` with its legend. `span` labels the x axis' start (`60m`).
pub fn svg(chart: &Chart, span: &str) -> String {
    let n = chart
        .series
        .iter()
        .map(|s| s.values.len())
        .max()
        .unwrap_or(0);
    let max = chart
        .series
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .fold(0.0f64, |m, v| m.max(*v));
    let top = ceiling(max);
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let x = |i: usize| {
        LEFT + if n > 1 {
            pw * i as f64 / (n - 1) as f64
        } else {
            pw
        }
    };
    let y = |v: f64| TOP + ph * (1.0 - v / top);
    let mut out = format!(
        "<figure class=\"chart\" id=\"chart-{}\"><figcaption>{}</figcaption>\
         <svg xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" width=\"{W}\" height=\"{H}\" \
         viewBox=\"0 0 {W} {H}\" data-max=\"{}\"><title>{}</title>",
        chart.id,
        esc(chart.title),
        num(top),
        esc(chart.title)
    );
    let _ = write!(
        out,
        "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{pw}\" height=\"{ph}\" fill=\"#fff\" stroke=\"#ddd\"/>\
         <line x1=\"{LEFT}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"end\" fill=\"#555\">{}</text>\
         <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"end\" fill=\"#555\">0</text>\
         <text x=\"{LEFT}\" y=\"{:.1}\" font-size=\"10\" fill=\"#555\">−{}</text>\
         <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"end\" fill=\"#555\">now</text>",
        y(top / 2.0),
        W - RIGHT,
        y(top / 2.0),
        LEFT - 4.0,
        TOP + 8.0,
        esc(&num(top)),
        LEFT - 4.0,
        TOP + ph,
        H - 6.0,
        esc(span),
        W - RIGHT,
        H - 6.0,
    );
    let empty = max == 0.0
        && chart
            .series
            .iter()
            .all(|s| s.values.iter().all(Option::is_none));
    if empty {
        let _ = write!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\" fill=\"#999\" class=\"no-data\">no data yet</text>",
            LEFT + pw / 2.0,
            TOP + ph / 2.0
        );
    }
    let mut legend = String::from("<div class=\"legend\">");
    for (i, s) in chart.series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let values: Vec<String> = s
            .values
            .iter()
            .map(|v| v.map(num).unwrap_or_default())
            .collect();
        let last = s.values.iter().rev().flatten().next().copied();
        let _ = write!(
            out,
            "<g class=\"series\" data-series=\"{}\" data-last=\"{}\" data-values=\"{}\"><title>{}: last {}</title>",
            esc(&s.key),
            last.map(num).unwrap_or_default(),
            values.join(","),
            esc(&s.label),
            esc(&last.map(num).unwrap_or_else(|| "—".into()))
        );
        // A line per run of reported points; a lone point is a dot.
        let width = if s.bold { 2.0 } else { 1.0 };
        let mut run: Vec<(f64, f64)> = Vec::new();
        let flush = |run: &mut Vec<(f64, f64)>, out: &mut String| {
            match run.as_slice() {
                [] => {}
                [(px, py)] => {
                    let _ = write!(
                        out,
                        "<circle cx=\"{px:.1}\" cy=\"{py:.1}\" r=\"2\" fill=\"{color}\"/>"
                    );
                }
                pts => {
                    let points: Vec<String> =
                        pts.iter().map(|(a, b)| format!("{a:.1},{b:.1}")).collect();
                    let _ = write!(
                        out,
                        "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"{width}\" points=\"{}\"/>",
                        points.join(" ")
                    );
                }
            }
            run.clear();
        };
        for (i, v) in s.values.iter().enumerate() {
            match v {
                Some(v) => run.push((x(i), y(*v))),
                None => flush(&mut run, &mut out),
            }
        }
        flush(&mut run, &mut out);
        out.push_str("</g>");
        let _ = write!(
            legend,
            "<span><span style=\"color:{color}\">■</span> {} <b>{}</b></span> ",
            esc(&s.label),
            esc(&last.map(num).unwrap_or_else(|| "—".into()))
        );
    }
    legend.push_str("</div>");
    out.push_str("</svg>");
    out.push_str(&legend);
    out.push_str("</figure>");
    out
}

/// Charts side by side; `span` is how far back they reach (`1h 0m`).
pub fn section(charts: &[Chart], span: &str) -> String {
    let mut out = String::from("<div class=\"charts\">");
    for c in charts {
        out.push_str(&svg(c, span));
    }
    out.push_str("</div>");
    out
}

/// The points' times: the [`POINTS`] intervals ending with the last one closed before `now`.
pub fn points(now: i64, interval_ms: i64) -> Vec<i64> {
    let last = now - now.rem_euclid(interval_ms) - interval_ms;
    (0..POINTS as i64)
        .map(|k| last - (POINTS as i64 - 1 - k) * interval_ms)
        .collect()
}

/// Each pod's row at each point (None where it reported none).
fn grid<'a>(pods: &'a [PodRows], at: &[i64]) -> Vec<Vec<Option<&'a Row>>> {
    pods.iter()
        .map(|p| {
            at.iter()
                .map(|t| p.rows.iter().find(|r| r.at == *t))
                .collect()
        })
        .collect()
}

/// `f` summed over the pods that reported at each point.
fn summed(g: &[Vec<Option<&Row>>], n: usize, f: impl Fn(&Row) -> f64) -> Vec<Option<f64>> {
    (0..n)
        .map(|k| {
            let rows: Vec<&Row> = g.iter().filter_map(|p| p[k]).collect();
            (!rows.is_empty()).then(|| rows.iter().map(|r| f(r)).sum())
        })
        .collect()
}

fn per_pod(pods: &[PodRows], g: &[Vec<Option<&Row>>], f: impl Fn(&Row) -> f64) -> Vec<Series> {
    if pods.len() < 2 {
        return Vec::new();
    }
    pods.iter()
        .zip(g)
        .map(|(p, rows)| Series {
            key: format!("pod:{}", p.pod),
            label: format!("pod {}", p.pod),
            values: rows.iter().map(|r| r.map(&f)).collect(),
            bold: false,
        })
        .collect()
}

/// The deployment's series per Card of a per-Card counter, then each pod's total.
fn by_card(
    pods: &[PodRows],
    g: &[Vec<Option<&Row>>],
    n: usize,
    field: fn(&Row) -> &std::collections::BTreeMap<String, u64>,
) -> Vec<Series> {
    let cards: BTreeSet<&String> = pods
        .iter()
        .flat_map(|p| p.rows.iter().flat_map(|r| field(r).keys()))
        .collect();
    // Cards with nothing in the hour stay out of the legend; with none at all, one line of
    // zeros says the pods reported.
    let mut out: Vec<Series> = cards
        .into_iter()
        .map(|card| Series {
            key: format!("card:{card}"),
            label: card.clone(),
            values: summed(g, n, |r| field(r).get(card).copied().unwrap_or(0) as f64),
            bold: true,
        })
        .filter(|s| s.values.iter().flatten().any(|v| *v > 0.0))
        .collect();
    if out.is_empty() {
        out.push(one(
            "all",
            "all Cards",
            summed(g, n, |r| field(r).values().sum::<u64>() as f64),
        ));
    }
    out.extend(per_pod(pods, g, |r| field(r).values().sum::<u64>() as f64));
    out
}

/// Summed buckets' quantile at each point.
fn quantiles(
    g: &[Vec<Option<&Row>>],
    n: usize,
    q: f64,
    field: fn(&Row) -> &[u64],
) -> Vec<Option<f64>> {
    (0..n)
        .map(|k| {
            let mut sum: Vec<u64> = Vec::new();
            for r in g.iter().filter_map(|p| p[k]) {
                let b = field(r);
                sum.resize(sum.len().max(b.len()), 0);
                for (i, c) in b.iter().enumerate() {
                    sum[i] += c;
                }
            }
            quantile(&sum, q)
        })
        .collect()
}

fn one(key: &str, label: &str, values: Vec<Option<f64>>) -> Series {
    Series {
        key: key.to_owned(),
        label: label.to_owned(),
        values,
        bold: true,
    }
}

/// Every chart of the overview from the pods' rows, at the points `at`.
pub fn deployment(pods: &[PodRows], at: &[i64]) -> Vec<Chart> {
    let n = at.len();
    let g = grid(pods, at);
    let mut latency = vec![
        one("p50", "p50 (s)", quantiles(&g, n, 0.5, |r| &r.delivery)),
        one("p99", "p99 (s)", quantiles(&g, n, 0.99, |r| &r.delivery)),
    ];
    if pods.len() > 1 {
        latency.extend(pods.iter().zip(&g).map(|(p, rows)| {
            Series {
                key: format!("pod:{}", p.pod),
                label: format!("p99 pod {}", p.pod),
                values: rows
                    .iter()
                    .map(|r| r.and_then(|r| quantile(&r.delivery, 0.99)))
                    .collect(),
                bold: false,
            }
        }));
    }
    let gauge = |f: fn(&Row) -> u64| {
        let mut s = vec![one("all", "deployment", summed(&g, n, |r| f(r) as f64))];
        s.extend(per_pod(pods, &g, |r| f(r) as f64));
        s
    };
    // The outbox is measured once for the deployment (by the janitor lease holder).
    let outbox = |f: fn(&Row) -> Option<f64>| {
        (0..n)
            .map(|k| {
                g.iter()
                    .filter_map(|p| p[k].and_then(f))
                    .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
            })
            .collect::<Vec<_>>()
    };
    let mut tools = vec![one("all", "deployment", summed(&g, n, |r| r.tools as f64))];
    tools.extend(per_pod(pods, &g, |r| r.tools as f64));
    vec![
        Chart {
            id: "accepted",
            title: "Messages accepted (per interval, by Card)",
            series: by_card(pods, &g, n, |r| &r.accepted),
        },
        Chart {
            id: "delivered",
            title: "Messages delivered to xAgent (by Card)",
            series: by_card(pods, &g, n, |r| &r.delivered),
        },
        Chart {
            id: "failed",
            title: "Messages failed (by Card)",
            series: by_card(pods, &g, n, |r| &r.failed),
        },
        Chart {
            id: "latency",
            title: "Delivery latency, accepted to acked (s)",
            series: latency,
        },
        Chart {
            id: "outbox",
            title: "Outbox depth (deployment)",
            series: vec![one(
                "all",
                "pending",
                outbox(|r| r.outbox.map(|v| v as f64)),
            )],
        },
        Chart {
            id: "outbox-age",
            title: "Oldest pending message (s)",
            series: vec![one("all", "age", outbox(|r| r.outbox_oldest))],
        },
        Chart {
            id: "sockets",
            title: "xAgent sockets",
            series: gauge(|r| r.sockets),
        },
        Chart {
            id: "channels",
            title: "Channels routed to sockets",
            series: gauge(|r| r.channels),
        },
        Chart {
            id: "tools",
            title: "Tool calls",
            series: tools,
        },
        Chart {
            id: "tool-latency",
            title: "Tool call p99 (s)",
            series: vec![one(
                "p99",
                "p99 (s)",
                quantiles(&g, n, 0.99, |r| &r.tool_latency),
            )],
        },
    ]
}

/// A tenant's charts from its rows ([`super::Pulse::tenant_pods`]): its messages, their
/// latency and its tool calls.
pub fn tenant(pods: &[PodRows], at: &[i64]) -> Vec<Chart> {
    deployment(pods, at)
        .into_iter()
        .filter(|c| {
            [
                "accepted",
                "delivered",
                "failed",
                "latency",
                "tools",
                "tool-latency",
            ]
            .contains(&c.id)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn row(at: i64, card: &str, accepted: u64, sockets: u64) -> Row {
        Row {
            at,
            accepted: BTreeMap::from([(card.to_owned(), accepted)]),
            sockets,
            ..Row::default()
        }
    }

    #[test]
    fn an_empty_chart_says_so_and_draws_no_line() {
        let c = Chart {
            id: "accepted",
            title: "Accepted",
            series: vec![one("all", "deployment", vec![None; 60])],
        };
        let s = svg(&c, "60m");
        assert!(s.contains("no data yet"), "{s}");
        assert!(!s.contains("<polyline") && !s.contains("<circle"));
        assert!(s.contains("data-last=\"\""));
        let none = Chart {
            id: "x",
            title: "X",
            series: Vec::new(),
        };
        assert!(svg(&none, "60m").contains("no data yet"));
    }

    #[test]
    fn labels_and_names_are_escaped() {
        let c = Chart {
            id: "accepted",
            title: "Accepted",
            series: vec![one(
                "card:<script>\"",
                "<img src=x onerror=alert(1)>",
                vec![Some(1.0), None, Some(2.0), Some(3.0)],
            )],
        };
        let s = svg(&c, "60m");
        assert!(!s.contains("<script>") && !s.contains("<img"), "{s}");
        assert!(s.contains("data-series=\"card:&lt;script&gt;&quot;\""));
        assert!(s.contains("data-values=\"1,,2,3\"") && s.contains("data-last=\"3\""));
        // A gap splits the line: a dot for the lone point, a line for the rest.
        assert_eq!(s.matches("<circle").count(), 1);
        assert_eq!(s.matches("<polyline").count(), 1);
        assert!(s.contains("data-max=\"5\""));
    }

    #[test]
    fn the_deployment_is_the_pods_sum_and_each_pod_has_its_line() {
        let at = points(10 * 60_000 + 5, 60_000);
        assert_eq!(at.len(), POINTS);
        assert_eq!(*at.last().unwrap(), 9 * 60_000);
        let t = *at.last().unwrap();
        let pods = vec![
            PodRows {
                pod: "a".into(),
                rows: vec![
                    row(t - 60_000, "im.webhook", 2, 1),
                    row(t, "im.webhook", 3, 2),
                ],
            },
            PodRows {
                pod: "b".into(),
                rows: vec![{
                    let mut r = row(t, "im.webhook", 4, 5);
                    r.accepted.insert("im.telegram".into(), 1);
                    r
                }],
            },
        ];
        let charts = deployment(&pods, &at);
        let accepted = &charts[0];
        let webhook = accepted
            .series
            .iter()
            .find(|s| s.key == "card:im.webhook")
            .unwrap();
        assert_eq!(webhook.values[POINTS - 1], Some(7.0));
        assert_eq!(webhook.values[POINTS - 2], Some(2.0));
        assert_eq!(webhook.values[0], None, "no pod reported then");
        let pod_b = accepted.series.iter().find(|s| s.key == "pod:b").unwrap();
        assert_eq!(
            pod_b.values[POINTS - 1],
            Some(5.0),
            "b's total over its Cards"
        );
        let telegram = accepted
            .series
            .iter()
            .find(|s| s.key == "card:im.telegram")
            .unwrap();
        assert_eq!(telegram.values[POINTS - 1], Some(1.0));
        let sockets = charts.iter().find(|c| c.id == "sockets").unwrap();
        assert_eq!(sockets.series[0].values[POINTS - 1], Some(7.0));
        // One pod: no per-pod lines.
        let alone = deployment(&pods[..1], &at);
        assert!(alone[0].series.iter().all(|s| !s.key.starts_with("pod:")));
        // A Card with nothing in the hour is left out; with nothing at all, one line of zeros.
        assert!(!alone[0].series.iter().any(|s| s.key == "card:im.telegram"));
        let failed = &alone[2];
        assert_eq!(failed.series.len(), 1);
        assert_eq!(failed.series[0].key, "all");
        assert_eq!(failed.series[0].values[POINTS - 1], Some(0.0));
    }
}
