//! The wire placement to the core's, and back. The selector text is parsed
//! and merged into the structured fields; every problem becomes an
//! [`Error::Invalid`] naming the field (`placement.requirements[2].values`,
//! `placement.selector`) and what was wrong there.

use switchyard_core::placement::{
    self as core, CapabilityRef, Operator, Preference, PreferenceCondition, Requirement,
};
use switchyard_proto::v1 as pb;

use super::convert::{json_to_struct, json_to_value, struct_to_json, value_to_json};
use crate::error::{Error, Result};

/// INVALID_ARGUMENT naming `field`.
fn invalid(field: &str, reason: &str) -> Error {
    Error::invalid(field, reason)
}

fn operator(op: pb::Operator) -> Option<Operator> {
    // The wire name minus its prefix is the core's name (EQ, CONTAINS_ANY, …).
    op.as_str_name().strip_prefix("OPERATOR_")?.parse().ok()
}

fn wire_operator(op: Operator) -> pb::Operator {
    pb::Operator::from_str_name(&format!("OPERATOR_{}", op.as_str()))
        .unwrap_or(pb::Operator::Unspecified)
}

fn requirement(req: &pb::Requirement, field: &str) -> Result<Requirement> {
    let op = pb::Operator::try_from(req.operator)
        .ok()
        .and_then(operator)
        .ok_or_else(|| {
            invalid(
                &format!("{field}.operator"),
                &format!("unknown or unset operator {}", req.operator),
            )
        })?;
    let values = req
        .values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            value_to_json(v, "").map_err(|e| invalid(&format!("{field}.values[{i}]"), e.reason))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Requirement::new(req.key.clone(), op, values))
}

/// The core resource request a wire one means (its GPU selector parsed into requirements).
fn resources(r: &pb::ResourceRequest) -> Result<core::ResourceRequest> {
    let mut gpu_requirements = r
        .gpu_requirements
        .iter()
        .enumerate()
        .map(|(i, q)| requirement(q, &format!("placement.resources.gpu_requirements[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    if !r.gpu_selector.trim().is_empty() {
        let parsed = switchyard_core::selector::parse(&r.gpu_selector)
            .map_err(|err| invalid("placement.resources.gpu_selector", &err.to_string()))?;
        if !parsed.required_tags.is_empty()
            || !parsed.capabilities.is_empty()
            || !parsed.preferences.is_empty()
            || !parsed.tolerations.is_empty()
            || parsed.resources.is_some()
        {
            return Err(invalid(
                "placement.resources.gpu_selector",
                "holds only requirements on GPU fields (memory_mb>=40000, model~H100)",
            ));
        }
        gpu_requirements.extend(parsed.requirements);
    }
    Ok(core::ResourceRequest {
        slots: r.slots,
        cpu_millicores: r.cpu_millicores,
        memory_mb: r.memory_mb,
        gpus: r.gpus,
        gpu_requirements,
        named: r.named.iter().map(|(k, v)| (k.clone(), *v)).collect(),
    })
}

/// The core placement a submitted wire placement means (selector included),
/// validated and compiled once to catch every error now.
pub fn from_proto(placement: Option<&pb::Placement>) -> Result<core::Placement> {
    let Some(p) = placement else {
        return Ok(core::Placement::default());
    };
    let mut out = core::Placement {
        required_tags: p.required_tags.clone(),
        requirements: p
            .requirements
            .iter()
            .enumerate()
            .map(|(i, r)| requirement(r, &format!("placement.requirements[{i}]")))
            .collect::<Result<_, _>>()?,
        capabilities: p
            .capabilities
            .iter()
            .map(|c| CapabilityRef {
                name: c.name.clone(),
                major: c.major,
            })
            .collect(),
        preferences: p
            .preferences
            .iter()
            .enumerate()
            .map(|(i, pref)| {
                let field = format!("placement.preferences[{i}]");
                let condition = match &pref.condition {
                    Some(pb::preference::Condition::Tag(tag)) => {
                        PreferenceCondition::Tag(tag.clone())
                    }
                    Some(pb::preference::Condition::Requirement(r)) => {
                        PreferenceCondition::Requirement(requirement(
                            r,
                            &format!("{field}.requirement"),
                        )?)
                    }
                    Some(pb::preference::Condition::Capability(c)) => {
                        PreferenceCondition::Capability(CapabilityRef {
                            name: c.name.clone(),
                            major: c.major,
                        })
                    }
                    None => {
                        return Err(invalid(
                            &format!("{field}.condition"),
                            "a preference needs a tag, requirement or capability",
                        ));
                    }
                };
                Ok(Preference {
                    weight: pref.weight,
                    condition,
                })
            })
            .collect::<Result<_, _>>()?,
        json_schema: p
            .json_schema
            .as_ref()
            .map(|s| {
                struct_to_json(s)
                    .map_err(|e| invalid(&format!("placement.json_schema.{}", e.path), e.reason))
            })
            .transpose()?,
        tolerations: p.tolerations.clone(),
        policy: match pb::PlacementPolicy::try_from(p.policy) {
            Ok(pb::PlacementPolicy::Unspecified) => None,
            Ok(pb::PlacementPolicy::Spread) => Some(core::PlacementPolicy::Spread),
            Ok(pb::PlacementPolicy::Binpack) => Some(core::PlacementPolicy::Binpack),
            Err(_) => {
                return Err(invalid(
                    "placement.policy",
                    &format!(
                        "unknown policy {} (expected PLACEMENT_POLICY_SPREAD or PLACEMENT_POLICY_BINPACK)",
                        p.policy
                    ),
                ));
            }
        },
        resources: p.resources.as_ref().map(resources).transpose()?,
        spread_by: (!p.spread_by.is_empty()).then(|| p.spread_by.clone()),
    };
    if !p.selector.trim().is_empty() {
        let parsed = switchyard_core::selector::parse(&p.selector)
            .map_err(|err| invalid("placement.selector", &err.to_string()))?;
        out.merge(parsed);
    }
    core::compile(&out)
        .map_err(|err| invalid(&format!("placement.{}", err.field), &err.message))?;
    Ok(out)
}

/// The wire form of a core placement (the selector is already folded in).
pub fn to_proto(p: &core::Placement) -> pb::Placement {
    let wire_req = |r: &Requirement| pb::Requirement {
        key: r.key.clone(),
        operator: wire_operator(r.operator) as i32,
        values: r.values.iter().map(json_to_value).collect(),
    };
    pb::Placement {
        required_tags: p.required_tags.clone(),
        requirements: p.requirements.iter().map(wire_req).collect(),
        capabilities: p
            .capabilities
            .iter()
            .map(|c| pb::CapabilityRef {
                name: c.name.clone(),
                major: c.major,
            })
            .collect(),
        preferences: p
            .preferences
            .iter()
            .map(|pref| pb::Preference {
                weight: pref.weight,
                condition: Some(match &pref.condition {
                    PreferenceCondition::Tag(t) => pb::preference::Condition::Tag(t.clone()),
                    PreferenceCondition::Requirement(r) => {
                        pb::preference::Condition::Requirement(wire_req(r))
                    }
                    PreferenceCondition::Capability(c) => {
                        pb::preference::Condition::Capability(pb::CapabilityRef {
                            name: c.name.clone(),
                            major: c.major,
                        })
                    }
                }),
            })
            .collect(),
        selector: String::new(),
        json_schema: p.json_schema.as_ref().map(json_to_struct),
        tolerations: p.tolerations.clone(),
        policy: wire_policy(p.policy) as i32,
        resources: p.resources.as_ref().map(|r| pb::ResourceRequest {
            slots: r.slots,
            cpu_millicores: r.cpu_millicores,
            memory_mb: r.memory_mb,
            gpus: r.gpus,
            gpu_requirements: r.gpu_requirements.iter().map(wire_req).collect(),
            gpu_selector: String::new(),
            named: r.named.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        }),
        spread_by: p.spread_by.clone().unwrap_or_default(),
    }
}

/// The wire form of what a lease holds.
pub fn assigned(claim: &switchyard_core::resources::Claim) -> pb::AssignedResources {
    pb::AssignedResources {
        slots: claim.slots,
        cpu_millicores: claim.cpu_millicores,
        memory_mb: claim.memory_mb,
        gpu_ids: claim.gpus.clone(),
        named: claim.named.iter().map(|(k, v)| (k.clone(), *v)).collect(),
    }
}

/// The wire form of a policy (unset: unspecified).
pub fn wire_policy(policy: Option<core::PlacementPolicy>) -> pb::PlacementPolicy {
    match policy {
        None => pb::PlacementPolicy::Unspecified,
        Some(core::PlacementPolicy::Spread) => pb::PlacementPolicy::Spread,
        Some(core::PlacementPolicy::Binpack) => pb::PlacementPolicy::Binpack,
    }
}
