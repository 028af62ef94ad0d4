//! Fuzzes the selector parser with arbitrary text: it must never panic, its errors must point
//! inside the input at a character boundary, and whatever parses must compile or fail with a
//! field error, then evaluate against a document without panicking.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::json;
use std::sync::Arc;
use switchyard_core::matcher::{self, AgentStatus, AgentView};
use switchyard_core::placement::compile;
use switchyard_core::selector;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match selector::parse(text) {
        Err(e) => {
            assert!(
                e.offset <= text.len(),
                "offset {} past {}",
                e.offset,
                text.len()
            );
            assert!(text.is_char_boundary(e.offset));
            let _ = e.to_string();
        }
        Ok(placement) => {
            let Ok(compiled) = compile(&placement) else {
                return;
            };
            let doc = json!({
                "os": "linux", "arch": "x86_64", "hostname": "build-1", "tags": ["linux", "docker"],
                "software": {"node": {"version": "20.11.1"}}, "memory": {"total": 16384},
                "loadavg": {"1min": 0.5}, "packages": ["git"], "n": null,
                "provides": {"ai.llm": {"version": "1.2.0", "healthy": false, "reason": "missing parameter API_KEY"}}
            });
            let agent = AgentView {
                held: Default::default(),
                kinds: Default::default(),
                agent_id: matcher::AgentId::from_name("a"),
                namespace: "default".into(),
                status: AgentStatus::Ready,
                capacity: 1,
                active_leases: 0,
                last_granted_at_ms: None,
                document: Arc::new(doc),
            };
            let e = matcher::explain(&compiled, "default", std::slice::from_ref(&agent));
            assert_eq!(e.ranked.is_empty(), !compiled.satisfied_by(&agent.document));
            let _ = e.verdicts[0].reason_text();
        }
    }
});
