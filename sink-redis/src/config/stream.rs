//! The stream key template and the longest key it may render.

use outbox_engine::Message;
use outbox_engine::template::Template;

use crate::error::RedisSinkError;

/// The longest stream key a template may render, in bytes.
///
/// ```
/// use outbox_sink_redis::{MAX_STREAM_KEY_BYTES, StreamTemplate};
///
/// assert!(StreamTemplate::parse(&"s".repeat(MAX_STREAM_KEY_BYTES + 1)).is_err());
/// ```
pub const MAX_STREAM_KEY_BYTES: usize = 1024;

/// A parsed stream key template.
///
/// Literal text with placeholders in braces: `{destination}`, `{event_type}`,
/// `{partition_key}`, `{tenant_id}`, `{aggregate_type}`. `{{` and `}}` stand for
/// literal braces (for a Redis Cluster hash tag such as `{{orders}}`). A template without
/// placeholders names one fixed stream.
///
/// A message that lacks a field its template needs (no partition key, say) fails
/// permanently with a [`Config`](outbox_engine::FailureClass::Config) failure; so does a
/// rendered key longer than [`MAX_STREAM_KEY_BYTES`].
///
/// ```
/// use outbox_sink_redis::StreamTemplate;
///
/// let t = StreamTemplate::parse("events.{tenant_id}.{event_type}")?;
/// assert!(t.fixed().is_none());
/// assert_eq!(StreamTemplate::parse("orders").unwrap().fixed().as_deref(), Some("orders"));
/// assert!(StreamTemplate::parse("orders.{nope}").is_err());
/// assert!(StreamTemplate::parse("orders.{event_type").is_err());
/// # Ok::<(), outbox_sink_redis::RedisSinkError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamTemplate(Template);

impl StreamTemplate {
    /// Parses a template.
    ///
    /// # Errors
    ///
    /// [`RedisSinkError::InvalidTemplate`] for an empty or over-long template, control
    /// characters, an unknown placeholder, or an unmatched brace.
    pub fn parse(template: &str) -> Result<Self, RedisSinkError> {
        let fail = |reason: String| RedisSinkError::InvalidTemplate {
            template: template.chars().take(128).collect(),
            reason,
        };
        if template.is_empty() {
            return Err(fail("must not be empty".to_owned()));
        }
        if template.len() > MAX_STREAM_KEY_BYTES {
            return Err(fail(format!(
                "{} bytes, limit is {MAX_STREAM_KEY_BYTES}",
                template.len()
            )));
        }
        Template::parse(template)
            .map(Self)
            .map_err(|e| fail(e.reason))
    }

    /// The template as written.
    ///
    /// ```
    /// # use outbox_sink_redis::StreamTemplate;
    /// assert_eq!(StreamTemplate::parse("a.{event_type}")?.as_str(), "a.{event_type}");
    /// # Ok::<(), outbox_sink_redis::RedisSinkError>(())
    /// ```
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// The one stream key of a template without placeholders, `None` otherwise.
    ///
    /// ```
    /// # use outbox_sink_redis::StreamTemplate;
    /// assert_eq!(StreamTemplate::parse("orders.{{v2}}")?.fixed().as_deref(), Some("orders.{v2}"));
    /// assert_eq!(StreamTemplate::parse("orders.{tenant_id}")?.fixed(), None);
    /// # Ok::<(), outbox_sink_redis::RedisSinkError>(())
    /// ```
    pub fn fixed(&self) -> Option<String> {
        self.0.fixed()
    }

    /// The stream key for `message`.
    ///
    /// ```
    /// use chrono::Utc;
    /// use outbox_engine::NewMessage;
    /// use outbox_sink_redis::StreamTemplate;
    ///
    /// let t = StreamTemplate::parse("{{app}}.{destination}.{partition_key}")?;
    /// let m = NewMessage::builder("orders", "order.paid").partition_key("o-42").build()?.into_message(Utc::now());
    /// assert_eq!(t.render(&m).unwrap(), "{app}.orders.o-42");
    ///
    /// let unkeyed = NewMessage::builder("orders", "order.paid").build()?.into_message(Utc::now());
    /// assert!(t.render(&unkeyed).unwrap_err().contains("partition_key"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// A description of the problem when the message lacks a field the template needs, or
    /// the key would be longer than [`MAX_STREAM_KEY_BYTES`].
    pub fn render(&self, message: &Message) -> Result<String, String> {
        let key = self.0.render(message).map_err(|e| format!("stream {e}"))?;
        if key.len() > MAX_STREAM_KEY_BYTES {
            return Err(format!(
                "stream key rendered from {:?} is {} bytes, limit is {MAX_STREAM_KEY_BYTES}",
                self.0.as_str(),
                key.len()
            ));
        }
        Ok(key)
    }
}
