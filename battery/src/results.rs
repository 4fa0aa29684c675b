//! The recorded results: one row per store × sink × fault cell, the latest run of each, in
//! a tab-separated file (`docs/reliability/cells.tsv`), and the Markdown generated from it
//! into the pages that show it, between `<!-- battery:NAME:begin -->` and
//! `<!-- battery:NAME:end -->` lines. `cells` is the table of every row; `summary` counts
//! the cells recorded and failing per store and sink.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::ValueEnum;

use crate::faults::Fault;
use crate::{SinkKind, StoreKind, name};

/// The results file's columns, in order: its header line.
const COLUMNS: [&str; 15] = [
    "store",
    "sink",
    "fault",
    "faults",
    "committed",
    "rolled_back",
    "lost",
    "unexpected",
    "duplicates",
    "leased_at_kills",
    "out_of_order",
    "unfinished",
    "seconds",
    "commit",
    "verdict",
];

/// How many counted columns there are, each named as a `key=value` field of the line
/// `outbox-battery run` prints.
const COUNTS: usize = 10;
/// Where the counted columns start among [`COLUMNS`].
const FIRST_COUNT: usize = 3;
/// `leased_at_kills` among the counts.
const LEASED_AT_KILLS: usize = 6;
/// `lost`, `unexpected`, `out_of_order` and `unfinished` among the counts.
const LOST: usize = 3;
const UNEXPECTED: usize = 4;
const OUT_OF_ORDER: usize = 7;
const UNFINISHED: usize = 8;

/// A count nobody knows: the cell printed no result (it timed out or panicked).
const UNKNOWN: &str = "?";
/// `leased_at_kills` of a fault that kills no relay.
const NO_KILLS: &str = "-";

/// A cell's verdict, as `outbox-battery run`'s exit status gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Verdict {
    /// Every promise held.
    #[value(name = "ok")]
    Ok,
    /// A promise broke, or the cell gave no result.
    #[value(name = "FAILED")]
    Failed,
}

/// One cell's latest result.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    store: StoreKind,
    sink: SinkKind,
    fault: Fault,
    /// The counted columns: each a number, [`UNKNOWN`], or for `leased_at_kills`
    /// [`NO_KILLS`].
    counts: [String; COUNTS],
    commit: String,
    verdict: Verdict,
}

/// `value`'s place among its type's values: the order of the rows.
fn position<T: ValueEnum + PartialEq>(value: &T) -> usize {
    T::value_variants()
        .iter()
        .position(|v| v == value)
        .unwrap_or(usize::MAX)
}

/// The value named `text` on the command line.
fn parse<T: ValueEnum>(what: &str, text: &str) -> Result<T, String> {
    T::from_str(text, false).map_err(|_| format!("no {what} `{text}`"))
}

impl Row {
    fn order(&self) -> (usize, usize, usize) {
        (
            position(&self.store),
            position(&self.sink),
            position(&self.fault),
        )
    }

    fn cell(&self) -> String {
        format!(
            "{} × {} × {}",
            name(self.store),
            name(self.sink),
            name(self.fault)
        )
    }

    /// The row `outbox-battery run` printed as `line` gives. A line without counts (the
    /// script's stand-in for a cell that printed none) gives [`UNKNOWN`] counts.
    fn from_battery(line: &str, commit: &str, verdict: Verdict) -> Result<Self, String> {
        let mut words = line.split_whitespace();
        if words.next() != Some("battery") {
            return Err(format!("not a battery line: {line}"));
        }
        let fields: Vec<(&str, &str)> = words.filter_map(|w| w.split_once('=')).collect();
        if line.split_whitespace().any(|w| w == "broken") {
            return Err("the broken relay's run is no cell's result".to_owned());
        }
        let field = |key: &str| fields.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        let identity = |key: &str| field(key).ok_or_else(|| format!("no {key}= in: {line}"));
        let fault: Fault = parse("fault", identity("fault")?)?;
        let counts = std::array::from_fn(|i| {
            if i == LEASED_AT_KILLS && !fault.kills() {
                NO_KILLS.to_owned()
            } else {
                field(COLUMNS[FIRST_COUNT + i])
                    .unwrap_or(UNKNOWN)
                    .to_owned()
            }
        });
        let row = Self {
            store: parse("store", identity("store")?)?,
            sink: parse("sink", identity("sink")?)?,
            fault,
            counts,
            commit: commit.to_owned(),
            verdict,
        };
        row.validate()?;
        Ok(row)
    }

    /// The row a line of the results file holds.
    fn from_tsv(line: &str) -> Result<Self, String> {
        let values: Vec<&str> = line.split('\t').collect();
        if values.len() != COLUMNS.len() {
            return Err(format!("{} columns, not {}", values.len(), COLUMNS.len()));
        }
        let row = Self {
            store: parse("store", values[0])?,
            sink: parse("sink", values[1])?,
            fault: parse("fault", values[2])?,
            counts: std::array::from_fn(|i| values[FIRST_COUNT + i].to_owned()),
            commit: values[FIRST_COUNT + COUNTS].to_owned(),
            verdict: parse("verdict", values[FIRST_COUNT + COUNTS + 1])?,
        };
        row.validate()?;
        Ok(row)
    }

    fn validate(&self) -> Result<(), String> {
        if let Some(reason) = self.fault.unsupported(self.store.database(), self.sink) {
            return Err(format!("{} does not apply: {reason}", self.cell()));
        }
        for (i, value) in self.counts.iter().enumerate() {
            let column = COLUMNS[FIRST_COUNT + i];
            let fits = if i == LEASED_AT_KILLS && !self.fault.kills() {
                value == NO_KILLS
            } else {
                value == UNKNOWN || value.parse::<i64>().is_ok()
            };
            if !fits {
                return Err(format!("{}: {column} is `{value}`", self.cell()));
            }
            if value == UNKNOWN && self.verdict == Verdict::Ok {
                return Err(format!("{}: a passing row without {column}", self.cell()));
            }
        }
        if self.commit.is_empty()
            || self
                .commit
                .contains(|c: char| c.is_whitespace() || c == '|')
        {
            return Err(format!("{}: commit `{}`", self.cell(), self.commit));
        }
        Ok(())
    }

    fn to_tsv(&self) -> String {
        let mut values = vec![name(self.store), name(self.sink), name(self.fault)];
        values.extend(self.counts.iter().cloned());
        values.push(self.commit.clone());
        values.push(name(self.verdict));
        values.join("\t")
    }
}

/// The rows of a results file, in order; an error names the line at fault.
fn read(text: &str) -> Result<Vec<Row>, String> {
    let mut lines = text.lines();
    if lines.next() != Some(COLUMNS.join("\t").as_str()) {
        return Err(format!(
            "the first line must be the header `{}`",
            COLUMNS.join(" ")
        ));
    }
    let mut rows: Vec<Row> = Vec::new();
    for (i, line) in lines.enumerate() {
        let row = Row::from_tsv(line).map_err(|e| format!("line {}: {e}", i + 2))?;
        if rows.iter().any(|r| r.order() == row.order()) {
            return Err(format!("line {}: {} again", i + 2, row.cell()));
        }
        rows.push(row);
    }
    rows.sort_by_key(Row::order);
    Ok(rows)
}

/// The results file that holds `rows`.
fn write(rows: &[Row]) -> String {
    let mut text = COLUMNS.join("\t") + "\n";
    for row in rows {
        text.push_str(&row.to_tsv());
        text.push('\n');
    }
    text
}

/// `rows` with `row` in its cell's place: the latest run wins.
fn with(mut rows: Vec<Row>, row: Row) -> Vec<Row> {
    rows.retain(|r| r.order() != row.order());
    rows.push(row);
    rows.sort_by_key(Row::order);
    rows
}

/// The Markdown table of every row. A failing row says so; unknown counts show as `?`.
fn cells_table(rows: &[Row]) -> String {
    let mut table = String::from(
        "| store | sink | fault | faults | committed | rolled back | lost | unexpected | \
         duplicates | leased at kills | out of order | unfinished | seconds | commit | verdict |\n\
         |---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n",
    );
    for row in rows {
        let counts = row.counts.iter().enumerate().map(|(i, value)| {
            if value == NO_KILLS {
                "–".to_owned()
            } else if i == OUT_OF_ORDER && !row.sink.keeps_order() && value != UNKNOWN {
                format!("{value} (not ordered)")
            } else {
                value.clone()
            }
        });
        let verdict = match row.verdict {
            Verdict::Ok => "ok",
            Verdict::Failed => "**FAILED**",
        };
        let _ = writeln!(
            table,
            "| {} | {} | {} | {} | {} | {verdict} |",
            name(row.store),
            name(row.sink),
            name(row.fault),
            counts.collect::<Vec<_>>().join(" | "),
            row.commit,
        );
    }
    table
}

/// The cells recorded and failing per store and sink, against the cells that apply, and
/// each failing cell by name.
fn summary(rows: &[Row]) -> String {
    let (stores, sinks, faults) = (
        StoreKind::value_variants(),
        SinkKind::value_variants(),
        Fault::value_variants(),
    );
    let applies = |store: StoreKind, sink: SinkKind| {
        faults
            .iter()
            .filter(|f| f.unsupported(store.database(), sink).is_none())
            .count()
    };
    let applicable: usize = stores
        .iter()
        .flat_map(|store| sinks.iter().map(|sink| applies(*store, *sink)))
        .sum();
    let failing: Vec<&Row> = rows
        .iter()
        .filter(|r| r.verdict == Verdict::Failed)
        .collect();
    let mut text = format!(
        "**{} of the {applicable} cells that apply are recorded: {} pass, {} fail.** \
         ({} stores × {} sinks × {} faults make {} cells; the rest do not apply.)\n\n",
        rows.len(),
        rows.len() - failing.len(),
        failing.len(),
        stores.len(),
        sinks.len(),
        faults.len(),
        stores.len() * sinks.len() * faults.len(),
    );
    if failing.is_empty() {
        text.push_str("No recorded cell fails.\n");
    }
    for row in &failing {
        let _ = writeln!(
            text,
            "- **FAILED**: {} at {}: lost {}, unexpected {}, out of order {}, unfinished {}.",
            row.cell(),
            row.commit,
            row.counts[LOST],
            row.counts[UNEXPECTED],
            row.counts[OUT_OF_ORDER],
            row.counts[UNFINISHED],
        );
    }
    text.push_str(
        "\nCells recorded of those that apply, per store and sink (✗: failing):\n\n| store |",
    );
    for sink in sinks {
        let _ = write!(text, " {} |", name(*sink));
    }
    text.push_str("\n|---|");
    text.push_str(&"---:|".repeat(sinks.len()));
    text.push('\n');
    for store in stores {
        let _ = write!(text, "| {} |", name(*store));
        for sink in sinks {
            let here = rows.iter().filter(|r| r.store == *store && r.sink == *sink);
            let failed = here
                .clone()
                .filter(|r| r.verdict == Verdict::Failed)
                .count();
            let _ = write!(text, " {}/{}", here.count(), applies(*store, *sink));
            if failed > 0 {
                let _ = write!(text, " ✗{failed}");
            }
            text.push_str(" |");
        }
        text.push('\n');
    }
    text
}

/// `page` with the lines between its `battery:NAME` markers replaced by `content`, set off
/// by blank lines; `None` if the page has no such block.
fn replace_block(page: &str, name: &str, content: &str) -> Result<Option<String>, String> {
    let lines: Vec<&str> = page.split_inclusive('\n').collect();
    let find = |edge: &str| -> Vec<usize> {
        let marker = format!("<!-- battery:{name}:{edge}");
        let found = lines.iter().enumerate();
        found
            .filter(|(_, line)| line.trim_start().starts_with(&marker))
            .map(|(i, _)| i)
            .collect()
    };
    match (find("begin").as_slice(), find("end").as_slice()) {
        ([], []) => Ok(None),
        ([begin], [end]) if begin < end => {
            let mut out = lines[..=*begin].concat();
            out.push('\n');
            out.push_str(content);
            out.push('\n');
            out.push_str(&lines[*end..].concat());
            Ok(Some(out))
        }
        _ => Err(format!(
            "the `battery:{name}` markers are not one begin line before one end line"
        )),
    }
}

/// `page` with every generated block it holds made from `rows`.
fn generate(page: &str, rows: &[Row]) -> Result<String, String> {
    let mut page = page.to_owned();
    let mut blocks = 0;
    for (block, content) in [("cells", cells_table(rows)), ("summary", summary(rows))] {
        if let Some(replaced) = replace_block(&page, block, &content)? {
            page = replaced;
            blocks += 1;
        }
    }
    if blocks == 0 {
        return Err("no `<!-- battery:cells:begin -->` or `battery:summary` markers".to_owned());
    }
    Ok(page)
}

fn read_file(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn write_file(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// `outbox-battery record`: puts the cell `line` reports in the results file, in place of
/// the cell's row if it has one. A missing file is created.
pub(crate) fn record(
    results: &Path,
    commit: &str,
    verdict: Verdict,
    line: &str,
) -> Result<(), String> {
    let row = Row::from_battery(line, commit, verdict)?;
    let rows = match std::fs::read_to_string(results) {
        Ok(text) => read(&text).map_err(|e| format!("{}: {e}", results.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(format!("{}: {e}", results.display())),
    };
    write_file(results, &write(&with(rows, row)))
}

/// `outbox-battery table`: writes each page's generated blocks from the results file, or
/// with `check`, writes nothing and returns the pages whose blocks differ.
pub(crate) fn table(
    results: &Path,
    pages: &[PathBuf],
    check: bool,
) -> Result<Vec<PathBuf>, String> {
    let rows = read(&read_file(results)?).map_err(|e| format!("{}: {e}", results.display()))?;
    let mut differ = Vec::new();
    for path in pages {
        let page = read_file(path)?;
        let generated = generate(&page, &rows).map_err(|e| format!("{}: {e}", path.display()))?;
        if generated != page {
            if check {
                differ.push(path.clone());
            } else {
                write_file(path, &generated)?;
            }
        }
    }
    Ok(differ)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "store\tsink\tfault\tfaults\tcommitted\trolled_back\tlost\tunexpected\t\
                          duplicates\tleased_at_kills\tout_of_order\tunfinished\tseconds\tcommit\tverdict";

    fn results(rows: &[&str]) -> String {
        let mut text = format!("{HEADER}\n");
        for row in rows {
            text.push_str(&row.replace(' ', "\t"));
            text.push('\n');
        }
        text
    }

    #[test]
    fn a_battery_line_becomes_a_row_and_the_latest_run_of_a_cell_wins() {
        let line = "battery store=mysql sink=sqs fault=kill9 faults=20 relays_started=31 \
                    committed=299 deliveries=323 lost=0 unexpected=0 duplicates=24 \
                    out_of_order=0 rolled_back=121 writes_failed=0 published=299 \
                    unfinished=0 dead=0 leased_at_kills=43 ordered=false seconds=21";
        let first = Row::from_battery(line, "abc1234", Verdict::Ok).unwrap();
        assert_eq!(
            first.to_tsv(),
            "mysql\tsqs\tkill9\t20\t299\t121\t0\t0\t24\t43\t0\t0\t21\tabc1234\tok"
        );
        let later = Row::from_battery(
            &line.replace("lost=0", "lost=3"),
            "def5678-dirty",
            Verdict::Failed,
        )
        .unwrap();
        let earlier = read(&results(&[
            "postgres http none 5 10 4 0 0 0 - 0 0 5 1111111 ok",
        ]));
        let rows = with(with(earlier.unwrap(), first), later);
        assert_eq!(
            write(&rows),
            results(&[
                "postgres http none 5 10 4 0 0 0 - 0 0 5 1111111 ok",
                "mysql sqs kill9 20 299 121 3 0 24 43 0 0 21 def5678-dirty FAILED",
            ])
        );
    }

    #[test]
    fn a_cell_that_printed_nothing_is_recorded_as_failed_with_unknown_counts() {
        let row = Row::from_battery(
            "battery store=postgres sink=http fault=db-kill",
            "abc1234",
            Verdict::Failed,
        )
        .unwrap();
        assert_eq!(
            row.to_tsv(),
            "postgres\thttp\tdb-kill\t?\t?\t?\t?\t?\t?\t-\t?\t?\t?\tabc1234\tFAILED"
        );
        // ... which a passing row may not have.
        assert!(
            Row::from_battery(
                "battery store=postgres sink=http fault=db-kill",
                "a",
                Verdict::Ok
            )
            .is_err()
        );
        assert!(
            Row::from_battery(
                "battery store=postgres sink=http fault=kill9 broken lost=3",
                "a",
                Verdict::Ok
            )
            .is_err()
        );
    }

    #[test]
    fn the_results_file_refuses_what_no_run_could_record() {
        let refused = |row: &str| read(&results(&[row])).unwrap_err();
        // A cell the faults rule out.
        assert!(
            refused("sqlite http db-kill 5 10 4 0 0 0 - 0 0 5 abc ok").contains("does not apply")
        );
        // Leased at kills for a fault that kills nothing.
        assert!(
            refused("postgres http none 5 10 4 0 0 0 7 0 0 5 abc ok").contains("leased_at_kills")
        );
        assert!(
            refused("postgres http kill9 5 10 4 0 0 0 - 0 0 5 abc ok").contains("leased_at_kills")
        );
        assert!(refused("postgres http nonsense 5 10 4 0 0 0 - 0 0 5 abc ok").contains("no fault"));
        assert!(refused("postgres http none 5 10 4 0 0 0 - 0 0 5 abc").contains("columns"));
        let twice = results(&[
            "postgres http none 5 10 4 0 0 0 - 0 0 5 abc ok",
            "postgres http none 6 10 4 0 0 0 - 0 0 5 abc ok",
        ]);
        assert!(read(&twice).unwrap_err().starts_with("line 3: "));
        assert!(read("store sink\n").is_err());
    }

    #[test]
    fn a_failing_row_shows_as_failing_in_the_table_and_the_summary() {
        let rows = read(&results(&[
            "postgres http kill9 20 16714 7204 0 0 95 314 0 0 51 797b421 ok",
            "postgres sqs none 5 155 53 0 0 0 - 0 0 5 2e70834 ok",
            "mysql http db-kill 20 8770 3759 2 0 0 - 1 0 23 abc1234-dirty FAILED",
        ]))
        .unwrap();
        let table = cells_table(&rows);
        assert!(table.contains(
            "| postgres | http | kill9 | 20 | 16714 | 7204 | 0 | 0 | 95 | 314 | 0 | 0 | 51 | 797b421 | ok |"
        ));
        assert!(table.contains("| postgres | sqs | none | 5 | 155 | 53 | 0 | 0 | 0 | – | 0 (not ordered) | 0 | 5 | 2e70834 | ok |"));
        assert!(table.contains(
            "| mysql | http | db-kill | 20 | 8770 | 3759 | 2 | 0 | 0 | – | 1 | 0 | 23 | abc1234-dirty | **FAILED** |"
        ));
        let summary = summary(&rows);
        assert!(summary.contains("3 of the "), "{summary}");
        assert!(summary.contains("2 pass, 1 fail"), "{summary}");
        assert!(summary.contains(
            "- **FAILED**: mysql × http × db-kill at abc1234-dirty: lost 2, unexpected 0, out of order 1, unfinished 0."
        ));
        assert!(summary.contains("| mysql | 1/14 ✗1 |"), "{summary}");
        assert!(!summary.contains("No recorded cell fails"));
    }

    #[test]
    fn only_the_lines_between_the_markers_are_replaced() {
        let page = "# Title\n\nprose before\n<!-- battery:summary:begin (generated) -->\nold\n\
                    lines\n<!-- battery:summary:end -->\nprose after\n";
        let replaced = replace_block(page, "summary", "new\n").unwrap().unwrap();
        assert_eq!(
            replaced,
            "# Title\n\nprose before\n<!-- battery:summary:begin (generated) -->\n\nnew\n\n\
             <!-- battery:summary:end -->\nprose after\n"
        );
        // Replacing again changes nothing: the check compares a page with its regeneration.
        assert_eq!(
            replace_block(&replaced, "summary", "new\n")
                .unwrap()
                .unwrap(),
            replaced
        );
        assert_eq!(replace_block(page, "cells", "new\n").unwrap(), None);
        let reversed = "<!-- battery:cells:end -->\n<!-- battery:cells:begin -->\n";
        assert!(replace_block(reversed, "cells", "x").is_err());
        let twice = "<!-- battery:cells:begin -->\n<!-- battery:cells:begin -->\n<!-- battery:cells:end -->\n";
        assert!(replace_block(twice, "cells", "x").is_err());
        assert!(generate("no markers\n", &[]).is_err());
    }

    #[test]
    fn the_check_finds_a_page_that_drifted_from_the_results() {
        let dir = std::env::temp_dir().join(format!("battery-results-{:016x}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let results_file = dir.join("cells.tsv");
        std::fs::write(
            &results_file,
            results(&["postgres http none 5 10 4 0 0 0 - 0 0 5 abc ok"]),
        )
        .unwrap();
        let page = dir.join("page.md");
        std::fs::write(
            &page,
            "intro\n<!-- battery:cells:begin -->\n<!-- battery:cells:end -->\n",
        )
        .unwrap();
        let pages = [page.clone()];
        assert_eq!(table(&results_file, &pages, true).unwrap(), pages);
        assert!(table(&results_file, &pages, false).unwrap().is_empty());
        assert!(table(&results_file, &pages, true).unwrap().is_empty());
        let written = std::fs::read_to_string(&page).unwrap();
        assert!(written.contains("| postgres | http | none | 5 | 10 | 4 | 0 |"));
        std::fs::write(&page, written.replace("| 10 |", "| 11 |")).unwrap();
        assert_eq!(table(&results_file, &pages, true).unwrap(), pages);
        record(
            &results_file,
            "abc",
            Verdict::Ok,
            "battery store=postgres sink=http fault=none faults=5 committed=11 lost=0 \
             unexpected=0 duplicates=0 out_of_order=0 rolled_back=4 unfinished=0 \
             leased_at_kills=0 seconds=5",
        )
        .unwrap();
        assert!(table(&results_file, &pages, true).unwrap().is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
