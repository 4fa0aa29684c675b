//! SQL identifiers that cannot inject SQL.

use std::fmt;

/// A schema, table or index name, validated.
///
/// Two forms are accepted:
/// - **plain**: `^[a-z_][a-z0-9_]{0,62}$`, e.g. `outbox` or `billing_events`;
/// - **quoted**: the name written between double quotes, with any double quote inside
///   doubled, e.g. `"Order Events"` or `"say ""hi"""`. The name inside is used exactly,
///   case and spaces included. It must be 1 to 63 bytes, without control characters,
///   without a leading or trailing space, and only from the Basic Multilingual Plane
///   (MySQL's limit).
///
/// Every dialect writes the name quoted, escaping its own quote character, so a valid
/// [`Ident`] is always one identifier and never more SQL.
///
/// ```
/// use outbox_sql::{Dialect, Ident};
///
/// let plain = Ident::parse("outbox")?;
/// assert_eq!(plain.quoted(Dialect::Postgres), "\"outbox\"");
/// let odd = Ident::parse(r#""Order ""Events""""#)?;
/// assert_eq!(odd.name(), r#"Order "Events""#);
/// assert_eq!(odd.quoted(Dialect::MySql), "`Order \"Events\"`");
/// assert!(Ident::parse("outbox; DROP TABLE users").is_err());
/// assert!(Ident::parse("Outbox").is_err()); // upper case must be quoted
/// # Ok::<(), outbox_sql::IdentError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Ident {
    name: String,
}

/// Why a name is not a valid identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid SQL identifier {shown:?}: {reason}")]
pub struct IdentError {
    shown: String,
    reason: &'static str,
}

impl IdentError {
    fn new(input: &str, reason: &'static str) -> Self {
        Self {
            shown: input.chars().take(80).collect(),
            reason,
        }
    }

    /// Why the name was rejected.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

/// Longest identifier, in bytes (PostgreSQL's limit; MySQL allows 64).
pub const MAX_IDENT_BYTES: usize = 63;

impl Ident {
    /// Validates `input` in plain or quoted form.
    ///
    /// # Errors
    ///
    /// [`IdentError`] saying what is wrong; the input is never used.
    pub fn parse(input: &str) -> Result<Self, IdentError> {
        if let Some(inner) = input.strip_prefix('"') {
            let Some(inner) = inner.strip_suffix('"') else {
                return Err(IdentError::new(
                    input,
                    "a quoted name must end with a double quote",
                ));
            };
            let mut name = String::with_capacity(inner.len());
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                if c == '"' && chars.next() != Some('"') {
                    return Err(IdentError::new(
                        input,
                        "a double quote inside a quoted name must be doubled",
                    ));
                }
                name.push(c);
            }
            Self::check_quoted(input, &name)?;
            return Ok(Self { name });
        }
        let mut bytes = input.bytes();
        let first_ok = matches!(bytes.next(), Some(b'a'..=b'z' | b'_'));
        if !first_ok || !bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_')) {
            return Err(IdentError::new(
                input,
                "use lowercase letters, digits and underscores, starting with a letter or underscore, or quote the name",
            ));
        }
        if input.len() > MAX_IDENT_BYTES {
            return Err(IdentError::new(input, "longer than 63 bytes"));
        }
        Ok(Self {
            name: input.to_owned(),
        })
    }

    fn check_quoted(input: &str, name: &str) -> Result<(), IdentError> {
        if name.is_empty() {
            return Err(IdentError::new(input, "empty name"));
        }
        if name.len() > MAX_IDENT_BYTES {
            return Err(IdentError::new(input, "longer than 63 bytes"));
        }
        if name.chars().any(|c| c.is_control()) {
            return Err(IdentError::new(input, "control characters are not allowed"));
        }
        if name.starts_with(' ') || name.ends_with(' ') {
            return Err(IdentError::new(
                input,
                "leading or trailing spaces are not allowed",
            ));
        }
        if name.chars().any(|c| c as u32 > 0xFFFF) {
            return Err(IdentError::new(
                input,
                "characters outside the Basic Multilingual Plane are not allowed",
            ));
        }
        Ok(())
    }

    /// The name itself (unquoted, unescaped).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name quoted for `dialect`, with its quote character escaped by doubling.
    pub fn quoted(&self, dialect: crate::Dialect) -> String {
        let q = dialect.quote_char();
        let mut out = String::with_capacity(self.name.len() + 2);
        out.push(q);
        for c in self.name.chars() {
            if c == q {
                out.push(q);
            }
            out.push(c);
        }
        out.push(q);
        out
    }

    /// A name derived from this one for an index or constraint: `<name><suffix>`, or, if
    /// that is too long, a shortened name plus a hash of the full name so two long
    /// tables never share index names.
    pub fn derived(&self, suffix: &str) -> Self {
        let full = format!("{}{}", self.name, suffix);
        if full.len() <= MAX_IDENT_BYTES {
            return Self { name: full };
        }
        let hash = format!("_{:08x}", fnv1a(self.name.as_bytes()));
        let room = MAX_IDENT_BYTES - hash.len() - suffix.len();
        let mut cut = room;
        while !self.name.is_char_boundary(cut) {
            cut -= 1;
        }
        Self {
            name: format!("{}{}{}", &self.name[..cut], hash, suffix),
        }
    }
}

fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

impl fmt::Debug for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ident({:?})", self.name)
    }
}

impl fmt::Display for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl std::str::FromStr for Ident {
    type Err = IdentError;
    fn from_str(s: &str) -> Result<Self, IdentError> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Dialect;

    #[test]
    fn plain_names() {
        for ok in ["outbox", "_x", "a1_b2", &"a".repeat(63)] {
            assert_eq!(Ident::parse(ok).unwrap().name(), ok);
        }
        for bad in [
            "",
            "1abc",
            "Outbox",
            "out box",
            "out-box",
            "outbox;",
            "é",
            &"a".repeat(64),
        ] {
            assert!(Ident::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn quoted_names_round_trip_and_escape_per_dialect() {
        let id = Ident::parse(r#""a""b`c""#).unwrap();
        assert_eq!(id.name(), "a\"b`c");
        assert_eq!(id.quoted(Dialect::Postgres), r#""a""b`c""#);
        assert_eq!(id.quoted(Dialect::Sqlite), r#""a""b`c""#);
        assert_eq!(id.quoted(Dialect::MySql), "`a\"b``c`");
        for bad in [
            r#""""#, r#""a"b""#, r#""abc"#, "\"a\0\"", "\" a\"", "\"a \"", "\"😀\"",
        ] {
            assert!(Ident::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn derived_names_stay_short_and_distinct() {
        let a = Ident::parse(&format!("{}a", "x".repeat(62))).unwrap();
        let b = Ident::parse(&format!("{}b", "x".repeat(62))).unwrap();
        let (da, db) = (a.derived("_due_idx"), b.derived("_due_idx"));
        assert!(da.name().len() <= MAX_IDENT_BYTES && db.name().len() <= MAX_IDENT_BYTES);
        assert_ne!(da, db);
        assert_eq!(
            Ident::parse("outbox").unwrap().derived("_due_idx").name(),
            "outbox_due_idx"
        );
        let wide = Ident::parse(&format!("\"{}\"", "é".repeat(31))).unwrap();
        assert!(wide.derived("_due_idx").name().len() <= MAX_IDENT_BYTES);
    }
}
