//! The bounds every sized or nested request input is held to, in one place,
//! so that anything the server accepts every runner can decode (prost,
//! Python's upb and protobuf-es all stop at 100 nested messages; a JSON
//! level costs three of them) and every listing can return. A request over
//! a bound is INVALID_ARGUMENT naming the field; an agent's report that
//! must not be refused (a failure, a release: the lease would stay held)
//! has its text cut instead. Free text that people will read is scrubbed of
//! secrets ([`switchyard_core::secrets`]) before it is stored.
//!
//! The limits are documented in `README.md` ("Limits").

use std::collections::{BTreeMap, HashMap};

use serde_json::{Map, Value};
use switchyard_core::{Limits, redact, secrets};

use super::invalid;
use crate::error::Result;

/// Longest placement selector (and GPU selector), in bytes.
pub const MAX_SELECTOR_BYTES: usize = 16 * 1024;
/// Most tags, tolerations, requirements, preferences or capability refs in
/// one placement (selector included), each.
pub const MAX_PLACEMENT_ITEMS: usize = 256;
/// Most operands of one requirement.
pub const MAX_OPERANDS: usize = 1_024;
/// Deepest operand (a scalar is depth 0, an object or array 1, ...).
pub const MAX_OPERAND_DEPTH: usize = 8;
/// Longest tag, toleration, key or name inside a placement, in bytes.
pub const MAX_PLACEMENT_NAME_BYTES: usize = 256;
/// Largest placement, as compact JSON, in bytes.
pub const MAX_PLACEMENT_BYTES: usize = 256 * 1024;
/// Most labels on a task or an agent.
pub const MAX_LABELS: usize = 64;
/// Longest label key, in bytes.
pub const MAX_LABEL_KEY_BYTES: usize = 63;
/// Longest label value, in bytes.
pub const MAX_LABEL_VALUE_BYTES: usize = 256;
/// Longest reason or message a person gives (cancel, drain), in bytes.
pub const MAX_REASON_BYTES: usize = 1_024;
/// Longest failure message an agent reports, in bytes (longer is cut).
pub const MAX_MESSAGE_BYTES: usize = 8 * 1024;
/// Most status reasons, rejections or refusals carried by one agent message.
pub const MAX_REASONS: usize = 32;
/// A failure's details: at most 64 KiB and 8 levels deep (larger is dropped
/// with a note saying so).
pub const DETAILS_LIMITS: Limits = Limits {
    max_serialized_bytes: 64 * 1024,
    max_depth: 8,
    max_key_bytes: 256,
    max_array_items: 1_024,
};
/// Most encoded bytes of the items of one listing page (1 MiB less room for
/// the rest of the response; tasks, agents,
/// history entries, placeable tasks, verdicts): a page is cut at it as well
/// as at its size, and always holds at least one item, so every page fits a
/// client's default 4 MiB limit and a strict 1 MiB one alike.
pub const MAX_PAGE_BYTES: usize = 1024 * 1024 - 4096;

/// How many of `items`, from the first, fit [`MAX_PAGE_BYTES`] (at least
/// one when there is one).
pub fn fitting<M: prost::Message>(items: &[M]) -> usize {
    let mut total = 0usize;
    for (i, item) in items.iter().enumerate() {
        let len = item.encoded_len() + 8; // the field's tag and length
        if i > 0 && total + len > MAX_PAGE_BYTES {
            return i;
        }
        total += len;
    }
    items.len()
}

/// Latest `not_before`, from now: a year and a day.
pub const MAX_NOT_BEFORE_AHEAD_MS: i64 = 366 * 24 * 3_600_000;

/// Refuses `value` over `max` bytes, naming `field`.
pub fn check_len(field: &str, value: &str, max: usize) -> Result<()> {
    if value.len() > max {
        return Err(invalid(
            field,
            &format!("is {} bytes, at most {max} allowed", value.len()),
        ));
    }
    Ok(())
}

/// Refuses a list over `max` items, naming `field`.
pub fn check_count(field: &str, count: usize, max: usize) -> Result<()> {
    if count > max {
        return Err(invalid(
            field,
            &format!("has {count} items, at most {max} allowed"),
        ));
    }
    Ok(())
}

/// A reason a person gave (at most [`MAX_REASON_BYTES`]), scrubbed of secrets.
pub fn reason(field: &str, text: &str) -> Result<String> {
    check_len(field, text, MAX_REASON_BYTES)?;
    Ok(secrets::redact_text(text))
}

/// `text` cut to `max` bytes at a character boundary (with `…` when cut) and
/// scrubbed of secrets: for what an agent reports and must not be refused.
pub fn cut(text: &str, max: usize) -> String {
    let text = if text.len() > max {
        let mut end = max.saturating_sub('…'.len_utf8());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &text[..end])
    } else {
        text.to_owned()
    };
    secrets::redact_text(&text)
}

/// Labels within [`MAX_LABELS`] and the key and value lengths, with every
/// value under a sensitive key or holding a secret redacted.
pub fn labels(field: &str, labels: HashMap<String, String>) -> Result<BTreeMap<String, String>> {
    check_count(field, labels.len(), MAX_LABELS)?;
    for (key, value) in &labels {
        if key.is_empty() {
            return Err(invalid(field, "a label key is empty"));
        }
        // The key itself is not echoed: it may be a hundred kilobytes.
        if key.len() > MAX_LABEL_KEY_BYTES {
            return Err(invalid(
                field,
                &format!(
                    "a label key is {} bytes, at most {MAX_LABEL_KEY_BYTES} allowed",
                    key.len()
                ),
            ));
        }
        check_len(&format!("{field}.{key}"), value, MAX_LABEL_VALUE_BYTES)?;
    }
    let mut doc = Value::Object(
        labels
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect::<Map<_, _>>(),
    );
    redact::redact(&mut doc, &Default::default());
    let Value::Object(map) = doc else {
        unreachable!("an object stays an object")
    };
    Ok(map
        .into_iter()
        .map(|(k, v)| (k, v.as_str().unwrap_or(redact::MARKER).to_owned()))
        .collect())
}

/// The depth of a JSON value: 0 for a scalar, 1 for a container of scalars.
pub fn depth(value: &Value) -> usize {
    match value {
        Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
        Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// The core placement a wire one means, held to the placement bounds (the
/// selectors' lengths before they are parsed).
pub fn wire_placement(
    p: Option<&switchyard_proto::v1::Placement>,
) -> Result<switchyard_core::placement::Placement> {
    if let Some(p) = p {
        check_len("placement.selector", &p.selector, MAX_SELECTOR_BYTES)?;
        if let Some(r) = &p.resources {
            check_len(
                "placement.resources.gpu_selector",
                &r.gpu_selector,
                MAX_SELECTOR_BYTES,
            )?;
        }
    }
    let placement = crate::wire::placement::from_proto(p)?;
    self::placement(&placement)?;
    Ok(placement)
}

/// Holds a placement to the placement bounds.
pub fn placement(p: &switchyard_core::placement::Placement) -> Result<()> {
    const F: &str = "placement";
    check_count(
        "placement.required_tags",
        p.required_tags.len(),
        MAX_PLACEMENT_ITEMS,
    )?;
    check_count(
        "placement.tolerations",
        p.tolerations.len(),
        MAX_PLACEMENT_ITEMS,
    )?;
    check_count(
        "placement.requirements",
        p.requirements.len(),
        MAX_PLACEMENT_ITEMS,
    )?;
    check_count(
        "placement.preferences",
        p.preferences.len(),
        MAX_PLACEMENT_ITEMS,
    )?;
    check_count(
        "placement.capabilities",
        p.capabilities.len(),
        MAX_PLACEMENT_ITEMS,
    )?;
    for (i, tag) in p.required_tags.iter().enumerate() {
        check_len(
            &format!("{F}.required_tags[{i}]"),
            tag,
            MAX_PLACEMENT_NAME_BYTES,
        )?;
    }
    for (i, t) in p.tolerations.iter().enumerate() {
        check_len(
            &format!("{F}.tolerations[{i}]"),
            t,
            MAX_PLACEMENT_NAME_BYTES,
        )?;
    }
    for (i, c) in p.capabilities.iter().enumerate() {
        check_len(
            &format!("{F}.capabilities[{i}].name"),
            &c.name,
            MAX_PLACEMENT_NAME_BYTES,
        )?;
    }
    let requirements = p
        .requirements
        .iter()
        .enumerate()
        .map(|(i, r)| (format!("{F}.requirements[{i}]"), r));
    let preferred =
        p.preferences
            .iter()
            .enumerate()
            .filter_map(|(i, pref)| match &pref.condition {
                switchyard_core::placement::PreferenceCondition::Requirement(r) => {
                    Some((format!("{F}.preferences[{i}].requirement"), r))
                }
                _ => None,
            });
    let gpu = p.resources.iter().flat_map(|r| {
        r.gpu_requirements
            .iter()
            .enumerate()
            .map(|(i, q)| (format!("{F}.resources.gpu_requirements[{i}]"), q))
    });
    for (field, r) in requirements.chain(preferred).chain(gpu) {
        check_len(&format!("{field}.key"), &r.key, MAX_PLACEMENT_NAME_BYTES)?;
        check_count(&format!("{field}.values"), r.values.len(), MAX_OPERANDS)?;
        for (j, v) in r.values.iter().enumerate() {
            if depth(v) > MAX_OPERAND_DEPTH {
                return Err(invalid(
                    &format!("{field}.values[{j}]"),
                    &format!(
                        "nests {} levels, at most {MAX_OPERAND_DEPTH} allowed",
                        depth(v)
                    ),
                ));
            }
        }
    }
    if let Some(r) = &p.resources {
        check_count(
            "placement.resources.named",
            r.named.len(),
            MAX_PLACEMENT_ITEMS,
        )?;
        for name in r.named.keys() {
            check_len("placement.resources.named", name, MAX_PLACEMENT_NAME_BYTES)?;
        }
    }
    if let Some(spread) = &p.spread_by {
        check_len("placement.spread_by", spread, MAX_PLACEMENT_NAME_BYTES)?;
    }
    if let Some(schema) = &p.json_schema
        && let Some(v) = Limits::default().violations(schema).first()
    {
        return Err(invalid(
            &super::field_path("placement.json_schema", &v.path),
            &v.reason,
        ));
    }
    let size = serde_json::to_vec(p).map(|v| v.len()).unwrap_or(usize::MAX);
    if size > MAX_PLACEMENT_BYTES {
        return Err(invalid(
            F,
            &format!("is {size} bytes as JSON, at most {MAX_PLACEMENT_BYTES} allowed"),
        ));
    }
    Ok(())
}

/// A failure's details within [`DETAILS_LIMITS`], redacted; over them, a
/// note of what was dropped (the failure itself is kept).
pub fn details(mut details: Value) -> Value {
    if details.is_null() {
        return details;
    }
    if let Some(v) = DETAILS_LIMITS.violations(&details).first() {
        return serde_json::json!({
            "dropped": format!("the details were over their limit ({v}) and were not kept"),
        });
    }
    redact::redact(&mut details, &Default::default());
    details
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use prost::Message;
    use serde_json::json;
    use switchyard_proto::convert::{json_to_struct, json_to_value};
    use switchyard_proto::v1 as pb;

    /// JSON values up to `depth` containers deep, biased toward objects
    /// (the deepest on the wire: three messages a level, arrays two).
    fn value(depth: u32) -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i32>().prop_map(Value::from),
            "[a-z]{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(depth, 256, 4, |inner| {
            prop_oneof![
                3 => prop::collection::btree_map("[a-z]{1,4}", inner.clone(), 1..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
                1 => prop::collection::vec(inner, 1..4).prop_map(Value::Array),
            ]
        })
    }

    /// A value as deep as `kinds` is long, around the limits: each level an
    /// object (true) or an array (false), with a scalar sibling.
    fn deep_value(levels: std::ops::Range<usize>) -> impl Strategy<Value = Value> {
        prop::collection::vec(any::<bool>(), levels).prop_map(|kinds| {
            kinds.iter().fold(json!("leaf"), |inner, &object| {
                if object {
                    json!({"d": inner, "s": 1})
                } else {
                    json!([inner, 1])
                }
            })
        })
    }

    /// `levels` objects, one inside the other, around a scalar.
    fn chain(levels: usize) -> Value {
        (0..levels).fold(json!(1), |v, _| json!({"d": v}))
    }

    /// A grant carrying `task`, encoded and decoded as a runner would.
    fn grant_decodes(task: pb::Task) -> bool {
        let bytes = pb::ConnectResponse {
            message: Some(pb::connect_response::Message::LeaseGrant(pb::LeaseGrant {
                task: Some(task),
                ..Default::default()
            })),
        }
        .encode_to_vec();
        pb::ConnectResponse::decode(bytes.as_slice()).is_ok()
    }

    fn task_with(payload: &Value, schema: &Value, operand: &Value, details: &Value) -> pb::Task {
        pb::Task {
            payload: Some(json_to_struct(payload)),
            result: Some(json_to_struct(payload)),
            placement: Some(pb::Placement {
                json_schema: Some(json_to_struct(schema)),
                requirements: vec![pb::Requirement {
                    key: "k".into(),
                    operator: pb::Operator::Eq as i32,
                    values: vec![json_to_value(operand)],
                }],
                ..Default::default()
            }),
            error: Some(pb::TaskError {
                details: Some(json_to_struct(details)),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn every_limit_at_once_decodes_and_one_more_level_does_not() {
        let deepest = chain(31); // inside a root object: 32 levels
        let doc = json!({"x": deepest});
        assert!(Limits::default().violations(&doc).is_empty());
        let operand = (0..MAX_OPERAND_DEPTH).fold(json!(1), |v, _| json!({"d": v}));
        assert_eq!(depth(&operand), MAX_OPERAND_DEPTH);
        let details = json!({"x": chain(DETAILS_LIMITS.max_depth - 1)});
        assert!(DETAILS_LIMITS.violations(&details).is_empty());
        assert!(grant_decodes(task_with(&doc, &doc, &operand, &details)));
        // The margin is real: a schema one level deeper than allowed is
        // what the runners could not decode.
        let too_deep = json!({"x": chain(33)});
        assert!(!grant_decodes(task_with(
            &doc, &too_deep, &operand, &details
        )));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Whatever the document limits and the operand bound accept,
        /// wrapped in a task in a grant, decodes with prost's defaults.
        #[test]
        fn accepted_values_decode_in_a_grant(
            payload in prop_oneof![value(34), deep_value(24..36)],
            schema in prop_oneof![value(34), deep_value(24..36)],
            operand in prop_oneof![value(10), deep_value(4..12)],
            details in prop_oneof![value(10), deep_value(4..12)],
        ) {
            let wrap = |v: Value| if v.is_object() { v } else { json!({"v": v}) };
            let (payload, schema, details) = (wrap(payload), wrap(schema), wrap(details));
            prop_assume!(Limits::default().violations(&payload).is_empty());
            prop_assume!(Limits::default().violations(&schema).is_empty());
            prop_assume!(DETAILS_LIMITS.violations(&details).is_empty());
            prop_assume!(depth(&operand) <= MAX_OPERAND_DEPTH);
            prop_assert!(grant_decodes(task_with(&payload, &schema, &operand, &details)));
        }
    }
}
