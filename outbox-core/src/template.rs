//! Names rendered from a message: a stream key, an exchange, a routing key, a topic.
//!
//! Every sink that derives a broker-side name from the message uses this one grammar, so
//! a template written for one broker means the same thing for another.

use std::fmt;

use crate::message::Message;

/// A parsed name template: literal text with placeholders in braces.
///
/// Placeholders: `{destination}`, `{event_type}`, `{partition_key}`, `{tenant_id}`,
/// `{aggregate_type}`. `{{` and `}}` stand for literal braces. A template without
/// placeholders names one fixed thing.
///
/// A message that lacks a field the template needs (no partition key, say) cannot be
/// rendered; sinks fail such a message permanently.
///
/// ```
/// use chrono::Utc;
/// use outbox_engine::NewMessage;
/// use outbox_engine::template::Template;
///
/// let t = Template::parse("{{app}}.{destination}.{partition_key}")?;
/// assert!(!t.is_fixed());
/// let m = NewMessage::builder("orders", "order.paid").partition_key("o-42").build()?.into_message(Utc::now());
/// assert_eq!(t.render(&m).unwrap(), "{app}.orders.o-42");
///
/// assert!(Template::parse("orders").unwrap().is_fixed());
/// assert!(Template::parse("orders.{nope}").is_err());
/// assert!(Template::parse("orders.{event_type").is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    source: String,
    parts: Vec<Part>,
}

/// Why a template does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct TemplateError {
    /// What is wrong, naming the offending placeholder or byte position.
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Field(Field),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Destination,
    EventType,
    PartitionKey,
    TenantId,
    AggregateType,
}

impl Field {
    const ALL: [(&'static str, Field); 5] = [
        ("destination", Field::Destination),
        ("event_type", Field::EventType),
        ("partition_key", Field::PartitionKey),
        ("tenant_id", Field::TenantId),
        ("aggregate_type", Field::AggregateType),
    ];

    fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, field)| *field == self)
            .map_or("?", |(name, _)| name)
    }

    fn value(self, message: &Message) -> Option<&str> {
        match self {
            Field::Destination => Some(&message.destination),
            Field::EventType => Some(&message.event_type),
            Field::PartitionKey => message.partition_key.as_deref(),
            Field::TenantId => message.tenant_id.as_deref(),
            Field::AggregateType => message.aggregate_type.as_deref(),
        }
    }
}

impl Template {
    /// Parses a template. An empty template is allowed (it renders as the empty string,
    /// which some brokers give a meaning, such as AMQP's default exchange).
    ///
    /// # Errors
    ///
    /// A [`TemplateError`] for control characters, an unknown placeholder, or an
    /// unmatched brace.
    pub fn parse(template: &str) -> Result<Self, TemplateError> {
        let fail = |reason: String| TemplateError { reason };
        if template.chars().any(char::is_control) {
            return Err(fail("must not contain control characters".to_owned()));
        }
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = template.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            match c {
                '{' if chars.peek().map(|(_, c)| *c) == Some('{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek().map(|(_, c)| *c) == Some('}') => {
                    chars.next();
                    literal.push('}');
                }
                '{' => {
                    let rest = &template[at + 1..];
                    let Some(end) = rest.find('}') else {
                        return Err(fail(format!(
                            "unclosed `{{` at byte {at} (write `{{{{` for a literal brace)"
                        )));
                    };
                    let name = &rest[..end];
                    let Some((_, field)) = Field::ALL.iter().find(|(n, _)| *n == name) else {
                        let known: Vec<String> =
                            Field::ALL.iter().map(|(n, _)| format!("{{{n}}}")).collect();
                        return Err(fail(format!(
                            "unknown placeholder {{{name}}} (known: {})",
                            known.join(", ")
                        )));
                    };
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Field(*field));
                    for _ in 0..name.chars().count() + 1 {
                        chars.next();
                    }
                }
                '}' => {
                    return Err(fail(format!(
                        "unmatched `}}` at byte {at} (write `}}}}` for a literal brace)"
                    )));
                }
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        Ok(Self {
            source: template.to_owned(),
            parts,
        })
    }

    /// The template as written.
    ///
    /// ```
    /// # use outbox_engine::template::Template;
    /// assert_eq!(Template::parse("a.{event_type}")?.as_str(), "a.{event_type}");
    /// # Ok::<(), outbox_engine::template::TemplateError>(())
    /// ```
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The name a fixed template (no placeholders) always renders, with `{{`/`}}`
    /// unescaped; `None` when the template has placeholders.
    ///
    /// ```
    /// # use outbox_engine::template::Template;
    /// assert_eq!(Template::parse("orders.{{v2}}")?.fixed().as_deref(), Some("orders.{v2}"));
    /// assert_eq!(Template::parse("orders.{tenant_id}")?.fixed(), None);
    /// # Ok::<(), outbox_engine::template::TemplateError>(())
    /// ```
    pub fn fixed(&self) -> Option<String> {
        self.parts
            .iter()
            .map(|part| match part {
                Part::Literal(text) => Some(text.as_str()),
                Part::Field(_) => None,
            })
            .collect()
    }

    /// Whether the template has no placeholders.
    ///
    /// ```
    /// # use outbox_engine::template::Template;
    /// assert!(Template::parse("orders.{{v2}}")?.is_fixed());
    /// assert!(!Template::parse("orders.{tenant_id}")?.is_fixed());
    /// # Ok::<(), outbox_engine::template::TemplateError>(())
    /// ```
    pub fn is_fixed(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Literal(_)))
    }

    /// The name for `message`.
    ///
    /// # Errors
    ///
    /// A description of the problem when the message lacks a field the template needs
    /// (an empty value counts as missing).
    pub fn render(&self, message: &Message) -> Result<String, String> {
        let mut name = String::with_capacity(self.source.len() + 32);
        for part in &self.parts {
            match part {
                Part::Literal(text) => name.push_str(text),
                Part::Field(field) => match field.value(message) {
                    Some(value) if !value.is_empty() => name.push_str(value),
                    _ => {
                        return Err(format!(
                            "template {:?} needs {}, which the message does not have",
                            self.source,
                            field.name()
                        ));
                    }
                },
            }
        }
        Ok(name)
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}
