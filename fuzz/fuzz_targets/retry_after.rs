//! A `Retry-After` header from a receiver: delay seconds or an HTTP date, read against a
//! clock time taken from the input. Nothing may panic; a number reads as exactly that
//! many seconds (or the longest delay when it does not fit).
#![no_main]

use std::time::{Duration, UNIX_EPOCH};

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((clock, header)) = data.split_first_chunk::<8>() else {
        return;
    };
    // Any time from 1970 to about 2554.
    let now = UNIX_EPOCH + Duration::from_nanos(u64::from_le_bytes(*clock));
    let text = String::from_utf8_lossy(header);
    let parsed = outbox_sink_http::parse_retry_after(&text, now);
    let trimmed = text.trim();
    if !trimmed.is_empty() && trimmed.bytes().all(|b| b.is_ascii_digit()) {
        let seconds = trimmed.parse().unwrap_or(u64::MAX);
        assert_eq!(parsed, Some(Duration::from_secs(seconds)), "{trimmed:?}");
    }
});
