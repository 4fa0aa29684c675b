//! Tables on stdout, one JSON line per scenario, and with `--write` a page per scenario
//! under `docs/benchmarks/` plus the index of those pages in BENCHMARKS.md.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::latency::Run;
use crate::setup::{Bench, BoxError};

pub(crate) struct Report {
    /// The machine, database and versions, one Markdown list item per line.
    header: String,
    /// `--quick` sizes: a page says so.
    quick: bool,
    /// The commit and date the run started at (see [`run_id`]).
    run: String,
    pages: Vec<Page>,
    pub(crate) latency_runs: Vec<Run>,
    pub(crate) soak: Vec<crate::soak::Sample>,
}

/// What one scenario reported: its tables and its figures.
struct Page {
    scenario: String,
    about: String,
    sections: Vec<String>,
    figures: serde_json::Map<String, serde_json::Value>,
}

pub(crate) fn median(samples: &[f64]) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

/// Each mode's median over `rounds` rounds (at least one per mode) of `measure(mode)`.
pub(crate) async fn interleaved_medians(
    modes: usize,
    rounds: usize,
    measure: impl AsyncFnMut(usize) -> Result<f64, BoxError>,
) -> Result<Vec<f64>, BoxError> {
    let samples = interleaved(modes, rounds.max(modes), measure).await?;
    Ok(samples.iter().map(|s| median(s)).collect())
}

/// Every mode's samples of `measure(mode)` over `rounds` rounds. The rounds start at
/// modes spread evenly over the list, so no mode always runs right after the same other
/// one (the table grows, autovacuum and checkpoints come and go).
pub(crate) async fn interleaved<T>(
    modes: usize,
    rounds: usize,
    mut measure: impl AsyncFnMut(usize) -> Result<T, BoxError>,
) -> Result<Vec<Vec<T>>, BoxError> {
    let rounds = rounds.max(1);
    let mut samples: Vec<Vec<T>> = (0..modes).map(|_| Vec::new()).collect();
    for round in 0..rounds {
        let first = round * modes / rounds;
        for step in 0..modes {
            let mode = (first + step) % modes;
            samples[mode].push(measure(mode).await?);
        }
    }
    Ok(samples)
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
    pub(crate) async fn new(bench: &Bench, quick: bool) -> Result<Self, BoxError> {
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
        println!("{header}");
        Ok(Self {
            header,
            quick,
            run: run_id(),
            pages: Vec::new(),
            latency_runs: Vec::new(),
            soak: Vec::new(),
        })
    }

    /// Starts the page of `scenario`: the sections that follow belong to it.
    pub(crate) fn begin(&mut self, scenario: String, about: String) {
        self.pages.push(Page {
            scenario,
            about,
            sections: Vec::new(),
            figures: serde_json::Map::new(),
        });
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
            "## {name}\n\n{about}\n\n| {} |\n|{}\n",
            columns.join(" | "),
            "---|".repeat(columns.len())
        );
        for row in &rows {
            md.push_str(&format!("| {} |\n", row.join(" | ")));
        }
        println!("{md}");
        let line = serde_json::json!({ "scenario": name, "figures": json });
        println!("{line}");
        let page = self
            .pages
            .last_mut()
            .expect("a section belongs to a scenario");
        page.figures.insert(name.to_owned(), json);
        page.sections.push(md);
    }

    /// Writes a page per scenario run into `docs/benchmarks/` beside `index` (BENCHMARKS.md),
    /// with its plot, and rewrites the index between `index`'s markers from every page
    /// there, so a run of one scenario leaves the other pages and their rows as they were.
    pub(crate) fn write(
        &self,
        index: &str,
        scenarios: &[(String, String)],
    ) -> Result<(), BoxError> {
        let dir = Path::new(index).with_file_name("docs/benchmarks");
        std::fs::create_dir_all(&dir)?;
        let run = &self.run;
        for page in &self.pages {
            let mut md = format!(
                "# {}\n\n{GENERATED}\n\n{}\n\n- run: {run}{}\n{}- reproduce: `cargo run --release -p outbox-bench -- {}{} --write BENCHMARKS.md`\n\n",
                page.scenario,
                page.about,
                if self.quick { ", `--quick` sizes" } else { "" },
                self.header,
                page.scenario,
                if self.quick { " --quick" } else { "" },
            );
            for section in &page.sections {
                md.push_str(section);
                md.push('\n');
            }
            let plot = match page.scenario.as_str() {
                "latency" if !self.latency_runs.is_empty() => {
                    Some(("commit→publish latency distribution", self.latency_svg()))
                }
                "soak" if !self.soak.is_empty() => {
                    Some(("resident memory during the soak", self.soak_svg()))
                }
                _ => None,
            };
            if let Some((title, svg)) = plot {
                std::fs::write(dir.join(format!("{}.svg", page.scenario)), svg)?;
                writeln!(md, "![{title}]({}.svg)\n", page.scenario)?;
            }
            write!(
                md,
                "<details><summary>figures as JSON</summary>\n\n```json\n{}\n```\n\n</details>\n",
                serde_json::to_string_pretty(&page.figures)?
            )?;
            std::fs::write(page_path(&dir, &page.scenario), md)?;
        }
        let existing = std::fs::read_to_string(index)?;
        let (Some(a), Some(b)) = (existing.find(BEGIN), existing.find(END)) else {
            return Err(format!("{index} has no {BEGIN} … {END} markers").into());
        };
        let out = format!(
            "{}{BEGIN}\n{}{}",
            &existing[..a],
            index_table(&dir, scenarios)?,
            &existing[b..]
        );
        std::fs::write(index, out)?;
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

const BEGIN: &str = "<!-- bench:begin -->";
const END: &str = "<!-- bench:end -->";
const GENERATED: &str =
    "<!-- Written by `outbox-bench --write`: change outbox-bench, not this page. -->";

fn page_path(dir: &Path, scenario: &str) -> PathBuf {
    dir.join(format!("{scenario}.md"))
}

/// The commit checked out when the run starts and the date: `commit 358ce03 (2026-12-07)`,
/// with `-modified` when the work tree had changes outside the documents (the binary may
/// not be that commit's code).
fn run_id() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    // The pages and the index a run writes are not the code it measured.
    let modified = git(&[
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        ".",
        ":!docs",
        ":!BENCHMARKS.md",
    ])
    .is_some_and(|changes| !changes.is_empty());
    let date = chrono::Utc::now().format("%Y-%m-%d");
    format!(
        "commit {commit}{} ({date})",
        if modified { "-modified" } else { "" }
    )
}

/// The index of the pages in `dir`, in the order of `scenarios` (name, what it compares):
/// each with its run line, read back from the page.
fn index_table(dir: &Path, scenarios: &[(String, String)]) -> Result<String, BoxError> {
    let mut table = String::from("\n| scenario | compares | latest run |\n|---|---|---|\n");
    for (scenario, about) in scenarios {
        let path = page_path(dir, scenario);
        let run = match std::fs::read_to_string(&path) {
            Ok(page) => page
                .lines()
                .find_map(|l| l.strip_prefix("- run: "))
                .unwrap_or("unknown")
                .to_owned(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e.into()),
        };
        writeln!(
            table,
            "| [{scenario}](docs/benchmarks/{scenario}.md) | {about} | {run} |"
        )?;
    }
    table.push('\n');
    Ok(table)
}
