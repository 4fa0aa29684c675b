//! A webhook as a receiver gets it: hostile `webhook-id`, `webhook-timestamp` and
//! `webhook-signature` headers and body. Nothing may panic; a forged request never
//! passes; and what the sender signs always passes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use outbox_engine::webhooks::{
    HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP, Secret, Verifier, sign, signature_header,
};
use outbox_fuzz::fields;

const NOW: i64 = 1_767_225_600; // 2026-01-01

fuzz_target!(|data: &[u8]| {
    let parts = fields(data, 4);
    let get = |i: usize| parts.get(i).map_or("", String::as_str);
    let (id, timestamp, signatures, body) = (get(0), get(1), get(2), get(3));
    let secret = Secret::from_bytes(&[7; 32]).expect("a 32-byte key");
    let verifier = Verifier::new(vec![secret.clone()]);
    let header = |name: &str| match name {
        HEADER_ID => Some(id),
        HEADER_TIMESTAMP => Some(timestamp),
        HEADER_SIGNATURE => Some(signatures),
        _ => None,
    };
    if let Ok(verified) = verifier.verify(header, body.as_bytes(), NOW) {
        // Passing needs the real tag for exactly what was verified.
        let expected = sign(&secret, id, verified.timestamp, body.as_bytes());
        assert!(
            signatures.split(' ').any(|s| s == expected),
            "a request without the right signature passed: {signatures:?}"
        );
    }
    // The sender's own signature over the same id and body, made now, passes whenever
    // the id can be signed.
    let signed = signature_header(std::slice::from_ref(&secret), id, NOW, body.as_bytes());
    let now = NOW.to_string();
    let honest = |name: &str| match name {
        HEADER_ID => Some(id),
        HEADER_TIMESTAMP => Some(now.as_str()),
        HEADER_SIGNATURE => Some(signed.as_str()),
        _ => None,
    };
    let result = verifier.verify(honest, body.as_bytes(), NOW);
    // (An empty header counts as missing.)
    if !id.is_empty() && outbox_engine::webhooks::is_signable_id(id) {
        assert!(result.is_ok(), "a signed request was refused: {result:?}");
    } else {
        assert!(result.is_err(), "an id that cannot be signed passed");
    }
});
