//! The parameters of pages and forms: the filter of `outbox dead list`, under the same
//! names as its flags (`destination`, `event-type`, `error-contains`, `since`, `until`),
//! read from a query string or a form body and written back into links and hidden
//! fields. A parameter a page does not know is refused, so a mistyped filter never
//! widens a list or an action.

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use outbox_engine::{DeadLetterFilter, MessageId};

/// Form or query pairs, in order; names may repeat.
pub(crate) struct Params(Vec<(String, String)>);

impl Params {
    pub(crate) fn parse(raw: &[u8]) -> Self {
        Self(url::form_urlencoded::parse(raw).into_owned().collect())
    }

    /// Every non-empty value of `name`, trimmed.
    pub(crate) fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(n, _)| n == name)
            .map(|(_, v)| v.trim())
            .filter(|v| !v.is_empty())
    }

    /// The first non-empty value of `name`.
    pub(crate) fn one<'a>(&'a self, name: &'a str) -> Option<&'a str> {
        self.all(name).next()
    }

    /// `Err` naming the first parameter that is neither a filter nor in `also`.
    pub(crate) fn only(&self, also: &[&str]) -> Result<(), String> {
        match self
            .0
            .iter()
            .find(|(name, _)| !FILTERS.contains(&name.as_str()) && !also.contains(&name.as_str()))
        {
            Some((name, _)) => Err(format!(
                "unknown parameter {name:?}; the filters are {} (as `outbox dead list` names them)",
                FILTERS.join(", ")
            )),
            None => Ok(()),
        }
    }

    /// The message ids under `name`.
    pub(crate) fn ids(&self, name: &'static str) -> Result<Vec<MessageId>, String> {
        self.all(name).map(message_id).collect()
    }
}

pub(crate) fn message_id(text: &str) -> Result<MessageId, String> {
    uuid::Uuid::parse_str(text)
        .map(MessageId::from)
        .map_err(|_| format!("{text:?} is not a message id"))
}

/// The names of the filter's parameters: the flags of `outbox dead list`.
pub(crate) const FILTERS: &[&str] = &[
    "destination",
    "event-type",
    "error-contains",
    "since",
    "until",
];

/// The filter of the dead-letter and waiting pages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ListFilter {
    pub(crate) destinations: Vec<String>,
    pub(crate) event_types: Vec<String>,
    pub(crate) error: Option<String>,
    pub(crate) since: Option<DateTime<Utc>>,
    pub(crate) until: Option<DateTime<Utc>>,
}

impl ListFilter {
    pub(crate) fn from_params(p: &Params) -> Result<Self, String> {
        Ok(Self {
            destinations: p.all("destination").map(str::to_owned).collect(),
            event_types: p.all("event-type").map(str::to_owned).collect(),
            error: p.one("error-contains").map(str::to_owned),
            since: p.one("since").map(time).transpose()?,
            until: p.one("until").map(time).transpose()?,
        })
    }

    pub(crate) fn to_filter(&self) -> DeadLetterFilter {
        let mut filter = DeadLetterFilter::all().created_between(self.since, self.until);
        filter.destinations.clone_from(&self.destinations);
        filter.event_types.clone_from(&self.event_types);
        filter.error_contains.clone_from(&self.error);
        filter
    }

    /// The filter as `(name, value)` pairs, for links and hidden fields.
    pub(crate) fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs = Vec::new();
        pairs.extend(self.destinations.iter().map(|d| ("destination", d.clone())));
        pairs.extend(self.event_types.iter().map(|e| ("event-type", e.clone())));
        pairs.extend(self.error.iter().map(|e| ("error-contains", e.clone())));
        pairs.extend(self.since.iter().map(|t| ("since", t.to_rfc3339())));
        pairs.extend(self.until.iter().map(|t| ("until", t.to_rfc3339())));
        pairs
    }

    /// The filter plus `extra` as a query string.
    pub(crate) fn query(&self, extra: &[(&str, String)]) -> String {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        for (name, value) in self
            .pairs()
            .iter()
            .map(|(n, v)| (*n, v))
            .chain(extra.iter().map(|(n, v)| (*n, v)))
        {
            query.append_pair(name, value);
        }
        query.finish()
    }

    /// In words, for the confirmation page.
    pub(crate) fn describe(&self) -> String {
        self.describe_as("every dead letter")
    }

    /// In words, `everything` when it filters nothing.
    pub(crate) fn describe_as(&self, everything: &str) -> String {
        let mut parts = Vec::new();
        if !self.destinations.is_empty() {
            parts.push(format!("destination {}", self.destinations.join(" or ")));
        }
        if !self.event_types.is_empty() {
            parts.push(format!("event type {}", self.event_types.join(" or ")));
        }
        if let Some(error) = &self.error {
            parts.push(format!("error containing {error:?}"));
        }
        if let Some(since) = self.since {
            parts.push(format!("created at or after {}", since.to_rfc3339()));
        }
        if let Some(until) = self.until {
            parts.push(format!("created before {}", until.to_rfc3339()));
        }
        if parts.is_empty() {
            everything.to_owned()
        } else {
            parts.join(", ")
        }
    }
}

/// RFC 3339, or a date or a date and time without a zone (what a browser's date inputs
/// send), taken as UTC.
fn time(text: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .or_else(|_| NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M").map(|t| t.and_utc()))
        .or_else(|_| NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S").map(|t| t.and_utc()))
        .or_else(|_| {
            NaiveDate::parse_from_str(text, "%Y-%m-%d")
                .map(|d| d.and_hms_opt(0, 0, 0).expect("midnight").and_utc())
        })
        .map_err(|_| {
            format!("{text:?} is not a time (use 2026-12-02, 2026-12-02T15:04 or RFC 3339)")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_survives_its_own_query_string() {
        let params = Params::parse(
            b"destination=billing&destination=sms&event-type=&error-contains=404+%26+%3Cb%3E&since=2026-12-01&until=2026-12-02T10:30&after=x",
        );
        let filter = ListFilter::from_params(&params).unwrap();
        assert_eq!(filter.destinations, ["billing", "sms"]);
        assert!(filter.event_types.is_empty(), "empty values are no filter");
        assert_eq!(filter.error.as_deref(), Some("404 & <b>"));
        assert_eq!(
            filter.until.unwrap().to_rfc3339(),
            "2026-12-02T10:30:00+00:00"
        );
        let again = ListFilter::from_params(&Params::parse(filter.query(&[]).as_bytes())).unwrap();
        assert_eq!(again, filter);
        let dead = filter.to_filter();
        assert_eq!(dead.destinations, ["billing", "sms"]);
        assert_eq!(dead.error_contains.as_deref(), Some("404 & <b>"));
        assert!(ListFilter::from_params(&Params::parse(b"since=yesterday")).is_err());
        assert_eq!(ListFilter::default().describe(), "every dead letter");
        assert!(params.only(&["after"]).is_ok());
        let old = Params::parse(b"destination=billing&error=404");
        let refused = old.only(&["after"]).unwrap_err();
        assert!(
            refused.starts_with("unknown parameter \"error\""),
            "{refused}"
        );
    }
}
