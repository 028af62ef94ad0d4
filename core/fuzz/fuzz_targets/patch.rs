//! Fuzzes patch application: the input is a held document and a patch as JSON text separated by
//! a NUL byte. Applying must never panic, never modify the held document, and a successful
//! result must be an object within the limits; diffing back to the result must round-trip.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use switchyard_core::diff;
use switchyard_core::limits::Limits;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(2, |b| *b == 0);
    let (Some(doc), Some(patch)) = (parts.next(), parts.next()) else {
        return;
    };
    let Ok(held) = serde_json::from_slice::<Value>(doc) else {
        return;
    };
    let Ok(patch) = serde_json::from_slice::<diff::Patch>(patch) else {
        return;
    };
    let limits = Limits {
        max_serialized_bytes: 64 * 1024,
        max_depth: 16,
        max_key_bytes: 64,
        max_array_items: 256,
    };
    let before = held.clone();
    let result = diff::apply(&held, 3, 3, &patch, &limits);
    assert_eq!(held, before, "apply modified the held document");
    if let Ok(next) = result {
        assert!(next.is_object());
        assert!(limits.violations(&next).is_empty());
        let back = diff::diff(&held, &next);
        assert_eq!(
            diff::apply(&held, 0, 0, &back, &Limits::default()).as_ref(),
            Ok(&next)
        );
    }
});
