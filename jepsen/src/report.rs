//! `report.html`: the verdict, a timeline of every operation and a latency
//! plot, both with the nemesis windows shaded, as hand-written inline SVG
//! (no plotting dependency, no scripts, opens anywhere).

use std::fmt::Write as _;

use serde_json::Value;

use crate::history::{Op, Type};
use crate::nemesis::{NemesisKind, Window};

const WIDTH: f64 = 1200.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;

/// Escapes text for HTML (also used by the campaign summary).
pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn kind_color(k: NemesisKind) -> &'static str {
    match k {
        NemesisKind::Kill => "#e15759",
        NemesisKind::Pause => "#f28e2b",
        NemesisKind::Partition => "#4e79a7",
        NemesisKind::Clock => "#b07aa1",
        NemesisKind::Membership => "#59a14f",
        NemesisKind::Restore => "#76b7b2",
        NemesisKind::LoseUnsynced => "#9c755f",
        NemesisKind::SlowDisk => "#edc948",
        NemesisKind::RestartFast => "#ff9da7",
        NemesisKind::DiskError => "#8c564b",
        NemesisKind::ClientLink => "#17becf",
        NemesisKind::HostilePeer => "#d62728",
        NemesisKind::LongPartition => "#1f3a5f",
        NemesisKind::Rot => "#8c564b",
        NemesisKind::LostDisk => "#7f7f7f",
    }
}

fn type_color(t: Type) -> &'static str {
    match t {
        Type::Ok => "#59a14f",
        Type::Fail => "#e15759",
        Type::Info => "#edc948",
        Type::Invoke => "#999999",
    }
}

fn f_color(f: &str) -> &'static str {
    match f {
        "acquire" => "#4e79a7",
        "release" => "#59a14f",
        "describe" => "#76b7b2",
        "read" => "#9c755f",
        "write" => "#b07aa1",
        "open" | "close" => "#bab0ac",
        // "pause": an emulated paused holder.
        _ => "#ff9da7",
    }
}

struct Scale {
    end_ns: f64,
}

impl Scale {
    fn x(&self, ns: u64) -> f64 {
        LEFT + (ns as f64 / self.end_ns).min(1.0) * (WIDTH - LEFT - RIGHT)
    }
}

fn time_axis(out: &mut String, scale: &Scale, y: f64, height: f64) {
    let secs = scale.end_ns / 1e9;
    let step = [1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0]
        .into_iter()
        .find(|s| secs / s <= 12.0)
        .unwrap_or(600.0);
    let mut t = 0.0;
    while t <= secs {
        let x = scale.x((t * 1e9) as u64);
        let _ = write!(
            out,
            r##"<line x1="{x:.1}" y1="{y:.1}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" font-size="11" text-anchor="middle">{t}s</text>"##,
            y + height,
            y + height + 14.0
        );
        t += step;
    }
}

/// Places labels in up to `lanes` rows so they do not overlap; returns
/// the lane for a label from `x` of `chars` characters, or None (the
/// window's tooltip still names it).
struct Lanes {
    ends: Vec<f64>,
    /// Average glyph width at the label's font size.
    char_px: f64,
}

impl Lanes {
    fn new(lanes: usize, char_px: f64) -> Lanes {
        Lanes {
            ends: vec![f64::MIN; lanes],
            char_px,
        }
    }

    fn place(&mut self, x: f64, chars: usize) -> Option<usize> {
        let lane = self.ends.iter().position(|&end| end <= x)?;
        self.ends[lane] = x + chars as f64 * self.char_px + 6.0;
        Some(lane)
    }
}

fn shade_windows(
    out: &mut String,
    windows: &[Window],
    scale: &Scale,
    y: f64,
    height: f64,
    mut labels: Option<Lanes>,
) {
    for w in windows {
        let x0 = scale.x(w.start_ns);
        let x1 = scale.x(w.end_ns).max(x0 + 2.0);
        let title = format!("{:?} {} nodes {:?}", w.kind, w.variant, w.nodes);
        let _ = write!(
            out,
            r#"<rect x="{x0:.1}" y="{y:.1}" width="{:.1}" height="{height:.1}" fill="{}" fill-opacity="0.18"><title>{}</title></rect>"#,
            x1 - x0,
            kind_color(w.kind),
            esc(&title),
        );
        let label = format!("{:?} {}", w.kind, w.variant).to_lowercase();
        if let Some(lane) = labels.as_mut().and_then(|l| l.place(x0 + 2.0, label.len())) {
            let _ = write!(
                out,
                r#"<text x="{:.1}" y="{:.1}" font-size="10" fill="{}">{}</text>"#,
                x0 + 2.0,
                y + 10.0 + 11.0 * lane as f64,
                kind_color(w.kind),
                esc(&label),
            );
        }
    }
}

/// Operations drawn in the plots: the keep-alive probers' asks and the
/// watch events are too many to draw one by one, and `belief` records are
/// no requests (the checkers' numbers and `history.jsonl` have them).
fn drawn(o: &Op) -> bool {
    !matches!(o.f.as_str(), "keepalive" | "watch" | "belief")
}

fn timeline(ops: &[Op], windows: &[Window], concurrency: u64, scale: &Scale) -> String {
    let rows = concurrency.max(1);
    let row_h = 16.0;
    // A row of labelled fault bars above the workers (labels in up to
    // three lanes above it).
    let top = 60.0;
    let height = rows as f64 * row_h;
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{:.0}" font-family="sans-serif">"#,
        height + top + 30.0
    );
    shade_windows(&mut out, windows, scale, top, height, None);
    time_axis(&mut out, scale, top, height);
    let _ = write!(out, r#"<text x="4" y="48" font-size="11">faults</text>"#);
    let mut lanes = Lanes::new(3, 5.6);
    for w in windows {
        let x0 = scale.x(w.start_ns);
        let x1 = scale.x(w.end_ns).max(x0 + 2.0);
        let _ = write!(
            out,
            r#"<rect x="{x0:.1}" y="38" width="{:.1}" height="14" fill="{}"><title>{}</title></rect>"#,
            x1 - x0,
            kind_color(w.kind),
            esc(&format!(
                "{:?} {} nodes {:?} {}",
                w.kind, w.variant, w.nodes, w.detail
            )),
        );
        let label = format!("{:?} {}", w.kind, w.variant).to_lowercase();
        if let Some(lane) = lanes.place(x0, label.len()) {
            let _ = write!(
                out,
                r#"<text x="{x0:.1}" y="{:.1}" font-size="9" fill="{}">{}</text>"#,
                34.0 - 11.0 * lane as f64,
                kind_color(w.kind),
                esc(&label),
            );
        }
    }
    for r in 0..rows {
        let y = top + r as f64 * row_h;
        let _ = write!(
            out,
            r#"<text x="4" y="{:.1}" font-size="11">worker {r}</text>"#,
            y + 12.0
        );
    }
    for o in ops.iter().filter(|o| drawn(o)) {
        let row = o.process % rows;
        let y = top + row as f64 * row_h + 2.0;
        let x0 = scale.x(o.invoke_ns);
        let end = o.recorded_ns.unwrap_or(scale.end_ns as u64);
        let x1 = scale.x(end).max(x0 + 1.0);
        let _ = write!(
            out,
            r#"<rect x="{x0:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}" stroke="{}" stroke-width="0.3"><title>{} {} {:?} {}</title></rect>"#,
            x1 - x0,
            row_h - 4.0,
            f_color(&o.f),
            type_color(o.kind),
            o.process,
            esc(&o.f),
            o.kind,
            esc(&o.result.to_string().chars().take(160).collect::<String>()),
        );
        if o.kind != Type::Ok {
            let _ = write!(
                out,
                r#"<rect x="{:.1}" y="{:.1}" width="3" height="{:.1}" fill="{}"/>"#,
                x1 - 1.5,
                y,
                row_h - 4.0,
                type_color(o.kind)
            );
        }
    }
    out.push_str("</svg>");
    out
}

fn latency_plot(ops: &[Op], windows: &[Window], scale: &Scale) -> String {
    let top = 20.0;
    let height = 320.0;
    // Log scale from 10 µs to 60 s.
    let (lo, hi) = (0.01f64.log10(), 60_000f64.log10());
    let y = |ms: f64| top + height - (ms.max(0.01).log10() - lo) / (hi - lo) * height;
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{:.0}" font-family="sans-serif">"#,
        height + top + 40.0
    );
    shade_windows(
        &mut out,
        windows,
        scale,
        top,
        height,
        Some(Lanes::new(3, 6.4)),
    );
    time_axis(&mut out, scale, top, height);
    for (ms, label) in [
        (0.1, "0.1 ms"),
        (1.0, "1 ms"),
        (10.0, "10 ms"),
        (100.0, "100 ms"),
        (1000.0, "1 s"),
        (10_000.0, "10 s"),
    ] {
        let yy = y(ms);
        let _ = write!(
            out,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{label}</text>"##,
            WIDTH - RIGHT,
            LEFT - 4.0,
            yy + 4.0
        );
    }
    for o in ops.iter().filter(|o| drawn(o)) {
        let Some(lat) = o.latency_ns() else { continue };
        let ms = lat as f64 / 1e6;
        let cx = scale.x(o.invoke_ns);
        let cy = y(ms);
        let fill = if o.kind == Type::Ok {
            f_color(&o.f)
        } else {
            type_color(o.kind)
        };
        let _ = write!(
            out,
            r#"<circle cx="{cx:.1}" cy="{cy:.1}" r="{}" fill="{fill}" fill-opacity="0.7"><title>{} {:?} {:.1} ms</title></circle>"#,
            if o.kind == Type::Ok { 1.6 } else { 2.6 },
            esc(&o.f),
            o.kind,
            ms
        );
    }
    out.push_str("</svg>");
    out
}

fn legend() -> String {
    let mut s = String::from("<p class=legend>");
    for f in [
        "acquire", "release", "describe", "read", "write", "open", "pause",
    ] {
        let _ = write!(
            s,
            r#"<span><i style="background:{}"></i>{f}</span>"#,
            f_color(f)
        );
    }
    for (t, name) in [(Type::Fail, "fail"), (Type::Info, "info (unknown)")] {
        let _ = write!(
            s,
            r#"<span><i style="background:{}"></i>{name}</span>"#,
            type_color(t)
        );
    }
    for k in crate::nemesis::ALL_KINDS
        .into_iter()
        .chain([NemesisKind::LongPartition])
    {
        let _ = write!(
            s,
            r#"<span><i style="background:{};opacity:.35"></i>{} window</span>"#,
            kind_color(k),
            k.name()
        );
    }
    s.push_str("</p>");
    s
}

fn ms(v: &Value) -> String {
    v.as_f64()
        .map_or("never".into(), |ms| format!("{ms:.0} ms"))
}

/// The recovery table, per fault kind.
fn availability_table(a: &Value) -> String {
    let mut html = String::from(
        "<h3>Recovery</h3><p>Per fault kind: the time from the end of each fault to the first \
         grant any client was answered after it, and until every node the fault touched had \
         caught up with the cluster (rejoin; see <code>src/availability.rs</code>).</p><table><tr>\
         <th>kind</th><th>faults</th><th>median</th><th>worst</th><th>never recovered</th>\
         <th>rejoin median</th><th>rejoin worst</th></tr>",
    );
    for (kind, k) in a["by_kind"].as_object().into_iter().flatten() {
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(kind),
            k["faults"],
            ms(&k["median_ms"]),
            ms(&k["worst_ms"]),
            k["unrecovered"],
            ms(&k["rejoin_median_ms"]),
            ms(&k["rejoin_worst_ms"]),
        );
    }
    html.push_str("</table>");
    html
}

/// Renders the report.
pub fn render(
    results: &Value,
    ops: &[Op],
    windows: &[Window],
    concurrency: u64,
    title: &str,
) -> String {
    let end_ns = ops
        .iter()
        .flat_map(|o| [Some(o.invoke_ns), o.recorded_ns])
        .flatten()
        .chain(windows.iter().map(|w| w.end_ns))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let scale = Scale { end_ns };
    let valid = results["valid"].as_bool() == Some(true);
    let mut html = String::new();
    let _ = write!(
        html,
        r#"<!doctype html><html><head><meta charset="utf-8"><title>{}</title><style>
body{{font-family:sans-serif;margin:20px;color:#222}} table{{border-collapse:collapse}} td,th{{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left;vertical-align:top}}
.valid{{color:#2a7a2a}} .invalid{{color:#c0392b}} pre{{background:#f6f6f6;padding:8px;font-size:12px;max-height:400px;overflow:auto}}
.legend span{{margin-right:14px;font-size:12px}} .legend i{{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:middle}}
</style></head><body><h1>{}</h1>"#,
        esc(title),
        esc(title)
    );
    let _ = write!(
        html,
        r#"<h2 class="{}">{}</h2><p>{} operations, {} faults. Files: <code>history.jsonl</code>, <code>store.jsonl</code>, <code>results.json</code>, <code>n*/raftlockd.log</code>.</p>"#,
        if valid { "valid" } else { "invalid" },
        if valid { "VALID" } else { "INVALID" },
        results["ops"],
        windows.len()
    );
    html.push_str(
        "<h3>Checkers</h3><table><tr><th>checker</th><th>valid</th><th>details</th></tr>",
    );
    if let Some(checkers) = results["checkers"].as_object() {
        for (name, c) in checkers {
            let ok = c["valid"].as_bool() != Some(false);
            let mut details = c.clone();
            if let Some(o) = details.as_object_mut() {
                o.remove("valid");
                o.remove("examples");
            }
            let _ = write!(
                html,
                r#"<tr><td>{}</td><td class="{}">{}</td><td><code>{}</code></td></tr>"#,
                esc(name),
                if ok { "valid" } else { "invalid" },
                ok,
                esc(&details.to_string().chars().take(600).collect::<String>())
            );
        }
    }
    html.push_str("</table>");
    html.push_str("<h3>Timeline</h3>");
    html.push_str(&legend());
    html.push_str("<p>One row per worker; a bar from invocation to completion, coloured by operation; a red or yellow tick at the end marks a failed or unknown outcome. Shaded bands are faults.</p>");
    html.push_str(&timeline(ops, windows, concurrency, &scale));
    html.push_str("<h3>Latency</h3><p>Each completed operation at its invocation time (log scale). Failed and unknown outcomes are the larger red and yellow dots.</p>");
    html.push_str(&latency_plot(ops, windows, &scale));
    html.push_str("<h3>Faults</h3><table><tr><th>kind</th><th>variant</th><th>nodes</th><th>from</th><th>to</th><th>detail</th></tr>");
    for w in windows {
        let _ = write!(
            html,
            "<tr><td>{:?}</td><td>{}</td><td>{:?}</td><td>{:.2}s</td><td>{:.2}s</td><td><code>{}</code></td></tr>",
            w.kind,
            esc(&w.variant),
            w.nodes,
            w.start_ns as f64 / 1e9,
            w.end_ns as f64 / 1e9,
            esc(&w.detail.to_string().chars().take(400).collect::<String>())
        );
    }
    html.push_str("</table>");
    html.push_str(&availability_table(&results["availability"]));
    let anomalies = results["anomalies"].as_array().cloned().unwrap_or_default();
    let _ = write!(html, "<h3>Anomalies ({})</h3>", anomalies.len());
    if !anomalies.is_empty() {
        let shown: Vec<Value> = anomalies.into_iter().take(50).collect();
        let _ = write!(
            html,
            "<pre>{}</pre>",
            esc(&serde_json::to_string_pretty(&shown).unwrap_or_default())
        );
    }
    if let Some(h) = results["checkers"].get("hold-windows") {
        let _ = write!(
            html,
            "<h3>Believed hold windows</h3><p>{} overlaps between windows clients believed they held (what fencing protects against; not failures).</p><pre>{}</pre>",
            h["overlaps"],
            esc(&serde_json::to_string_pretty(&h["examples"]).unwrap_or_default())
        );
    }
    html.push_str("</body></html>");
    html
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{pair_ops, Event, Process};
    use serde_json::json;

    #[test]
    fn the_report_has_both_plots_and_the_fault_windows() {
        let ev = |kind, t| Event {
            process: Process::Client(0),
            kind,
            f: "acquire".into(),
            value: json!({"lock": "a"}),
            time_ns: t,
        };
        let ops = pair_ops(&[
            ev(Type::Invoke, 0),
            ev(Type::Ok, 5_000_000),
            ev(Type::Invoke, 6_000_000),
            ev(Type::Info, 9_000_000),
        ]);
        let windows = vec![Window {
            kind: NemesisKind::Kill,
            variant: "leader".into(),
            nodes: vec![1],
            detail: json!({}),
            start_ns: 1_000_000,
            end_ns: 4_000_000,
        }];
        let results = json!({"valid": false, "ops": 2, "checkers": {"x": {"valid": false}}, "anomalies": [{"message": "<bad>"}]});
        let html = render(&results, &ops, &windows, 1, "t");
        assert_eq!(html.matches("<svg").count(), 2);
        assert!(html.contains("INVALID"));
        assert!(html.contains("kill leader"));
        assert!(html.contains("&lt;bad&gt;"), "anomalies are escaped");
    }
}
