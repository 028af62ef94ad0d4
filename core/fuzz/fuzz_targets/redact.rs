//! Fuzzes redaction: free text through `secrets::redact_text` and JSON documents through
//! `redact::redact`. Neither may panic; both are idempotent (a second pass changes nothing and
//! reports nothing); redacted text holds no secret of a known shape and a redacted document no
//! string that does.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use std::collections::BTreeSet;
use switchyard_core::{redact, secrets};

fn no_secret_strings(v: &Value) -> bool {
    match v {
        Value::String(s) => !secrets::contains_secret(s),
        Value::Array(items) => items.iter().all(no_secret_strings),
        Value::Object(map) => map.values().all(no_secret_strings),
        _ => true,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let once = secrets::redact_text(text);
    assert_eq!(secrets::redact_text(&once), once, "redact_text is idempotent");
    assert!(!secrets::contains_secret(&once), "a secret is left in {once:?}");
    if let Ok(mut doc) = serde_json::from_str::<Value>(text) {
        let extra: BTreeSet<String> = redact::declared_sensitive(&doc);
        redact::redact(&mut doc, &extra);
        let after = doc.clone();
        assert!(redact::redact(&mut doc, &extra).is_empty(), "redact is idempotent");
        assert_eq!(doc, after);
        assert!(no_secret_strings(&doc), "a secret is left in {doc}");
    }
});
