//! Fan-out: one event for several endpoints becomes one outbox row per endpoint, each
//! delivered, retried and dead-lettered on its own.
//!
//! Enqueue the rows together in the transaction of the business change, so either every
//! subscriber gets the event or none does. One slow or failing endpoint then holds up
//! only its own row.

use std::collections::HashSet;

use outbox_engine::{MessageError, MessageId, NewMessage, NewMessageBuilder};

/// Why a fan-out could not be built.
///
/// ```
/// use outbox_sink_http::{FanOutError, fan_out};
///
/// let err = fan_out(["hooks/a", "hooks/a"], "e", |m| m).unwrap_err();
/// assert_eq!(err, FanOutError::DuplicateDestination("hooks/a".to_owned()));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FanOutError {
    /// The same destination was listed twice; it would receive the event twice.
    #[error("destination `{0}` is listed more than once")]
    DuplicateDestination(String),
    /// The message for one destination is invalid.
    #[error("message for destination `{destination}`: {source}")]
    Message {
        /// The destination.
        destination: String,
        /// What is wrong.
        #[source]
        source: MessageError,
    },
}

/// Builds one message per destination for the same event.
///
/// Every row gets its own id, so each is tracked on its own. They share one idempotency
/// key, a fresh UUIDv7 that identifies the event, which endpoints receive as
/// `idempotency-key` and `webhook-id`. `customize` sets everything else (payload,
/// headers, tenant, aggregate, …) and may replace the key, e.g. with
/// [`deterministic_key`](NewMessageBuilder::deterministic_key) so that replaying the
/// same business transition fans out the same keys.
///
/// An empty list of destinations gives no rows (an event nobody subscribed to).
///
/// ```
/// use outbox_sink_http::fan_out;
///
/// let subscribers = ["hooks/acme", "hooks/globex", "hooks/initech"];
/// let rows = fan_out(subscribers, "invoice.paid", |m| {
///     m.json(&serde_json::json!({ "invoice": 42 })).tenant_id("t-1")
/// })?;
/// assert_eq!(rows.len(), 3);
/// assert_eq!(rows[1].destination(), "hooks/globex");
/// assert_ne!(rows[0].id(), rows[1].id());
/// assert_eq!(rows[0].idempotency_key(), rows[2].idempotency_key());
/// // Then, in your transaction: `outbox.enqueue_all(&mut tx, &rows).await?`.
/// # Ok::<(), outbox_sink_http::FanOutError>(())
/// ```
///
/// # Errors
///
/// [`FanOutError::DuplicateDestination`] when a destination repeats, or
/// [`FanOutError::Message`] naming the destination whose message failed validation.
pub fn fan_out<D: AsRef<str>>(
    destinations: impl IntoIterator<Item = D>,
    event_type: &str,
    customize: impl Fn(NewMessageBuilder) -> NewMessageBuilder,
) -> Result<Vec<NewMessage>, FanOutError> {
    let event_key = MessageId::new().to_string();
    let mut seen = HashSet::new();
    let mut rows = Vec::new();
    for destination in destinations {
        let destination = destination.as_ref();
        if !seen.insert(destination.to_owned()) {
            return Err(FanOutError::DuplicateDestination(destination.to_owned()));
        }
        let builder =
            NewMessage::builder(destination, event_type).idempotency_key(event_key.clone());
        let message = customize(builder)
            .build()
            .map_err(|source| FanOutError::Message {
                destination: destination.to_owned(),
                source,
            })?;
        rows.push(message);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    #[test]
    fn one_row_per_destination_sharing_a_key() {
        let rows = fan_out(["a", "b"], "e", |m| m.header("x-a", "1")).unwrap();
        assert_eq!(rows.len(), 2);
        assert_ne!(rows[0].id(), rows[1].id());
        assert_eq!(rows[0].idempotency_key(), rows[1].idempotency_key());
        assert_ne!(rows[0].idempotency_key(), rows[0].id().to_string());
        assert!(
            rows.iter()
                .all(|r| r.headers()["x-a"] == "1" && r.event_type() == "e")
        );
    }

    #[test]
    fn customize_can_set_a_deterministic_key() {
        let ns = Uuid::NAMESPACE_OID;
        let a = fan_out(["a"], "e", |m| {
            m.deterministic_key(ns, &["order-1", "paid"])
        })
        .unwrap();
        let b = fan_out(["a"], "e", |m| {
            m.deterministic_key(ns, &["order-1", "paid"])
        })
        .unwrap();
        assert_eq!(a[0].idempotency_key(), b[0].idempotency_key());
    }

    #[test]
    fn rejects_duplicates_and_names_the_bad_destination() {
        assert_eq!(
            fan_out(["a", "b", "a"], "e", |m| m),
            Err(FanOutError::DuplicateDestination("a".to_owned()))
        );
        let err = fan_out(["ok", "bad dest"], "e", |m| m).unwrap_err();
        assert!(
            matches!(&err, FanOutError::Message { destination, .. } if destination == "bad dest"),
            "{err}"
        );
        assert!(fan_out(Vec::<&str>::new(), "e", |m| m).unwrap().is_empty());
    }
}
