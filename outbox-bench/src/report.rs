//! Tables on stdout, one JSON line per scenario, BENCHMARKS.md and the latency plot.

use std::fmt::Write as _;

use crate::latency::Run;
use crate::setup::{Bench, BoxError};

pub(crate) struct Report {
    header: String,
    sections: Vec<String>,
    figures: serde_json::Map<String, serde_json::Value>,
    pub(crate) latency_runs: Vec<Run>,
    pub(crate) soak: Vec<crate::soak::Sample>,
}

pub(crate) fn median(samples: &[f64]) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

/// Each mode's median over `rounds` rounds (at least one per mode) of `measure(mode)`.
/// Each round starts at the next mode, so no mode always runs right after the same other
/// one (the table grows, autovacuum and checkpoints come and go).
pub(crate) async fn interleaved_medians(
    modes: usize,
    rounds: usize,
    mut measure: impl AsyncFnMut(usize) -> Result<f64, BoxError>,
) -> Result<Vec<f64>, BoxError> {
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); modes];
    for round in 0..rounds.max(modes) {
        for step in 0..modes {
            let mode = (round + step) % modes;
            samples[mode].push(measure(mode).await?);
        }
    }
    Ok(samples.iter().map(|s| median(s)).collect())
}

/// The extra time per transaction of mode `i` over mode 0 (the business transaction
/// alone), in seconds, from each mode's transactions per second.
pub(crate) fn added_cost(tps: &[f64], i: usize) -> f64 {
    (1.0 / tps[i] - 1.0 / tps[0]).max(0.0)
}

/// Table rows for the enqueue modes at `clients` clients: the mode's tx/s, its ratio to
/// the business transaction alone (mode 0), and its added cost per transaction of a client.
pub(crate) fn enqueue_rows(clients: usize, modes: &[&str], tps: &[f64]) -> Vec<Vec<String>> {
    modes
        .iter()
        .enumerate()
        .map(|(i, mode)| {
            vec![
                clients.to_string(),
                (*mode).to_owned(),
                format!("{:.0}", tps[i]),
                format!("{:.2}", tps[i] / tps[0]),
                if i == 0 {
                    "—".to_owned()
                } else {
                    format!("{:.0} µs", added_cost(tps, i) * 1e6 * clients as f64)
                },
            ]
        })
        .collect()
}

/// The `q` quantile of sorted values (nearest rank).
pub(crate) fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

impl Report {
    pub(crate) async fn new(bench: &Bench, args: &[String]) -> Result<Self, BoxError> {
        let pg: String = sqlx::query_scalar("SELECT version()")
            .fetch_one(&bench.pool)
            .await?;
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned());
        let cores = std::thread::available_parallelism().map_or(0, usize::from);
        let memory = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .next()
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse::<f64>().ok())
            })
            .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
        let mut header = String::new();
        writeln!(header, "- machine: {cores} cores ({cpu}), {memory:.0} GiB")?;
        writeln!(
            header,
            "- database: {pg}, on the same machine, over loopback TCP ({})",
            bench.url.split('@').next_back().unwrap_or("")
        )?;
        writeln!(
            header,
            "- outbox: sqlx 0.8.6; peer: pgmq SQL API (embedded install of the `pgmq` crate 0.33)"
        )?;
        writeln!(
            header,
            "- command: `cargo run --release -p outbox-bench -- {}`",
            args.join(" ")
        )?;
        println!("{header}");
        Ok(Self {
            header,
            sections: Vec::new(),
            figures: serde_json::Map::new(),
            latency_runs: Vec::new(),
            soak: Vec::new(),
        })
    }

    pub(crate) fn section(
        &mut self,
        name: &str,
        about: &str,
        columns: &[&str],
        rows: Vec<Vec<String>>,
        json: serde_json::Value,
    ) {
        let mut md = format!(
            "### {name}\n\n{about}\n\n| {} |\n|{}\n",
            columns.join(" | "),
            "---|".repeat(columns.len())
        );
        for row in &rows {
            md.push_str(&format!("| {} |\n", row.join(" | ")));
        }
        println!("{md}");
        let line = serde_json::json!({ "scenario": name, "figures": json });
        println!("{line}");
        self.figures.insert(name.to_owned(), json);
        self.sections.push(md);
    }

    /// Rewrites the generated part of `path` (between the markers) and the plot beside it.
    pub(crate) fn write(&self, path: &str) -> Result<(), BoxError> {
        let begin = "<!-- bench:begin -->";
        let end = "<!-- bench:end -->";
        let existing = std::fs::read_to_string(path)
            .unwrap_or_else(|_| format!("# Benchmarks\n\n{begin}\n{end}\n"));
        let (Some(a), Some(b)) = (existing.find(begin), existing.find(end)) else {
            return Err(format!("{path} has no {begin} … {end} markers").into());
        };
        let mut generated = format!("{begin}\n\n## Latest run\n\n{}\n", self.header);
        for s in &self.sections {
            generated.push_str(s);
            generated.push('\n');
        }
        if !self.latency_runs.is_empty() {
            let plot = std::path::Path::new(path).with_file_name("docs/bench-latency.svg");
            std::fs::create_dir_all(plot.parent().expect("parent"))?;
            std::fs::write(&plot, self.latency_svg())?;
            generated
                .push_str("![commit→publish latency distribution](docs/bench-latency.svg)\n\n");
        }
        if !self.soak.is_empty() {
            let plot = std::path::Path::new(path).with_file_name("docs/bench-soak.svg");
            std::fs::create_dir_all(plot.parent().expect("parent"))?;
            std::fs::write(&plot, self.soak_svg())?;
            generated.push_str("![resident memory during the soak](docs/bench-soak.svg)\n\n");
        }
        generated.push_str(&format!(
            "<details><summary>figures as JSON</summary>\n\n```json\n{}\n```\n\n</details>\n\n",
            serde_json::to_string_pretty(&self.figures)?
        ));
        let out = format!("{}{generated}{}", &existing[..a], &existing[b..]);
        std::fs::write(path, out)?;
        Ok(())
    }

    /// Resident memory over the soak, as a small hand-written SVG.
    fn soak_svg(&self) -> String {
        let (w, h, left, bottom) = (720.0, 300.0, 60.0, 40.0);
        let end_s = self.soak.last().map_or(1.0, |s| s.at_s).max(1.0);
        let top_mib = (self.soak.iter().map(|s| s.rss_mib).fold(0.0, f64::max) * 1.25).max(1.0);
        let x = |s: f64| left + s / end_s * (w - left - 20.0);
        let y = |mib: f64| (h - bottom) - mib / top_mib * (h - bottom - 20.0);
        let mut svg = format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/>"#
        );
        svg.push_str(&format!(r#"<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="black"/><line x1="{left}" y1="20" x2="{left}" y2="{}" stroke="black"/>"#, h - bottom, w - 20.0, h - bottom, h - bottom));
        let minutes = (end_s / 60.0).ceil() as u64;
        let step = (minutes / 6).max(1);
        for minute in (0..=minutes).step_by(step as usize) {
            svg.push_str(&format!(
                r#"<text x="{:.1}" y="{}" text-anchor="middle">{minute}</text>"#,
                x(minute as f64 * 60.0),
                h - bottom + 16.0
            ));
        }
        svg.push_str(&format!(
            r#"<text x="{:.1}" y="{}" text-anchor="middle">minutes</text>"#,
            (w + left) / 2.0,
            h - 6.0
        ));
        for k in 0..=4 {
            let mib = top_mib * f64::from(k) / 4.0;
            svg.push_str(&format!(
                r#"<text x="{}" y="{:.1}" text-anchor="end">{mib:.0}</text>"#,
                left - 6.0,
                y(mib) + 4.0
            ));
        }
        let points: Vec<String> = self
            .soak
            .iter()
            .map(|s| format!("{:.1},{:.1}", x(s.at_s), y(s.rss_mib)))
            .collect();
        svg.push_str(&format!(
            r##"<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{}"/><text x="{}" y="36" fill="#1f77b4">resident memory, MiB (every 10 s)</text></svg>"##,
            points.join(" "),
            left + 10.0
        ));
        svg.push('\n');
        svg
    }

    /// A cumulative distribution of latency per run, as a small hand-written SVG.
    fn latency_svg(&self) -> String {
        let (w, h, left, bottom) = (720.0, 420.0, 60.0, 40.0);
        let max_ms = self
            .latency_runs
            .iter()
            .filter_map(|r| r.latencies_ms.last().copied())
            .fold(1.0_f64, f64::max);
        let x = |ms: f64| {
            left + (ms.max(0.1).log10() + 1.0) / (max_ms.log10() + 1.0) * (w - left - 20.0)
        };
        let y = |q: f64| (h - bottom) - q * (h - bottom - 20.0);
        let colors = [
            "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
        ];
        let mut svg = format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/>"#
        );
        svg.push_str(&format!(r#"<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="black"/><line x1="{left}" y1="20" x2="{left}" y2="{}" stroke="black"/>"#, h - bottom, w - 20.0, h - bottom, h - bottom));
        let mut tick = 0.1;
        while tick <= max_ms * 1.01 {
            svg.push_str(&format!(
                r#"<text x="{:.1}" y="{}" text-anchor="middle">{tick}</text>"#,
                x(tick),
                h - bottom + 16.0
            ));
            tick *= 10.0;
        }
        svg.push_str(&format!(
            r#"<text x="{:.1}" y="{}" text-anchor="middle">latency, ms (log scale)</text>"#,
            (w + left) / 2.0,
            h - 6.0
        ));
        for q in [0.0, 0.5, 0.9, 0.99, 1.0] {
            svg.push_str(&format!(
                r#"<text x="{}" y="{:.1}" text-anchor="end">{q}</text>"#,
                left - 6.0,
                y(q) + 4.0
            ));
        }
        for (i, run) in self.latency_runs.iter().enumerate() {
            let n = run.latencies_ms.len().max(1) as f64;
            let step = (run.latencies_ms.len() / 400).max(1);
            let points: Vec<String> = run
                .latencies_ms
                .iter()
                .enumerate()
                .step_by(step)
                .map(|(k, ms)| format!("{:.1},{:.1}", x(*ms), y((k + 1) as f64 / n)))
                .collect();
            let color = colors[i % colors.len()];
            let dash = if run.wakeups {
                ""
            } else {
                r#" stroke-dasharray="5,3""#
            };
            svg.push_str(&format!(
                r#"<polyline fill="none" stroke="{color}" stroke-width="1.5"{dash} points="{}"/>"#,
                points.join(" ")
            ));
            let label = format!(
                "{}/s {}",
                run.rate,
                if run.wakeups { "wakeups" } else { "polling" }
            );
            svg.push_str(&format!(
                r#"<text x="{}" y="{}" fill="{color}">{label}</text>"#,
                left + 10.0,
                36.0 + 15.0 * i as f64
            ));
        }
        svg.push_str("</svg>\n");
        svg
    }
}
