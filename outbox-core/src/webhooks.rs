//! [Standard Webhooks](https://www.standardwebhooks.com/) signing and verification.
//!
//! Everything here is a pure function: no I/O happens and no clock is read. The sender
//! signs `"{msg_id}.{timestamp}.{body}"` with HMAC-SHA256 and sends three headers,
//! [`HEADER_ID`], [`HEADER_TIMESTAMP`] and [`HEADER_SIGNATURE`]. The receiver hands those
//! headers, the raw body and the current unix time to a [`Verifier`].
//!
//! Secrets are written as `whsec_` followed by the standard base64 encoding of the key.
//! Several secrets can be active at once for key rotation: [`signature_header`] emits one
//! signature per secret, and a [`Verifier`] accepts a request if any `v1` signature in the
//! header matches any of its secrets.
//!
//! # Example
//!
//! ```
//! use outbox_engine::webhooks::{
//!     HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP, Secret, Verifier, signature_header,
//! };
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let secret: Secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".parse()?;
//! let body = br#"{"type":"order.created","id":42}"#;
//! let timestamp = 1_700_000_000;
//!
//! // Sender side.
//! let signature = signature_header(std::slice::from_ref(&secret), "msg_1", timestamp, body);
//! let headers = [
//!     (HEADER_ID, "msg_1"),
//!     (HEADER_TIMESTAMP, "1700000000"),
//!     (HEADER_SIGNATURE, signature.as_str()),
//! ];
//!
//! // Receiver side, ten seconds later.
//! let verifier = Verifier::new(vec![secret]);
//! let lookup = |name: &str| headers.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
//! let webhook = verifier.verify(lookup, body, timestamp + 10)?;
//! assert_eq!(webhook.id, "msg_1");
//! assert_eq!(webhook.timestamp, timestamp);
//!
//! // A tampered body is rejected.
//! assert!(verifier.verify(lookup, b"{}", timestamp + 10).is_err());
//! # Ok(())
//! # }
//! ```

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};
use sha2::Sha256;
use subtle::{Choice, ConstantTimeEq};

/// Name of the header carrying the unique message id.
pub const HEADER_ID: &str = "webhook-id";
/// Name of the header carrying the send time as integer unix seconds.
pub const HEADER_TIMESTAMP: &str = "webhook-timestamp";
/// Name of the header carrying the space-separated `version,base64` signatures.
pub const HEADER_SIGNATURE: &str = "webhook-signature";
/// The outbox message id, which the HTTP sink sends next to the signed headers (not
/// covered by the signature).
pub const HEADER_MESSAGE_ID: &str = "outbox-message-id";
/// The event type the HTTP sink sends (not covered by the signature).
pub const HEADER_EVENT_TYPE: &str = "outbox-event-type";
/// The attempt number the HTTP sink sends, from 1 (not covered by the signature).
pub const HEADER_ATTEMPT: &str = "outbox-attempt";

/// Prefix of a serialized secret.
pub const SECRET_PREFIX: &str = "whsec_";
/// Default maximum distance between the webhook timestamp and `now`, in seconds.
pub const DEFAULT_TOLERANCE_SECS: i64 = 300;
/// Longest signature header (in bytes) that [`Verifier::verify`] will look at.
pub const MAX_SIGNATURE_HEADER_LEN: usize = 8 * 1024;
/// Largest number of space-separated signature entries [`Verifier::verify`] will look at.
pub const MAX_SIGNATURES: usize = 64;

type HmacSha256 = Hmac<Sha256>;

/// Length of an HMAC-SHA256 tag in bytes.
const TAG_LEN: usize = 32;
/// Length of the padded standard base64 encoding of a [`TAG_LEN`]-byte tag.
const TAG_B64_LEN: usize = 44;

/// An HMAC signing key.
///
/// The `Debug` implementation never prints the key material.
#[derive(Clone)]
pub struct Secret {
    key: Vec<u8>,
}

impl Secret {
    /// Parses a `whsec_`-prefixed, standard-alphabet, padded base64 secret.
    ///
    /// The input is taken as-is: surrounding whitespace is not trimmed.
    pub fn parse(s: &str) -> Result<Self, SecretError> {
        let encoded = s
            .strip_prefix(SECRET_PREFIX)
            .ok_or(SecretError::MissingPrefix)?;
        if encoded.is_empty() {
            return Err(SecretError::Empty);
        }
        // The decode error is dropped on purpose: its message can quote a byte of the input.
        let key = BASE64
            .decode(encoded)
            .map_err(|_| SecretError::InvalidBase64)?;
        Self::from_bytes(&key)
    }

    /// Wraps a raw key. An empty key, or one shorter than [`MIN_SECRET_BYTES`], is
    /// rejected.
    pub fn from_bytes(key: &[u8]) -> Result<Self, SecretError> {
        if key.is_empty() {
            return Err(SecretError::Empty);
        }
        if key.len() < MIN_SECRET_BYTES {
            return Err(SecretError::TooShort);
        }
        Ok(Self { key: key.to_vec() })
    }

    fn mac(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> [u8; TAG_LEN] {
        let mut mac =
            HmacSha256::new_from_slice(&self.key).expect("HMAC accepts keys of any length");
        mac.update(msg_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac.finalize().into_bytes().into()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl FromStr for Secret {
    type Err = SecretError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Why a secret could not be parsed. Messages never include the secret itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// The string does not start with `whsec_`.
    #[error("webhook secret must start with `whsec_`")]
    MissingPrefix,
    /// The part after the prefix is not valid padded standard base64.
    #[error("webhook secret is not valid base64")]
    InvalidBase64,
    /// The key is empty.
    #[error("webhook secret is empty")]
    Empty,
    /// The key is shorter than [`MIN_SECRET_BYTES`]; such a key can be guessed.
    #[error(
        "webhook secret is too short: the key must be at least {MIN_SECRET_BYTES} bytes (generate 24 or more random bytes)"
    )]
    TooShort,
    /// No secret was given where at least one is needed.
    #[error("no webhook secrets: at least one is needed to verify requests")]
    NoSecrets,
}

/// The shortest key [`Secret`] accepts, in bytes (128 bits). Standard Webhooks providers
/// issue 24 to 64 random bytes.
pub const MIN_SECRET_BYTES: usize = 16;

/// Signs one message, returning `v1,<base64 HMAC-SHA256 of "{msg_id}.{timestamp}.{body}">`.
///
/// `msg_id` must pass [`is_signable_id`] (no `.`; [`webhook_id`] makes one of any
/// idempotency key); verifiers refuse other ids.
pub fn sign(secret: &Secret, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
    let tag = secret.mac(msg_id, timestamp, body);
    format!("v1,{}", BASE64.encode(tag))
}

/// Builds a `webhook-signature` value: one space-separated signature per secret.
///
/// Returns an empty string when `secrets` is empty.
pub fn signature_header(secrets: &[Secret], msg_id: &str, timestamp: i64, body: &[u8]) -> String {
    secrets
        .iter()
        .map(|secret| sign(secret, msg_id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The identity of a webhook whose signature and timestamp checked out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifiedWebhook<'a> {
    /// The `webhook-id` header value; use it to deduplicate deliveries.
    pub id: &'a str,
    /// The `webhook-timestamp` header value, in unix seconds.
    pub timestamp: i64,
}

/// Why a webhook was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// The verifier was built without any secret, so it rejects every request.
    #[error("webhook verifier has no secrets configured")]
    NoSecrets,
    /// A required header is absent or empty; holds the header name.
    #[error("missing `{0}` header")]
    MissingHeader(&'static str),
    /// `webhook-timestamp` is not a non-negative integer number of seconds.
    #[error("invalid `webhook-timestamp` header")]
    InvalidTimestamp,
    /// The timestamp is further in the past than the tolerance allows.
    #[error("webhook timestamp is too old")]
    TimestampTooOld,
    /// The timestamp is further in the future than the tolerance allows.
    #[error("webhook timestamp is too far in the future")]
    TimestampInFuture,
    /// `webhook-id` contains a `.`. The signed content is `{id}.{timestamp}.{body}`, so a
    /// dot in the id would let one signature verify for a different split of id,
    /// timestamp and body; ids with dots are refused when signing too.
    #[error("invalid `webhook-id` header: it must not contain `.`")]
    InvalidId,
    /// `webhook-signature` exceeds [`MAX_SIGNATURE_HEADER_LEN`] bytes or
    /// [`MAX_SIGNATURES`] entries.
    #[error("`webhook-signature` header is too large")]
    SignatureHeaderTooLarge,
    /// No `v1` signature matched any secret. This includes a header with no
    /// well-formed `v1` entry at all.
    #[error("no matching webhook signature")]
    NoMatchingSignature,
}

/// Checks incoming webhooks against one or more secrets.
#[derive(Debug, Clone)]
pub struct Verifier {
    secrets: Vec<Secret>,
    tolerance_secs: i64,
}

impl Verifier {
    /// Creates a verifier accepting signatures from any of `secrets`, with a 300 s tolerance.
    ///
    /// With no secrets every request fails with [`VerifyError::NoSecrets`].
    pub fn new(secrets: Vec<Secret>) -> Self {
        Self {
            secrets,
            tolerance_secs: DEFAULT_TOLERANCE_SECS,
        }
    }

    /// Sets how far the timestamp may be from `now`, in either direction.
    ///
    /// Sub-second parts are ignored; a difference of exactly the tolerance is accepted.
    #[must_use]
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance_secs = i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX);
        self
    }

    /// Verifies a webhook.
    ///
    /// `header` looks a header up by its lowercase name (for example [`HEADER_ID`]) and
    /// returns its value; an empty value counts as missing. `body` is the raw request body
    /// and `now` the current unix time in seconds.
    ///
    /// Signature entries whose version is not `v1`, or which are malformed, are skipped.
    /// The request passes if any `v1` signature equals the HMAC for any secret; the tags are
    /// compared in constant time.
    pub fn verify<'a>(
        &self,
        header: impl Fn(&str) -> Option<&'a str>,
        body: &[u8],
        now: i64,
    ) -> Result<VerifiedWebhook<'a>, VerifyError> {
        if self.secrets.is_empty() {
            return Err(VerifyError::NoSecrets);
        }
        let required = |name: &'static str| {
            header(name)
                .filter(|v| !v.is_empty())
                .ok_or(VerifyError::MissingHeader(name))
        };
        let id = required(HEADER_ID)?;
        if !is_signable_id(id) {
            return Err(VerifyError::InvalidId);
        }
        let raw_timestamp = required(HEADER_TIMESTAMP)?;
        let signatures = required(HEADER_SIGNATURE)?;

        let timestamp = parse_timestamp(raw_timestamp)?;
        // Widened so that no combination of `now` and `timestamp` can overflow.
        let age = i128::from(now) - i128::from(timestamp);
        let tolerance = i128::from(self.tolerance_secs);
        if age > tolerance {
            return Err(VerifyError::TimestampTooOld);
        }
        if age < -tolerance {
            return Err(VerifyError::TimestampInFuture);
        }

        let candidates = parse_v1_signatures(signatures)?;
        if candidates.is_empty() {
            return Err(VerifyError::NoMatchingSignature);
        }

        // Every (signature, secret) pair is compared so timing does not reveal which matched.
        let mut matched = Choice::from(0);
        for secret in &self.secrets {
            let expected = secret.mac(id, timestamp, body);
            for candidate in &candidates {
                matched |= candidate.ct_eq(&expected);
            }
        }
        if bool::from(matched) {
            Ok(VerifiedWebhook { id, timestamp })
        } else {
            Err(VerifyError::NoMatchingSignature)
        }
    }
}

/// What [`webhook_id`] writes as `%XX`: `.`, the separator of the signed content; `%`, so
/// that the encoding can be undone; and what an HTTP header value cannot carry as it is
/// (space, which parsers trim at the ends, control characters and non-ASCII bytes).
const ID_ESCAPES: &AsciiSet = &CONTROLS.add(b' ').add(b'%').add(b'.');

/// The `webhook-id` that carries an idempotency key: the key with `.`, `%`, spaces,
/// control characters and non-ASCII bytes percent-encoded, so that every key can be
/// signed. Most keys come out unchanged; [`idempotency_key`] undoes it.
///
/// ```
/// use outbox_engine::webhooks::{idempotency_key, webhook_id};
///
/// assert_eq!(webhook_id("0190f0a4-6b1c-7cc2-9a55-1f0e1d2c3b4a"), "0190f0a4-6b1c-7cc2-9a55-1f0e1d2c3b4a");
/// assert_eq!(webhook_id("order-42.paid"), "order-42%2Epaid");
/// assert_eq!(idempotency_key("order-42%2Epaid"), "order-42.paid");
/// ```
pub fn webhook_id(key: &str) -> Cow<'_, str> {
    utf8_percent_encode(key, ID_ESCAPES).into()
}

/// The idempotency key a `webhook-id` made by [`webhook_id`] carries. An id that holds no
/// `%` is the key itself; invalid UTF-8 after decoding is replaced, never an error.
pub fn idempotency_key(webhook_id: &str) -> Cow<'_, str> {
    percent_decode_str(webhook_id).decode_utf8_lossy()
}

/// Whether `id` can be a `webhook-id`: it must not contain `.`, the separator of the
/// signed content `{id}.{timestamp}.{body}`. [`Verifier::verify`] refuses other ids, and
/// senders must not sign them; [`webhook_id`] turns any idempotency key into one.
///
/// ```
/// assert!(outbox_engine::webhooks::is_signable_id("0190f0a4-6b1c-7cc2-9a55-1f0e1d2c3b4a"));
/// assert!(!outbox_engine::webhooks::is_signable_id("order.42"));
/// ```
pub fn is_signable_id(id: &str) -> bool {
    !id.contains('.')
}

/// Accepts only plain ASCII digits that fit in an `i64`.
fn parse_timestamp(raw: &str) -> Result<i64, VerifyError> {
    if !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(VerifyError::InvalidTimestamp);
    }
    raw.parse().map_err(|_| VerifyError::InvalidTimestamp)
}

/// Extracts the decoded tags of all well-formed `v1` entries, enforcing the size caps.
fn parse_v1_signatures(header: &str) -> Result<Vec<[u8; TAG_LEN]>, VerifyError> {
    if header.len() > MAX_SIGNATURE_HEADER_LEN {
        return Err(VerifyError::SignatureHeaderTooLarge);
    }
    let mut tags = Vec::new();
    for (index, entry) in header.split(' ').filter(|e| !e.is_empty()).enumerate() {
        if index >= MAX_SIGNATURES {
            return Err(VerifyError::SignatureHeaderTooLarge);
        }
        let Some(("v1", encoded)) = entry.split_once(',') else {
            continue;
        };
        if encoded.len() != TAG_B64_LEN {
            continue;
        }
        let Ok(decoded) = BASE64.decode(encoded) else {
            continue;
        };
        if let Ok(tag) = <[u8; TAG_LEN]>::try_from(decoded) {
            tags.push(tag);
        }
    }
    Ok(tags)
}

#[cfg(test)]
mod tests {
    use super::*;

    const REF_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const REF_ID: &str = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk";
    const REF_TS: i64 = 1_649_367_553;
    const REF_BODY: &[u8] = br#"{"email":"test@example.com","username":"test_user"}"#;
    const REF_SIG: &str = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=";

    fn secret(byte: u8) -> Secret {
        Secret::from_bytes(&[byte; 24]).unwrap()
    }

    fn verify_with(
        verifier: &Verifier,
        id: Option<&str>,
        ts: Option<&str>,
        sig: Option<&str>,
        body: &[u8],
        now: i64,
    ) -> Result<(), VerifyError> {
        let lookup = |name: &str| match name {
            HEADER_ID => id,
            HEADER_TIMESTAMP => ts,
            HEADER_SIGNATURE => sig,
            _ => None,
        };
        verifier.verify(lookup, body, now).map(|_| ())
    }

    fn ref_verify(
        verifier: &Verifier,
        sig: &str,
        body: &[u8],
        now: i64,
    ) -> Result<(), VerifyError> {
        let ts = REF_TS.to_string();
        verify_with(verifier, Some(REF_ID), Some(&ts), Some(sig), body, now)
    }

    fn ref_verifier() -> Verifier {
        Verifier::new(vec![Secret::parse(REF_SECRET).unwrap()])
    }

    #[test]
    fn reference_vector_signs() {
        let secret = Secret::parse(REF_SECRET).unwrap();
        assert_eq!(sign(&secret, REF_ID, REF_TS, REF_BODY), REF_SIG);
        assert_eq!(
            signature_header(&[secret], REF_ID, REF_TS, REF_BODY),
            REF_SIG
        );
    }

    #[test]
    fn reference_vector_verifies() {
        let verifier = ref_verifier();
        let ts = REF_TS.to_string();
        let headers = [
            (HEADER_ID, REF_ID),
            (HEADER_TIMESTAMP, ts.as_str()),
            (HEADER_SIGNATURE, REF_SIG),
        ];
        let lookup = |name: &str| headers.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
        let webhook = verifier.verify(lookup, REF_BODY, REF_TS).unwrap();
        assert_eq!(
            webhook,
            VerifiedWebhook {
                id: REF_ID,
                timestamp: REF_TS
            }
        );
    }

    #[test]
    fn from_str_matches_parse() {
        let secret: Secret = REF_SECRET.parse().unwrap();
        assert_eq!(sign(&secret, REF_ID, REF_TS, REF_BODY), REF_SIG);
    }

    /// Checks that `v` accepts the reference signature up to `seconds` either side of its
    /// timestamp and refuses it one second further out, naming the side.
    fn assert_window(v: &Verifier, seconds: i64) {
        let at = |now| ref_verify(v, REF_SIG, REF_BODY, now);
        assert_eq!(at(REF_TS + seconds), Ok(()));
        assert_eq!(at(REF_TS - seconds), Ok(()));
        assert_eq!(at(REF_TS + seconds + 1), Err(VerifyError::TimestampTooOld));
        assert_eq!(
            at(REF_TS - seconds - 1),
            Err(VerifyError::TimestampInFuture)
        );
    }

    #[test]
    fn default_tolerance_boundaries() {
        assert_window(&ref_verifier(), 300);
    }

    #[test]
    fn custom_tolerance() {
        assert_window(&ref_verifier().tolerance(Duration::from_secs(10)), 10);

        let wide = ref_verifier().tolerance(Duration::from_secs(3600));
        assert_eq!(ref_verify(&wide, REF_SIG, REF_BODY, REF_TS + 3600), Ok(()));
        let huge = ref_verifier().tolerance(Duration::MAX);
        assert_eq!(ref_verify(&huge, REF_SIG, REF_BODY, i64::MAX), Ok(()));
        assert_eq!(ref_verify(&huge, REF_SIG, REF_BODY, 0), Ok(()));
    }

    #[test]
    fn extreme_now_does_not_overflow() {
        let v = ref_verifier();
        assert_eq!(
            ref_verify(&v, REF_SIG, REF_BODY, i64::MAX),
            Err(VerifyError::TimestampTooOld)
        );
        assert_eq!(
            ref_verify(&v, REF_SIG, REF_BODY, i64::MIN),
            Err(VerifyError::TimestampInFuture)
        );
    }

    #[test]
    fn one_valid_among_many() {
        let v = ref_verifier();
        let other = sign(&secret(7), REF_ID, REF_TS, REF_BODY);
        let v2 = REF_SIG.replacen("v1", "v2", 1);
        let header = format!(
            "  garbage v1 v1, v1,!!!notbase64!!! v1,AAAA {other} {v2} v1a,{}  {REF_SIG} trailing,",
            &REF_SIG[3..]
        );
        assert_eq!(ref_verify(&v, &header, REF_BODY, REF_TS), Ok(()));
    }

    #[test]
    fn only_non_v1_or_garbage_fails() {
        let v = ref_verifier();
        let v2 = REF_SIG.replacen("v1", "v2", 1);
        assert_eq!(
            ref_verify(&v, &v2, REF_BODY, REF_TS),
            Err(VerifyError::NoMatchingSignature)
        );
        assert_eq!(
            ref_verify(&v, "garbage", REF_BODY, REF_TS),
            Err(VerifyError::NoMatchingSignature)
        );
        assert_eq!(
            ref_verify(&v, "   ", REF_BODY, REF_TS),
            Err(VerifyError::NoMatchingSignature)
        );
    }

    #[test]
    fn rotation() {
        let old = secret(1);
        let new = secret(2);
        let header = signature_header(&[old.clone(), new.clone()], "msg_rot", 1000, b"body");
        assert_eq!(header.split(' ').count(), 2);
        for verifier in [Verifier::new(vec![new]), Verifier::new(vec![old])] {
            let r = verify_with(
                &verifier,
                Some("msg_rot"),
                Some("1000"),
                Some(&header),
                b"body",
                1000,
            );
            assert_eq!(r, Ok(()));
        }
        let unrelated = Verifier::new(vec![secret(3)]);
        let r = verify_with(
            &unrelated,
            Some("msg_rot"),
            Some("1000"),
            Some(&header),
            b"body",
            1000,
        );
        assert_eq!(r, Err(VerifyError::NoMatchingSignature));
    }

    #[test]
    fn verifier_with_several_secrets() {
        let verifier = Verifier::new(vec![
            secret(1),
            Secret::parse(REF_SECRET).unwrap(),
            secret(3),
        ]);
        assert_eq!(ref_verify(&verifier, REF_SIG, REF_BODY, REF_TS), Ok(()));
    }

    #[test]
    fn missing_headers() {
        let v = ref_verifier();
        let ts = REF_TS.to_string();
        let (id, ts, sig) = (Some(REF_ID), Some(ts.as_str()), Some(REF_SIG));
        assert_eq!(
            verify_with(&v, None, ts, sig, REF_BODY, REF_TS),
            Err(VerifyError::MissingHeader(HEADER_ID))
        );
        assert_eq!(
            verify_with(&v, id, None, sig, REF_BODY, REF_TS),
            Err(VerifyError::MissingHeader(HEADER_TIMESTAMP))
        );
        assert_eq!(
            verify_with(&v, id, ts, None, REF_BODY, REF_TS),
            Err(VerifyError::MissingHeader(HEADER_SIGNATURE))
        );
        assert_eq!(
            verify_with(&v, Some(""), ts, sig, REF_BODY, REF_TS),
            Err(VerifyError::MissingHeader(HEADER_ID))
        );
        let err = verify_with(&v, id, ts, None, REF_BODY, REF_TS).unwrap_err();
        assert!(err.to_string().contains("webhook-signature"));
    }

    #[test]
    fn invalid_timestamps() {
        let v = ref_verifier();
        for bad in [
            "abc",
            "1649367553.0",
            "+1649367553",
            "-1",
            " 1649367553",
            "99999999999999999999",
        ] {
            assert_eq!(
                verify_with(&v, Some(REF_ID), Some(bad), Some(REF_SIG), REF_BODY, REF_TS),
                Err(VerifyError::InvalidTimestamp),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn tampered_body_fails() {
        let v = ref_verifier();
        let body = br#"{"email":"evil@example.com","username":"test_user"}"#;
        assert_eq!(
            ref_verify(&v, REF_SIG, body, REF_TS),
            Err(VerifyError::NoMatchingSignature)
        );
    }

    #[test]
    fn tampered_id_or_timestamp_fails() {
        let v = ref_verifier();
        let ts = REF_TS.to_string();
        assert_eq!(
            verify_with(
                &v,
                Some("msg_other"),
                Some(&ts),
                Some(REF_SIG),
                REF_BODY,
                REF_TS
            ),
            Err(VerifyError::NoMatchingSignature)
        );
        let ts1 = (REF_TS + 1).to_string();
        assert_eq!(
            verify_with(
                &v,
                Some(REF_ID),
                Some(&ts1),
                Some(REF_SIG),
                REF_BODY,
                REF_TS
            ),
            Err(VerifyError::NoMatchingSignature)
        );
    }

    #[test]
    fn wrong_secret_fails() {
        let v = Verifier::new(vec![secret(9)]);
        assert_eq!(
            ref_verify(&v, REF_SIG, REF_BODY, REF_TS),
            Err(VerifyError::NoMatchingSignature)
        );
    }

    #[test]
    fn no_secrets_rejects_everything() {
        let v = Verifier::new(Vec::new());
        assert_eq!(
            ref_verify(&v, REF_SIG, REF_BODY, REF_TS),
            Err(VerifyError::NoSecrets)
        );
        assert_eq!(signature_header(&[], REF_ID, REF_TS, REF_BODY), "");
    }

    #[test]
    fn oversized_signature_header() {
        let v = ref_verifier();
        let too_many = std::iter::repeat_n("x", MAX_SIGNATURES)
            .chain([REF_SIG])
            .collect::<Vec<_>>();
        assert_eq!(
            ref_verify(&v, &too_many.join(" "), REF_BODY, REF_TS),
            Err(VerifyError::SignatureHeaderTooLarge)
        );
        let at_limit = std::iter::repeat_n("x", MAX_SIGNATURES - 1)
            .chain([REF_SIG])
            .collect::<Vec<_>>();
        assert_eq!(
            ref_verify(&v, &at_limit.join(" "), REF_BODY, REF_TS),
            Ok(())
        );

        let too_long = format!("{}{REF_SIG}", " ".repeat(MAX_SIGNATURE_HEADER_LEN));
        assert_eq!(
            ref_verify(&v, &too_long, REF_BODY, REF_TS),
            Err(VerifyError::SignatureHeaderTooLarge)
        );
    }

    #[test]
    fn bad_secret_strings() {
        let cases = [
            (
                "C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
                SecretError::MissingPrefix,
            ),
            (
                "WHSEC_C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
                SecretError::MissingPrefix,
            ),
            (
                "whsec_C2FVsBQI-hrscChlQIMV+b5sSYspob7o",
                SecretError::InvalidBase64,
            ),
            (
                "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7o",
                SecretError::InvalidBase64,
            ),
            (
                "whsec_C2FVsBQIhrscChlQIMV_b5sSYspob7oD",
                SecretError::InvalidBase64,
            ),
            ("whsec_", SecretError::Empty),
            ("whsec_====", SecretError::InvalidBase64),
            ("", SecretError::MissingPrefix),
        ];
        for (input, expected) in cases {
            let err = Secret::parse(input).unwrap_err();
            assert_eq!(err, expected, "{input:?}");
            assert_eq!(input.parse::<Secret>().unwrap_err(), expected);
            let message = err.to_string();
            let payload = input.strip_prefix(SECRET_PREFIX).unwrap_or(input);
            if !payload.is_empty() {
                assert!(!message.contains(payload), "{message:?} leaks {input:?}");
            }
            assert!(
                !message.contains('-') && !message.contains('+'),
                "{message:?}"
            );
        }
        assert_eq!(Secret::from_bytes(&[]).unwrap_err(), SecretError::Empty);
    }

    #[test]
    fn debug_hides_key() {
        let secret = Secret::parse(REF_SECRET).unwrap();
        let key = BASE64.decode(&REF_SECRET[SECRET_PREFIX.len()..]).unwrap();
        for rendered in [
            format!("{secret:?}"),
            format!("{secret:#?}"),
            format!("{:?}", ref_verifier()),
        ] {
            assert!(!rendered.contains("C2FVsBQI"), "{rendered}");
            assert!(
                !rendered.contains(&format!("{:?}", &key[..4])),
                "{rendered}"
            );
        }
        assert_eq!(format!("{secret:?}"), "Secret(..)");
    }
}
