//! The measurable targets that are not timings: a refresh of memory and load average
//! must diff to at most 5% of the full SheetBot-shaped document's serialized size.

use serde_json::{Value, json};
use switchyard_core::diff;
use switchyard_core::limits::Limits;
use switchyard_core::tier::{Tier, merge_tiers};

const FIXTURE: &str = include_str!("../../benches/sheetbot_tiers.json");

fn document() -> Value {
    let all: Value = serde_json::from_str(FIXTURE).expect("fixture parses");
    let tiers: Vec<(Tier, Value)> = ["base", "static", "dynamic", "override"]
        .into_iter()
        .map(|t| (t.parse().expect("tier"), all[t].clone()))
        .collect();
    let merged = merge_tiers(&tiers, &Limits::default());
    assert!(merged.rejections.is_empty());
    merged.document
}

#[test]
fn memory_and_loadavg_diff_is_at_most_5_percent() {
    let a = document();
    let mut b = a.clone();
    b["memory"]["free"] = json!(9800);
    b["memory"]["available"] = json!(18944);
    b["loadavg"] = json!({"1min": 2.5, "5min": 1.75, "15min": 1.02});
    let patch = diff::diff(&a, &b);
    let full = serde_json::to_string(&b).expect("serializes").len();
    let size = diff::patch_len(&patch);
    assert!(size * 20 <= full, "diff is {size} bytes of {full}");
    assert_eq!(diff::apply(&a, 1, 1, &patch, &Limits::default()), Ok(b));
}
