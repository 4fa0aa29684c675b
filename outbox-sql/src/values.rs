//! How the table's columns hold values, for every backend (sqlx, diesel): durations in
//! milliseconds, ids as text, headers as a JSON object, completions as a status with a
//! delay and an error, and the reasons an unreadable row is dead-lettered with.

use std::time::Duration;

use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, HashSet};

use outbox_engine::{
    Availability, ClaimRequest, CompleteAction, CompleteReport, Completion, DestinationGauges,
    Gauges, Headers, Lease, LeaseToken, Message, MessageId, NewMessage, PublishedRows, Waited,
    WaitedSince,
};

/// A fresh lease for `request`, `lease_ms` from now by this host's clock (the rows'
/// deadline is set by the database's clock; this is the relay's own estimate).
pub fn lease(request: &ClaimRequest, lease_ms: i64) -> (LeaseToken, Lease) {
    let token = LeaseToken::new();
    let lease = Lease {
        owner: request.owner.clone(),
        token,
        until: Utc::now() + chrono::Duration::milliseconds(lease_ms),
    };
    (token, lease)
}

/// Splits completions into those that delete their row (published, in delete mode) and
/// those that update it.
pub fn split_deleted(
    published: PublishedRows,
    completions: &[Completion],
) -> (Vec<&Completion>, Vec<&Completion>) {
    completions
        .iter()
        .partition(|c| published == PublishedRows::Delete && c.action == CompleteAction::Published)
}

/// A completion's delay in milliseconds and the error it records.
pub fn completion_parts(action: &CompleteAction) -> (i64, Option<&str>) {
    match action {
        CompleteAction::Published => (0, None),
        CompleteAction::Retry { delay, error } | CompleteAction::Defer { delay, error } => {
            (millis(*delay), Some(error))
        }
        CompleteAction::Dead { reason } => (0, Some(reason)),
    }
}

/// A duration as whole milliseconds for binding, saturating.
pub fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// When a new message is due: an absolute instant, or a delay from the database's now.
pub fn availability(message: &NewMessage) -> (Option<DateTime<Utc>>, i64) {
    match message.availability() {
        Availability::Now => (None, 0),
        Availability::After(delay) => (None, millis(delay)),
        Availability::At(at) => (Some(at), 0),
    }
}

/// The `headers` column's text.
pub fn headers_json(headers: &Headers) -> String {
    serde_json::to_string(headers).expect("string maps always serialize")
}

/// Reads the `headers` column; the error is a dead-letter reason naming the column.
pub fn headers_from_json(json: &str) -> Result<Headers, String> {
    if json == "{}" {
        // Most rows have no headers: skip the parser.
        return Ok(Headers::new());
    }
    serde_json::from_str(json)
        .map_err(|e| undecodable("headers", format!("not a JSON object of strings ({e})")))
}

/// Sets `message.headers` from the `headers` column's text. With `strict` off, headers
/// that cannot be read are left empty (for listing the dead letters such rows became).
///
/// # Errors
///
/// The dead-letter reason, when `strict` and the text is not a JSON object of strings.
pub fn read_headers(message: &mut Message, json: &str, strict: bool) -> Result<(), String> {
    match headers_from_json(json) {
        Ok(headers) => message.headers = headers,
        Err(reason) if strict => return Err(reason),
        Err(_) => {}
    }
    Ok(())
}

/// The reason a claimed row that cannot be read as a message is dead-lettered with.
pub fn undecodable(column: &str, problem: impl std::fmt::Display) -> String {
    format!("undecodable row: column {column}: {problem}")
}

/// Reads a message id stored as text: only the lowercase hyphenated form the library
/// writes is accepted, because completions find rows by comparing that text.
///
/// # Errors
///
/// The dead-letter reason for any other text.
pub fn stored_id(text: &str) -> Result<MessageId, String> {
    match uuid::Uuid::parse_str(text) {
        Ok(id) if id.hyphenated().to_string() == text => Ok(MessageId::from_uuid(id)),
        _ => Err(undecodable(
            "id",
            format!("{text:?} is not a lowercase hyphenated UUID"),
        )),
    }
}

/// An `attempts` column value as a count (negative values read as 0).
pub fn attempts(value: i64) -> u32 {
    u32::try_from(value.max(0)).unwrap_or(u32::MAX)
}

/// A `COUNT(*)` value (negative values read as 0).
pub fn count(value: i64) -> u64 {
    u64::try_from(value.max(0)).unwrap_or(0)
}

/// A claim's `waited_ms` column (the database's clock: now minus the row's insert or
/// commit) as the wait the relay judges `max_age` by; negative values read as 0.
pub fn waited(ms: i64, since: WaitedSince) -> Waited {
    Waited {
        duration: Duration::from_millis(count(ms)),
        since,
    }
}

/// The numbers the keyed messages of one batch get: one counter bump per distinct key,
/// taken in sorted key order (so two batches take shared keys in the same order), numbers
/// handed out in slice order.
///
/// ```
/// use outbox_engine::NewMessage;
/// use outbox_sql::values::KeyNumbers;
///
/// let keyed = |key| NewMessage::builder("d", "e").partition_key(key).build().unwrap();
/// let unkeyed = NewMessage::builder("d", "e").build().unwrap();
/// let batch = [keyed("b"), keyed("a"), unkeyed, keyed("b")];
/// let mut numbers = KeyNumbers::of(&batch);
/// assert_eq!(numbers.wanted(), [("a", 1), ("b", 2)]);
/// numbers.set_last("a", 7); // the counter of `a` handed out 7
/// numbers.set_last("b", 3); // the counter of `b` handed out 2 and 3
/// assert_eq!(numbers.numbers(&batch), [Some(2), Some(7), None, Some(3)]);
/// ```
#[derive(Debug)]
pub struct KeyNumbers<'a>(BTreeMap<&'a str, (usize, i64)>);

impl<'a> KeyNumbers<'a> {
    /// The keys of `messages`, with how many of them each has.
    pub fn of(messages: &'a [NewMessage]) -> Self {
        let mut per_key: BTreeMap<&str, (usize, i64)> = BTreeMap::new();
        for key in messages.iter().filter_map(NewMessage::partition_key) {
            per_key.entry(key).or_default().0 += 1;
        }
        Self(per_key)
    }

    /// Each distinct key and how many numbers it needs, in sorted key order.
    pub fn wanted(&self) -> Vec<(&'a str, usize)> {
        self.0.iter().map(|(key, (n, _))| (*key, *n)).collect()
    }

    /// Records `last`, the last of the numbers the counter of `key` handed out.
    pub fn set_last(&mut self, key: &str, last: i64) {
        if let Some((n, next)) = self.0.get_mut(key) {
            *next = last - limit(*n) + 1;
        }
    }

    /// Each message's number in slice order; `None` for a message without a key.
    pub fn numbers(mut self, messages: &[NewMessage]) -> Vec<Option<i64>> {
        messages
            .iter()
            .map(|m| {
                let (_, next) = self.0.get_mut(m.partition_key()?)?;
                *next += 1;
                Some(*next - 1)
            })
            .collect()
    }
}

/// A limit for binding, saturating.
pub fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `key` as the text stores keep ids (lowercase, hyphenated) when it is a UUID in any
/// spelling; otherwise `key` itself, which matches no id.
pub fn id_text(key: &str) -> String {
    uuid::Uuid::parse_str(key).map_or_else(|_| key.to_owned(), |id| id.to_string())
}

/// The report of a completion: the `requested` ids whose rows the statement changed
/// (`applied`) count once; the others, and a repeated id, are stale.
pub fn report(
    requested: impl Iterator<Item = MessageId>,
    applied: &HashSet<MessageId>,
) -> CompleteReport {
    let mut report = CompleteReport::default();
    let mut counted = HashSet::with_capacity(applied.len());
    for id in requested {
        if applied.contains(&id) && counted.insert(id) {
            report.applied += 1;
        } else {
            report.stale.push(id);
        }
    }
    report
}

/// The gauges from the three gauge reads: the unfinished rows per destination, the dead
/// ones, and the halted keys; truncated when a read returned `limit` rows.
pub fn gauges(
    unfinished: Vec<DestinationGauges>,
    dead: Vec<(String, u64)>,
    halted: Vec<(String, u64)>,
    limit: usize,
) -> Gauges {
    let mut by_destination: BTreeMap<String, DestinationGauges> = BTreeMap::new();
    let read_unfinished: u64 = unfinished.iter().map(DestinationGauges::backlog).sum();
    for d in unfinished {
        by_destination.insert(d.destination.clone(), d);
    }
    let read_dead: u64 = dead.iter().map(|(_, n)| n).sum();
    for (destination, n) in dead {
        by_destination
            .entry(destination.clone())
            .or_insert_with(|| DestinationGauges::new(destination))
            .dead = n;
    }
    for (destination, keys) in halted {
        if let Some(d) = by_destination.get_mut(&destination) {
            d.halted_keys = keys;
        }
    }
    let limit = u64::try_from(limit).unwrap_or(u64::MAX);
    let mut gauges = Gauges::default();
    gauges.truncated = read_unfinished >= limit || read_dead >= limit;
    gauges.destinations = by_destination.into_values().collect();
    gauges
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_read_only_in_the_form_written() {
        let id = MessageId::new();
        assert_eq!(stored_id(&id.to_string()), Ok(id));
        assert!(stored_id(&id.to_string().to_uppercase()).is_err());
        assert_eq!(id_text(&id.to_string().to_uppercase()), id.to_string());
        assert_eq!(id_text("not-an-id"), "not-an-id");
    }
}
