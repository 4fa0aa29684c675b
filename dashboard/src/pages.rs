//! The HTML of every page. `maud` escapes every value spliced in, so data from the table
//! (payloads, headers, errors, names) is always text, never markup.

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use maud::{DOCTYPE, Markup, PreEscaped, html};
use outbox_engine::activity::{Latency, WINDOW, WINDOWS};
use outbox_engine::{
    Capabilities, DeadLetter, DeadLetterFilter, FoundMessage, Gauges, MessageId, RelayHealth,
    Status,
};

use crate::filter::ListFilter;
use crate::routes::PAGE;

/// Largest payload preview, in bytes.
const PREVIEW_BYTES: usize = 64 * 1024;
/// Longest reason shown in a list.
const REASON_CHARS: usize = 160;

/// Where the dashboard is mounted (`""` at the root, `/outbox` when nested there): links
/// are absolute from it.
#[derive(Debug, Clone)]
pub(crate) struct Base(pub(crate) String);

/// What a confirmed form changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    Replay,
    Discard,
}

/// A change under review: the selected ids (empty for a whole filter), the list it came
/// from, and the filter it applies.
#[derive(Debug, Clone)]
pub(crate) struct Review {
    pub(crate) change: Change,
    pub(crate) ids: Vec<MessageId>,
    pub(crate) list: ListFilter,
    pub(crate) filter: DeadLetterFilter,
}

const STYLE: &str = "
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d232a;background:#f6f7f9}
header{background:#1d232a;color:#fff;padding:.6rem 1.2rem;display:flex;gap:1.2rem;align-items:center}
header a{color:#fff;text-decoration:none;font-weight:600}
header form{margin-left:auto}
main{padding:1rem 1.2rem;max-width:1200px}
table{border-collapse:collapse;background:#fff;width:100%;margin:.6rem 0}
th,td{padding:.35rem .55rem;border-bottom:1px solid #e3e6ea;text-align:left;vertical-align:top}
th{background:#eef0f3;font-weight:600}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.warn{color:#a4262c;font-weight:600}
.ok{color:#107c10}
.note{background:#fff4ce;padding:.5rem .8rem;border-left:4px solid #c19c00;margin:.6rem 0}
.done{background:#dff6dd;padding:.5rem .8rem;border-left:4px solid #107c10;margin:.6rem 0}
form.filter{display:flex;flex-wrap:wrap;gap:.6rem;align-items:end;background:#fff;padding:.7rem;border:1px solid #e3e6ea}
label{display:flex;flex-direction:column;font-size:12px;color:#555}
input,button{font:inherit;padding:.25rem .45rem}
button.danger{color:#a4262c}
pre{background:#fff;border:1px solid #e3e6ea;padding:.6rem;overflow:auto;max-height:28rem;white-space:pre-wrap;word-break:break-all}
code{font-size:12px}
";

fn layout(base: &Base, title: &str, body: Markup) -> Markup {
    let root = &base.0;
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · outbox" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    a href={ (root) "/" } { "outbox" }
                    a href={ (root) "/" } { "Overview" }
                    a href={ (root) "/waiting" } { "Waiting" }
                    a href={ (root) "/dead" } { "Dead letters" }
                    form method="get" action={ (root) "/lookup" } {
                        input type="search" name="q" placeholder="message id or idempotency key" size="38";
                        " "
                        button { "Find" }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// An error page with `status`.
pub(crate) fn problem(status: StatusCode, reason: &str) -> Response {
    let body = html! {
        (DOCTYPE)
        html lang="en" {
            head { meta charset="utf-8"; title { "outbox dashboard" } style { (PreEscaped(STYLE)) } }
            body { main { h1 { (status.as_u16()) " " (status.canonical_reason().unwrap_or("")) } p { (reason) } } }
        }
    };
    (status, body).into_response()
}

fn age(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

fn time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(|| "–".to_owned(), |d| format!("≤ {} ms", d.as_millis()))
}

/// The overview: the store's gauges per destination, and the relay's recent work.
pub(crate) fn overview(
    base: &Base,
    capabilities: &Capabilities,
    gauges: Option<&Gauges>,
    relay: Option<&RelayHealth>,
    routes: Option<&[String]>,
) -> Markup {
    let activity = relay.map(RelayHealth::activity).unwrap_or_default();
    let newest = Utc::now().timestamp().div_euclid(WINDOW.as_secs() as i64);
    let recent = |destination: &str| {
        // Published per window over the last ten minutes (oldest first), and the latency
        // of the last minute.
        let mut counts = vec![0u64; WINDOWS];
        let mut minute = Latency::default();
        for w in activity.iter().filter(|w| w.destination == destination) {
            let age = newest - w.start.timestamp().div_euclid(WINDOW.as_secs() as i64);
            if let Ok(age) = usize::try_from(age)
                && age < WINDOWS
            {
                counts[WINDOWS - 1 - age] += w.published;
                if age < 6 {
                    minute.merge(&w.latency);
                }
            }
        }
        (counts, minute)
    };
    let mut destinations: Vec<String> = gauges
        .map(|g| {
            g.destinations
                .iter()
                .map(|d| d.destination.clone())
                .collect()
        })
        .unwrap_or_default();
    for w in &activity {
        if !destinations.contains(&w.destination) {
            destinations.push(w.destination.clone());
        }
    }
    destinations.sort();
    let root = &base.0;
    let body = html! {
        p.note { "Store " (capabilities) "." }
        @if let Some(relay) = relay {
            p {
                "Relay heartbeat: "
                @match relay.heartbeat_age() {
                    Some(age) => span.ok { (self::age(age)) " ago" },
                    None => span.warn { "no worker has beaten yet" },
                }
            }
        } @else {
            p.note { "No relay is attached: the publish rate and latency appear when the dashboard runs inside a relay (`outbox relay` with a `[dashboard]` table)." }
        }
        @if gauges.is_some_and(|g| g.truncated) {
            p.note { "More unfinished or dead rows than the gauges read: counts marked ≥ are lower bounds." }
        }
        @if gauges.is_none() {
            p.note { "This store has no gauges." }
        }
        table {
            thead { tr {
                th { "destination" } th { "backlog" } th { "leased" } th { "oldest pending" }
                th { "dead" } th { "halted keys" } th { "published / s (1 min)" }
                th { "p50" } th { "p99" } th { "last 10 min" }
            } }
            tbody {
                @for destination in &destinations {
                    @let d = gauges.and_then(|g| g.destination(destination));
                    @let (counts, minute) = recent(destination);
                    @let at_least = if gauges.is_some_and(|g| g.truncated) { "≥ " } else { "" };
                    tr {
                        td { (destination) (unrouted(destination, routes)) }
                        td.n {
                            @let backlog = d.map_or(0, |d| d.pending);
                            @if backlog > 0 {
                                a href={ (root) "/waiting?" (ListFilter { destinations: vec![destination.clone()], ..ListFilter::default() }.query(&[])) } { (at_least) (backlog) }
                            } @else { "0" }
                        }
                        td.n { (d.map_or(0, |d| d.leased)) }
                        td.n { (d.and_then(|d| d.oldest_pending_age).map_or_else(|| "–".to_owned(), age)) }
                        td.n {
                            @let dead = d.map_or(0, |d| d.dead);
                            @if dead > 0 {
                                a.warn href={ (root) "/dead?" (ListFilter { destinations: vec![destination.clone()], ..ListFilter::default() }.query(&[])) } { (at_least) (dead) }
                            } @else { "0" }
                        }
                        td.n { (d.map_or(0, |d| d.halted_keys)) }
                        td.n { (format!("{:.1}", counts[WINDOWS - 6..].iter().sum::<u64>() as f64 / 60.0)) }
                        td.n { (ms(minute.quantile(0.5))) }
                        td.n { (ms(minute.quantile(0.99))) }
                        td { (sparkline(&counts)) }
                    }
                }
                @if destinations.is_empty() {
                    tr { td colspan="10" { "The table holds no unfinished or dead rows." } }
                }
            }
        }
        p { small { "Counts come from the store's gauges (unfinished and dead rows, read through their indexes on each view); rates and latency from the attached relay alone." } }
    };
    layout(base, "Overview", body)
}

/// " no route" after a destination that no route serves, when the routes are known.
fn unrouted(destination: &str, routes: Option<&[String]>) -> Markup {
    html! {
        @if routes.is_some_and(|r| !r.iter().any(|r| r == destination)) {
            " " span.warn.unrouted title="No route of this relay serves it: its rows wait for a relay that has one." { "no route" }
        }
    }
}

/// When `t` comes, from now: "due", "in 12s", "3m ago".
fn relative(t: DateTime<Utc>) -> String {
    let now = Utc::now();
    match (t - now).to_std() {
        Ok(ahead) if ahead.as_secs() > 0 => format!("in {}", age(ahead)),
        _ => "due".to_owned(),
    }
}

/// The rows still waiting under a filter: status, attempts, next attempt, last error.
pub(crate) fn waiting(
    base: &Base,
    filter: &ListFilter,
    rows: &[FoundMessage],
    routes: Option<&[String]>,
) -> Markup {
    let root = &base.0;
    let body = html! {
        (filter_form(base, "/waiting", filter))
        p { "Rows not yet published (pending, retrying or leased) that match " (filter.describe_as("no filter")) ", oldest first." }
        table {
            thead { tr {
                th { "id" } th { "destination" } th { "event type" } th { "status" } th { "attempts" }
                th { "next attempt" } th { "last error" }
            } }
            tbody {
                @for f in rows {
                    tr.waiting {
                        td { a href={ (root) "/messages/" (f.message.id) } { code { (f.message.id) } } }
                        td { (f.message.destination) (unrouted(&f.message.destination, routes)) }
                        td { (f.message.event_type) }
                        td {
                            @if f.status == Status::Pending && f.message.attempts > 0 { "retrying" } @else { (f.status) }
                        }
                        td.n { (f.message.attempts) }
                        td title=(f.next_attempt.map(time).unwrap_or_default()) {
                            (f.next_attempt.map_or_else(|| "–".to_owned(), relative))
                        }
                        td { (f.last_error.as_deref().map(|e| truncate(e, REASON_CHARS)).unwrap_or_default()) }
                    }
                }
                @if rows.is_empty() {
                    tr { td colspan="7" { "Nothing waits under this filter." } }
                }
            }
        }
        @if rows.len() == PAGE {
            @if let Some(last) = rows.last() {
                p { a #next-page href={ (root) "/waiting?" (filter.query(&[("after", last.message.id.to_string())])) } { "Next " (PAGE) " →" } }
            }
        }
    };
    layout(base, "Waiting", body)
}

/// The filter form of the list pages, its names those of `outbox dead list`'s flags.
fn filter_form(base: &Base, path: &str, filter: &ListFilter) -> Markup {
    let root = &base.0;
    let value = |v: Option<&String>| v.cloned().unwrap_or_default();
    let date = |t: Option<DateTime<Utc>>| {
        t.map(|t| t.format("%Y-%m-%dT%H:%M").to_string())
            .unwrap_or_default()
    };
    html! {
        form.filter method="get" action={ (root) (path) } {
            label { "destination" input name="destination" value=(value(filter.destinations.first())); }
            label { "event type" input name="event-type" value=(value(filter.event_types.first())); }
            label { "error contains" input name="error-contains" value=(value(filter.error.as_ref())); }
            label { "created since (UTC)" input type="datetime-local" name="since" value=(date(filter.since)); }
            label { "created before (UTC)" input type="datetime-local" name="until" value=(date(filter.until)); }
            button id="apply-filter" { "Filter" }
            a href={ (root) (path) } { "clear" }
        }
    }
}

/// Published messages per window as a small bar chart.
fn sparkline(counts: &[u64]) -> Markup {
    let (width, height) = (180.0, 28.0);
    let top = counts.iter().copied().max().unwrap_or(0).max(1) as f64;
    let step = width / counts.len().max(1) as f64;
    let bars: String = counts
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(i, n)| {
            let h = (*n as f64 / top * height).max(1.0);
            format!(
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\"/>",
                i as f64 * step,
                height - h,
                (step - 0.5).max(0.5)
            )
        })
        .collect();
    html! {
        svg width=(width) height=(height) viewBox={ "0 0 " (width) " " (height) } role="img" aria-label="published per 10 s" {
            rect width=(width) height=(height) fill="#eef0f3" {}
            g fill="#2b88d8" { (PreEscaped(bars)) }
        }
    }
}

fn filter_fields(filter: &ListFilter) -> Markup {
    html! {
        @for (name, value) in filter.pairs() {
            input type="hidden" name=(name) value=(value);
        }
    }
}

/// A page of dead letters under a filter, with the actions.
pub(crate) fn dead_letters(
    base: &Base,
    filter: &ListFilter,
    count: u64,
    letters: &[DeadLetter],
    done: Option<(&str, u64)>,
    csrf: &str,
) -> Markup {
    let root = &base.0;
    let body = html! {
        @if let Some((verb, n)) = done {
            p.done id="done" { (verb) " " span #done-count { (n) } " dead letter" @if n != 1 { "s" } "." }
        }
        (filter_form(base, "/dead", filter))
        p { span #match-count { (count) } " dead letter" @if count != 1 { "s" } " match " (filter.describe()) "." }
        form method="post" action={ (root) "/dead/review" } {
            input type="hidden" name="csrf" value=(csrf);
            (filter_fields(filter))
            @if count > 0 {
                p {
                    button name="do" value="replay-selected" { "Replay selected" } " "
                    button.danger name="do" value="discard-selected" { "Discard selected" } " · "
                    button id="replay-all" name="do" value="replay-all" { "Replay all " (count) " matching" } " "
                    button.danger id="discard-all" name="do" value="discard-all" { "Discard all " (count) " matching" }
                }
            }
            table {
                thead { tr { th {} th { "id" } th { "destination" } th { "event type" } th { "attempts" } th { "dead since" } th { "reason" } } }
                tbody {
                    @for d in letters {
                        tr.letter {
                            td { input type="checkbox" name="id" value=(d.message.id); }
                            td { a href={ (root) "/messages/" (d.message.id) } { code { (d.message.id) } } }
                            td { (d.message.destination) }
                            td { (d.message.event_type) }
                            td.n { (d.message.attempts) }
                            td { (time(d.dead_at)) }
                            td { (truncate(&d.reason, REASON_CHARS)) }
                        }
                    }
                }
            }
        }
        @if letters.len() == PAGE {
            @if let Some(last) = letters.last() {
                p { a #next-page href={ (root) "/dead?" (filter.query(&[("after", last.message.id.to_string())])) } { "Next " (PAGE) " →" } }
            }
        }
    };
    layout(base, "Dead letters", body)
}

fn truncate(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// The confirmation of a replay or discard: how many rows it touches, and the same form
/// again, posted to `apply`.
pub(crate) fn confirm(base: &Base, review: &Review, count: u64, csrf: &str) -> Markup {
    let root = &base.0;
    let (verb, action) = match review.change {
        Change::Replay => ("Replay", "replay"),
        Change::Discard => ("Discard", "discard"),
    };
    let scope = if review.ids.is_empty() {
        "all"
    } else {
        "selected"
    };
    let what = if review.ids.is_empty() {
        review.list.describe()
    } else {
        format!("the {} selected", review.ids.len())
    };
    let body = html! {
        p {
            (verb) " " strong #confirm-count { (count) } " dead letter" @if count != 1 { "s" } " (" (what) ")?"
        }
        @if review.change == Change::Discard {
            p.note { "Discarded rows are deleted: nothing can bring them back." }
        } @else {
            p { "They become pending again with their attempts reset, and are published as soon as a relay claims them." }
        }
        form method="post" action={ (root) "/dead/apply" } {
            input type="hidden" name="csrf" value=(csrf);
            input type="hidden" name="do" value={ (action) "-" (scope) };
            @for id in &review.ids { input type="hidden" name="id" value=(id); }
            (filter_fields(&review.list))
            button id="confirm" class=[(review.change == Change::Discard).then_some("danger")] { (verb) " " (count) }
            " "
            a href={ (root) "/dead?" (review.list.query(&[])) } { "Cancel" }
        }
        p { small { "The count is as of now; rows that change meanwhile are included or left out as they then are." } }
    };
    layout(base, &format!("{verb} dead letters"), body)
}

/// One message: every field, and its payload and headers for callers with the token.
pub(crate) fn message(base: &Base, found: &FoundMessage, authorized: bool, csrf: &str) -> Markup {
    let root = &base.0;
    let m = &found.message;
    let row = |name: &str, value: Option<String>| {
        html! {
            tr { th { (name) } td { (value.unwrap_or_else(|| "–".to_owned())) } }
        }
    };
    let body = html! {
        table {
            (row("id", Some(m.id.to_string())))
            (row("status", Some(found.status.to_string())))
            (row("destination", Some(m.destination.clone())))
            (row("event type", Some(m.event_type.clone())))
            (row("idempotency key", Some(m.idempotency_key.clone())))
            (row("aggregate", m.aggregate_type.as_ref().map(|t| format!("{t} {}", m.aggregate_id.as_deref().unwrap_or("")))))
            (row("partition key", m.partition_key.clone()))
            (row("tenant", m.tenant_id.clone()))
            (row("attempts", Some(m.attempts.to_string())))
            (row("created", Some(time(m.created_at))))
            (row("published", found.published_at.map(time)))
            (row("dead since", found.dead_at.map(time)))
            (row("last error", found.last_error.clone()))
        }
        @if found.status == Status::Dead {
            form method="post" action={ (root) "/dead/review" } {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="id" value=(m.id);
                button name="do" value="replay-selected" { "Replay" } " "
                button.danger name="do" value="discard-selected" { "Discard" }
            }
        }
        @if authorized {
            h2 { "Headers" }
            table {
                @for (name, value) in &m.headers { tr { th { (name) } td { code { (value) } } } }
                @if m.headers.is_empty() { tr { td { "none" } } }
            }
            h2 { "Payload" small { " " (m.content_type) ", " (m.payload.len()) " bytes" } }
            @let preview = &m.payload[..m.payload.len().min(PREVIEW_BYTES)];
            @match std::str::from_utf8(preview) {
                Ok(text) => pre #payload { (text) },
                Err(_) => pre #payload { "binary; the first bytes in hex: " (hex(&preview[..preview.len().min(256)])) },
            }
            @if m.payload.len() > PREVIEW_BYTES {
                p.note { "Only the first " (PREVIEW_BYTES / 1024) " KiB are shown." }
            }
        } @else {
            p.note { "Headers and payload need the dashboard's token." }
        }
    };
    layout(base, "Message", body)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What a lookup found.
pub(crate) fn lookup(base: &Base, key: &str, found: &[FoundMessage]) -> Markup {
    let root = &base.0;
    let body = html! {
        @if key.is_empty() {
            p { "Look a message up by its id or its idempotency key (a key lookup reads the whole table on the SQL stores)." }
        } @else if found.is_empty() {
            p { "No message has the id or idempotency key " code { (key) } "." }
        } @else {
            table {
                thead { tr { th { "id" } th { "status" } th { "destination" } th { "event type" } th { "created" } } }
                tbody {
                    @for f in found {
                        tr {
                            td { a href={ (root) "/messages/" (f.message.id) } { code { (f.message.id) } } }
                            td { (f.status) }
                            td { (f.message.destination) }
                            td { (f.message.event_type) }
                            td { (time(f.message.created_at)) }
                        }
                    }
                }
            }
        }
    };
    layout(base, "Lookup", body)
}
