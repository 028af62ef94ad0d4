//! What a task needs from the agent that runs it, mirroring `switchyard.v1.Placement`: required
//! tags, typed [`Requirement`]s on document values, named capability refs (`name@major`),
//! weighted [`Preference`]s, a JSON Schema (draft 2020-12) the whole document must satisfy, the
//! agent taints the task tolerates (an agent whose document lists a taint the task does not
//! tolerate never takes it), the [`PlacementPolicy`] that ranks the agents that qualify, the
//! document key the task spreads by, and the consumable resources it holds while it runs
//! ([`ResourceRequest`]; see [`crate::resources`]).
//! [`compile`] validates a placement once — operator arity, operand types, regular expressions,
//! version ranges and the schema — naming the offending field on error, and the resulting
//! [`CompiledPlacement`] evaluates documents without further parsing.
//!
//! Comparison rules (the [`Operator`] docs give each operator's meaning):
//! - A missing key fails every operator except `NOT_EXISTS` and `NOT_IN`.
//! - Equality is JSON equality, except that numbers compare numerically (`1 == 1.0`); a string
//!   never equals a number.
//! - Ordering operators compare numerically when the document value is a number (the operand
//!   may be a number or a numeric string), and as lenient versions when the document value is a
//!   string (`"2.34.1" >= "2.30"`). Any other combination fails the requirement with a reason;
//!   there is never a lexical comparison.
//! - `IN` and `NOT_IN` on an array value test its items: `IN` holds when some item equals an
//!   operand, `NOT_IN` when none does. This is how the selector's `!gpu` (`tags NOT_IN [gpu]`)
//!   means "does not have the tag".

use crate::document::{self, display, kind, lookup};
use crate::error::PlacementError;
use crate::resources::{self, Claim, Held, Need, Offer, Shortfall, SpreadMark};
use crate::version::{self, VersionRange};
use regex::{Regex, RegexBuilder};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// A comparison between a document value and a requirement's operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Operator {
    /// The key is present (any value, including null). No operands.
    Exists,
    /// The key is absent. No operands.
    NotExists,
    /// The value equals the operand.
    Eq,
    /// The value is present and differs from the operand.
    Ne,
    /// The value (or, for an array, one of its items) equals one of the operands.
    In,
    /// The value is absent, or it (or, for an array, every item) equals none of the operands.
    NotIn,
    /// Greater than (numbers numerically, strings as versions).
    Gt,
    /// Greater than or equal.
    Gte,
    /// Less than.
    Lt,
    /// Less than or equal.
    Lte,
    /// The value, read leniently as a version, is in the operand's range.
    Version,
    /// The value, a string, matches the operand regular expression (unanchored).
    Regex,
    /// The value, an array, has the operand as an item; or, a string, has it as a substring.
    Contains,
    /// The value, an array, has at least one operand as an item (a string: as a substring).
    ContainsAny,
}

/// How many operands an operator takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arity {
    /// None.
    Zero,
    /// Exactly one.
    One,
    /// One or more.
    OneOrMore,
}

impl Operator {
    /// Every operator, in proto order.
    pub const ALL: [Operator; 14] = [
        Operator::Exists,
        Operator::NotExists,
        Operator::Eq,
        Operator::Ne,
        Operator::In,
        Operator::NotIn,
        Operator::Gt,
        Operator::Gte,
        Operator::Lt,
        Operator::Lte,
        Operator::Version,
        Operator::Regex,
        Operator::Contains,
        Operator::ContainsAny,
    ];

    /// The proto name without its `OPERATOR_` prefix (`EQ`, `CONTAINS_ANY`).
    pub fn as_str(self) -> &'static str {
        match self {
            Operator::Exists => "EXISTS",
            Operator::NotExists => "NOT_EXISTS",
            Operator::Eq => "EQ",
            Operator::Ne => "NE",
            Operator::In => "IN",
            Operator::NotIn => "NOT_IN",
            Operator::Gt => "GT",
            Operator::Gte => "GTE",
            Operator::Lt => "LT",
            Operator::Lte => "LTE",
            Operator::Version => "VERSION",
            Operator::Regex => "REGEX",
            Operator::Contains => "CONTAINS",
            Operator::ContainsAny => "CONTAINS_ANY",
        }
    }

    /// The operand count the operator takes.
    pub fn arity(self) -> Arity {
        match self {
            Operator::Exists | Operator::NotExists => Arity::Zero,
            Operator::In | Operator::NotIn | Operator::ContainsAny => Arity::OneOrMore,
            _ => Arity::One,
        }
    }

    /// Whether the operator can hold for a document that lacks the key.
    pub fn holds_when_missing(self) -> bool {
        matches!(self, Operator::NotExists | Operator::NotIn)
    }

    /// Whether it compares the value's order (`>`, `>=`, `<`, `<=`).
    pub fn is_ordering(self) -> bool {
        matches!(
            self,
            Operator::Gt | Operator::Gte | Operator::Lt | Operator::Lte
        )
    }
}

impl fmt::Display for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The name is not an operator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown operator `{0}`")]
pub struct UnknownOperator(pub String);

impl FromStr for Operator {
    type Err = UnknownOperator;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bare = s.strip_prefix("OPERATOR_").unwrap_or(s);
        Operator::ALL
            .into_iter()
            .find(|o| o.as_str() == bare)
            .ok_or_else(|| UnknownOperator(s.to_owned()))
    }
}

/// A typed constraint on one value of the capability document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Requirement {
    /// Dotted path into the document (see [`crate::document`]).
    pub key: String,
    /// The comparison.
    pub operator: Operator,
    /// The operands.
    #[serde(default)]
    pub values: Vec<Value>,
}

impl Requirement {
    /// A requirement from parts.
    pub fn new(key: impl Into<String>, operator: Operator, values: Vec<Value>) -> Self {
        Self {
            key: key.into(),
            operator,
            values,
        }
    }
}

/// A named capability at a major version, written `name@major`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapabilityRef {
    /// Dotted capability name, e.g. `ai.llm`.
    pub name: String,
    /// The major version the task was written against.
    pub major: u32,
}

impl fmt::Display for CapabilityRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.major)
    }
}

/// What a preference asks of an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PreferenceCondition {
    /// The agent reports this tag.
    Tag(String),
    /// The agent satisfies this requirement.
    Requirement(Requirement),
    /// The agent provides this capability, healthy, at this major version.
    Capability(CapabilityRef),
}

/// A soft requirement: satisfying it adds `weight` to an eligible agent's rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Preference {
    /// At least 1.
    pub weight: u32,
    /// What the agent should satisfy.
    #[serde(flatten)]
    pub condition: PreferenceCondition,
}

/// How the agents that qualify for a task are ranked once preferences tie (see
/// [`crate::matcher`] for the exact order).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlacementPolicy {
    /// The least loaded agent first (highest free share of its slots): work spreads out.
    #[default]
    Spread,
    /// The most loaded agent that still has room first: work fills one agent before the next,
    /// and the idle ones stay whole for the work that needs them.
    Binpack,
}

impl PlacementPolicy {
    /// The name (`spread`, `binpack`).
    pub fn as_str(self) -> &'static str {
        match self {
            PlacementPolicy::Spread => "spread",
            PlacementPolicy::Binpack => "binpack",
        }
    }
}

impl fmt::Display for PlacementPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The name is not a placement policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown placement policy `{0}` (expected spread or binpack)")]
pub struct UnknownPolicy(pub String);

impl FromStr for PlacementPolicy {
    type Err = UnknownPolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [PlacementPolicy::Spread, PlacementPolicy::Binpack]
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownPolicy(s.to_owned()))
    }
}

/// Longest accepted toleration.
pub const MAX_TOLERATION_LEN: usize = 256;

/// What a task needs from its agent; mirrors `switchyard.v1.Placement` minus the selector text,
/// which [`crate::selector::parse`] turns into another `Placement` to [`Placement::merge`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Placement {
    /// Tags the document's `tags` array must hold.
    pub required_tags: Vec<String>,
    /// Requirements on document values.
    pub requirements: Vec<Requirement>,
    /// Named capabilities the agent must provide, healthy, at the same major version.
    pub capabilities: Vec<CapabilityRef>,
    /// Ranking preferences.
    pub preferences: Vec<Preference>,
    /// A JSON Schema (draft 2020-12) the whole document must validate against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json_schema: Option<Value>,
    /// Agent taints the task tolerates; an agent with any other taint never takes it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<String>,
    /// How qualifying agents rank; unset means the namespace's default (the server resolves it
    /// when the task is submitted), else [`PlacementPolicy::Spread`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<PlacementPolicy>,
    /// The consumable resources the task holds while it runs; unset means one slot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequest>,
    /// A document key (`custom_properties.region`) to balance the tasks that spread by it over
    /// its values: an eligible agent whose value the fewest live leases of such tasks hold ranks
    /// first, before preferences and the policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spread_by: Option<String>,
}

/// The consumable resources a task asks of its agent (see [`crate::resources`]): an agent is
/// eligible only while its free resources cover them, and the lease holds them until it ends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResourceRequest {
    /// Slots; 0 means 1.
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub slots: u32,
    /// CPU in millicores (1,000 a CPU).
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub cpu_millicores: u64,
    /// Memory in MB.
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub memory_mb: u64,
    /// How many GPUs.
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub gpus: u32,
    /// What each GPU must satisfy, as requirements on the device's fields (`memory_mb`,
    /// `model`, `uuid`, `index`, ...).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpu_requirements: Vec<Requirement>,
    /// Named countable resources by their dotted path below the agent's `resources` section
    /// (`licenses.matlab`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub named: BTreeMap<String, u64>,
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

impl ResourceRequest {
    /// Adds `other` to this request: an amount this one leaves at zero takes the other's, GPU
    /// requirements and named resources are added.
    pub fn merge(&mut self, other: ResourceRequest) {
        fn take<T: Default + PartialEq>(mine: &mut T, theirs: T) {
            if *mine == T::default() {
                *mine = theirs;
            }
        }
        take(&mut self.slots, other.slots);
        take(&mut self.cpu_millicores, other.cpu_millicores);
        take(&mut self.memory_mb, other.memory_mb);
        take(&mut self.gpus, other.gpus);
        self.gpu_requirements.extend(other.gpu_requirements);
        for (name, n) in other.named {
            self.named.entry(name).or_insert(n);
        }
    }
}

/// Most slots a task may ask for.
pub const MAX_REQUEST_SLOTS: u32 = 10_000;
/// Most GPUs a task may ask for.
pub const MAX_REQUEST_GPUS: u32 = 1_024;
/// Most named resources a task may ask for.
pub const MAX_REQUEST_NAMED: usize = 64;
/// Largest amount a task may ask for (every runner's JSON reads it exactly: 2^53 - 1).
pub const MAX_REQUEST_AMOUNT: u64 = (1 << 53) - 1;

impl Placement {
    /// Adds everything in `other` (typically the parsed selector) to this placement. Two schemas
    /// combine as `{"allOf": [mine, theirs]}`.
    pub fn merge(&mut self, other: Placement) {
        self.required_tags.extend(other.required_tags);
        self.requirements.extend(other.requirements);
        self.capabilities.extend(other.capabilities);
        self.preferences.extend(other.preferences);
        self.tolerations.extend(other.tolerations);
        self.policy = self.policy.or(other.policy);
        self.spread_by = self.spread_by.take().or(other.spread_by);
        self.resources = match (self.resources.take(), other.resources) {
            (Some(mut a), Some(b)) => {
                a.merge(b);
                Some(a)
            }
            (a, b) => a.or(b),
        };
        self.json_schema = match (self.json_schema.take(), other.json_schema) {
            (Some(a), Some(b)) => Some(json!({"allOf": [a, b]})),
            (a, b) => a.or(b),
        };
    }

    /// Whether the placement constrains nothing (it then matches every online untainted agent).
    pub fn is_empty(&self) -> bool {
        self.required_tags.is_empty()
            && self.requirements.is_empty()
            && self.capabilities.is_empty()
            && self.preferences.is_empty()
            && self.json_schema.is_none()
            && self.tolerations.is_empty()
            && self.resources.is_none()
            && self.spread_by.is_none()
    }
}

#[derive(Debug, Clone)]
enum Operand {
    None,
    One(Value),
    Many(Vec<Value>),
    Regex(Regex),
    Range(VersionRange),
}

/// A requirement whose operands were validated and compiled.
#[derive(Debug, Clone)]
pub struct CompiledRequirement {
    requirement: Requirement,
    operand: Operand,
}

#[derive(Debug, Clone)]
enum CompiledCondition {
    Tag(String),
    Requirement(CompiledRequirement),
    Capability(CapabilityRef),
}

#[derive(Debug, Clone)]
struct CompiledPreference {
    weight: u32,
    condition: CompiledCondition,
}

/// A placement validated and compiled once, ready to evaluate documents.
#[derive(Debug, Clone)]
pub struct CompiledPlacement {
    placement: Placement,
    /// The task's kind, when compiled for a task: a hard constraint on the agent's kinds.
    kind: Option<String>,
    requirements: Vec<CompiledRequirement>,
    preferences: Vec<CompiledPreference>,
    schema: Option<Arc<jsonschema::Validator>>,
    max_score: u64,
    /// What the resource request needs, when it needs more than one slot.
    resources: Option<Arc<CompiledResources>>,
}

/// A resource request, validated, with its GPU filter compiled.
#[derive(Debug)]
struct CompiledResources {
    need: Need,
    gpu_filter: Vec<CompiledRequirement>,
}

/// Why a capability ref is not satisfied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CapabilityProblem {
    /// No `provides.<name>` object.
    Missing,
    /// Present but `version` is missing or has another major version.
    WrongMajor {
        /// The version the agent reports, if any.
        have: Option<String>,
    },
    /// Present with `healthy: false`.
    Unhealthy {
        /// The agent's `reason`, if any.
        reason: Option<String>,
    },
}

/// The first thing a document fails in a placement.
#[derive(Debug, Clone, PartialEq)]
pub enum Unmet {
    /// A required tag is not in `tags`.
    MissingTag(String),
    /// A requirement does not hold.
    Requirement {
        /// Index into the placement's requirements.
        index: usize,
        /// The requirement's key.
        key: String,
        /// The requirement's operator.
        operator: Operator,
        /// The operands as people read them (`^20`, `(x86_64, aarch64)`).
        wanted: String,
        /// The document's value; `None` when missing.
        actual: Option<Value>,
        /// Why the comparison could not be made, when it could not.
        note: Option<String>,
    },
    /// A capability ref is not satisfied.
    Capability {
        /// The ref.
        capability: CapabilityRef,
        /// How.
        problem: CapabilityProblem,
    },
    /// The agent has a taint the task does not tolerate.
    Tainted {
        /// The first such taint.
        taint: String,
    },
    /// The document does not validate against the JSON Schema.
    Schema {
        /// JSON Pointer of the first failing instance (`""` for the document).
        instance_path: String,
        /// The failing keyword (`minimum`, `required`, ...).
        keyword: String,
        /// The validator's message.
        message: String,
    },
}

impl fmt::Display for Unmet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unmet::MissingTag(tag) => write!(f, "missing tag {tag}"),
            Unmet::Tainted { taint } => write!(f, "tainted {taint}: task does not tolerate it"),
            Unmet::Requirement {
                key,
                operator,
                wanted,
                actual,
                note,
                ..
            } => {
                write!(f, "{key} {operator}")?;
                if !wanted.is_empty() {
                    write!(f, " {wanted}")?;
                }
                match actual {
                    Some(v) => write!(f, ": have {}", display(v))?,
                    None => f.write_str(": missing")?,
                }
                if let Some(note) = note {
                    write!(f, " ({note})")?;
                }
                Ok(())
            }
            Unmet::Capability {
                capability,
                problem,
            } => match problem {
                CapabilityProblem::Missing => write!(f, "capability {capability} missing"),
                CapabilityProblem::WrongMajor { have: Some(v) } => {
                    write!(f, "capability {capability} has version {v}")
                }
                CapabilityProblem::WrongMajor { have: None } => {
                    write!(f, "capability {capability} has no version")
                }
                CapabilityProblem::Unhealthy { reason: Some(r) } => {
                    write!(f, "capability {capability} unhealthy: {r}")
                }
                CapabilityProblem::Unhealthy { reason: None } => {
                    write!(f, "capability {capability} unhealthy")
                }
            },
            Unmet::Schema {
                instance_path,
                keyword,
                message,
            } => {
                let at = if instance_path.is_empty() {
                    "/"
                } else {
                    instance_path
                };
                write!(f, "json_schema {keyword} at {at}: {message}")
            }
        }
    }
}

impl Unmet {
    /// The same verdict without the agent's values (its value for a requirement, the version or
    /// unhealthy reason of a capability, what a JSON Schema keyword found), each shown as
    /// [`crate::redact::MARKER`]: for callers who may see tasks but not agents. What the task
    /// wanted, the keyword and the path stay.
    pub fn without_agent_values(&self) -> Unmet {
        let hidden = || crate::redact::MARKER.to_owned();
        match self {
            Unmet::Requirement {
                index,
                key,
                operator,
                wanted,
                actual,
                note: _,
            } => Unmet::Requirement {
                index: *index,
                key: key.clone(),
                operator: *operator,
                wanted: wanted.clone(),
                actual: actual.as_ref().map(|_| Value::String(hidden())),
                note: None,
            },
            Unmet::Capability {
                capability,
                problem,
            } => Unmet::Capability {
                capability: capability.clone(),
                problem: match problem {
                    CapabilityProblem::WrongMajor { have: Some(_) } => {
                        CapabilityProblem::WrongMajor {
                            have: Some(hidden()),
                        }
                    }
                    CapabilityProblem::Unhealthy { reason: Some(_) } => {
                        CapabilityProblem::Unhealthy {
                            reason: Some(hidden()),
                        }
                    }
                    other => other.clone(),
                },
            },
            Unmet::Schema {
                instance_path,
                keyword,
                message: _,
            } => Unmet::Schema {
                instance_path: instance_path.clone(),
                keyword: keyword.clone(),
                message: format!("the agent's value fails `{keyword}` ({})", hidden()),
            },
            other => other.clone(),
        }
    }

    /// A short phrase shared by every agent failing the same way, for the summary line
    /// (`missing tag docker`, `software.node.version not ^20`, `capability ai.llm@1 unhealthy`).
    pub fn summary(&self) -> String {
        match self {
            Unmet::MissingTag(tag) => format!("missing tag {tag}"),
            Unmet::Tainted { taint } => format!("tainted {taint}"),
            Unmet::Requirement {
                key,
                operator,
                wanted,
                ..
            } => match operator {
                Operator::Exists => format!("{key} missing"),
                Operator::NotExists => format!("{key} present"),
                Operator::NotIn if key == "tags" => format!("has tag {}", strip_parens(wanted)),
                Operator::Eq | Operator::Version => format!("{key} not {wanted}"),
                Operator::Ne => format!("{key} is {wanted}"),
                Operator::In => format!("{key} not in {wanted}"),
                Operator::NotIn => format!("{key} in {wanted}"),
                Operator::Gt => format!("{key} not > {wanted}"),
                Operator::Gte => format!("{key} not >= {wanted}"),
                Operator::Lt => format!("{key} not < {wanted}"),
                Operator::Lte => format!("{key} not <= {wanted}"),
                Operator::Regex => format!("{key} not matching {wanted}"),
                Operator::Contains => format!("{key} lacks {wanted}"),
                Operator::ContainsAny => format!("{key} lacks all of {wanted}"),
            },
            Unmet::Capability {
                capability,
                problem,
            } => match problem {
                CapabilityProblem::Missing => format!("missing capability {capability}"),
                CapabilityProblem::WrongMajor { .. } => {
                    format!("capability {capability} wrong major")
                }
                CapabilityProblem::Unhealthy { .. } => format!("capability {capability} unhealthy"),
            },
            Unmet::Schema {
                instance_path,
                keyword,
                ..
            } => {
                let at = if instance_path.is_empty() {
                    "/"
                } else {
                    instance_path
                };
                format!("json_schema {keyword} at {at}")
            }
        }
    }
}

fn strip_parens(s: &str) -> &str {
    s.strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .unwrap_or(s)
}

fn wanted_text(values: &[Value], operator: Operator) -> String {
    match operator.arity() {
        Arity::Zero => String::new(),
        Arity::One => values.first().map(display).unwrap_or_default(),
        Arity::OneOrMore => format!(
            "({})",
            values.iter().map(display).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// Validates and compiles a placement. Errors name the field, e.g. `requirements[2].values`.
pub fn compile(placement: &Placement) -> Result<CompiledPlacement, PlacementError> {
    for (i, tag) in placement.required_tags.iter().enumerate() {
        if tag.is_empty() {
            return Err(PlacementError::new(
                format!("required_tags[{i}]"),
                "tag is empty",
            ));
        }
    }
    let requirements = placement
        .requirements
        .iter()
        .enumerate()
        .map(|(i, r)| compile_requirement(r, &format!("requirements[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    for (i, c) in placement.capabilities.iter().enumerate() {
        check_capability_ref(c, &format!("capabilities[{i}]"))?;
    }
    for (i, t) in placement.tolerations.iter().enumerate() {
        check_toleration(t).map_err(|m| PlacementError::new(format!("tolerations[{i}]"), m))?;
    }
    let mut preferences = Vec::with_capacity(placement.preferences.len());
    let mut max_score = 0u64;
    for (i, p) in placement.preferences.iter().enumerate() {
        let field = format!("preferences[{i}]");
        if p.weight == 0 {
            return Err(PlacementError::new(
                format!("{field}.weight"),
                "weight must be at least 1",
            ));
        }
        max_score += u64::from(p.weight);
        let condition = match &p.condition {
            PreferenceCondition::Tag(t) if t.is_empty() => {
                return Err(PlacementError::new(format!("{field}.tag"), "tag is empty"));
            }
            PreferenceCondition::Tag(t) => CompiledCondition::Tag(t.clone()),
            PreferenceCondition::Requirement(r) => CompiledCondition::Requirement(
                compile_requirement(r, &format!("{field}.requirement"))?,
            ),
            PreferenceCondition::Capability(c) => {
                check_capability_ref(c, &format!("{field}.capability"))?;
                CompiledCondition::Capability(c.clone())
            }
        };
        preferences.push(CompiledPreference {
            weight: p.weight,
            condition,
        });
    }
    let schema = match &placement.json_schema {
        None => None,
        Some(s) if !(s.is_object() || s.is_boolean()) => {
            return Err(PlacementError::new(
                "json_schema",
                format!("a schema is an object or a boolean, not {}", kind(s)),
            ));
        }
        Some(s) => Some(Arc::new(jsonschema::draft202012::new(s).map_err(|e| {
            PlacementError::new("json_schema", format!("invalid schema: {e}"))
        })?)),
    };
    if let Some(key) = &placement.spread_by {
        check_toleration(key)
            .map_err(|m| PlacementError::new("spread_by", m.replacen("toleration", "key", 1)))?;
    }
    let resources = match &placement.resources {
        None => None,
        Some(request) => compile_resources(request)?.map(Arc::new),
    };
    Ok(CompiledPlacement {
        placement: placement.clone(),
        kind: None,
        requirements,
        preferences,
        schema,
        max_score,
        resources,
    })
}

/// Validates a resource request; `None` when it needs one slot and nothing else.
fn compile_resources(r: &ResourceRequest) -> Result<Option<CompiledResources>, PlacementError> {
    let err =
        |field: &str, message: String| PlacementError::new(format!("resources.{field}"), message);
    if r.slots > MAX_REQUEST_SLOTS {
        return Err(err(
            "slots",
            format!("{} slots is more than {MAX_REQUEST_SLOTS}", r.slots),
        ));
    }
    if r.gpus > MAX_REQUEST_GPUS {
        return Err(err(
            "gpus",
            format!("{} GPUs is more than {MAX_REQUEST_GPUS}", r.gpus),
        ));
    }
    for (field, n) in [
        ("cpu_millicores", r.cpu_millicores),
        ("memory_mb", r.memory_mb),
    ] {
        if n > MAX_REQUEST_AMOUNT {
            return Err(err(field, format!("{n} is more than {MAX_REQUEST_AMOUNT}")));
        }
    }
    if !r.gpu_requirements.is_empty() && r.gpus == 0 {
        return Err(err(
            "gpu_requirements",
            "GPU requirements need gpus of at least 1".to_owned(),
        ));
    }
    if r.named.len() > MAX_REQUEST_NAMED {
        return Err(err(
            "named",
            format!(
                "{} named resources, more than {MAX_REQUEST_NAMED}",
                r.named.len()
            ),
        ));
    }
    for (name, n) in &r.named {
        let field = format!("named[{name:?}]");
        check_toleration(name)
            .map_err(|m| err(&field, m.replacen("toleration", "resource name", 1)))?;
        if matches!(
            name.as_str(),
            "cpu_millicores" | "memory_mb" | "gpus" | "slots"
        ) {
            return Err(err(&field, format!("{name} is requested by its own field")));
        }
        if *n == 0 {
            return Err(err(&field, "amount must be at least 1".to_owned()));
        }
        if *n > MAX_REQUEST_AMOUNT {
            return Err(err(
                &field,
                format!("{n} is more than {MAX_REQUEST_AMOUNT}"),
            ));
        }
    }
    let gpu_filter = r
        .gpu_requirements
        .iter()
        .enumerate()
        .map(|(i, req)| compile_requirement(req, &format!("resources.gpu_requirements[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let need = Need {
        slots: r.slots.max(1),
        cpu_millicores: r.cpu_millicores,
        memory_mb: r.memory_mb,
        gpus: r.gpus,
        gpu_filter: r
            .gpu_requirements
            .iter()
            .map(requirement_text)
            .collect::<Vec<_>>()
            .join(", "),
        named: r.named.clone(),
    };
    Ok((!need.is_one_slot()).then_some(CompiledResources { need, gpu_filter }))
}

/// A requirement as the selector writes it (`memory_mb>=40000`, `model~H100`).
pub fn requirement_text(r: &Requirement) -> String {
    let wanted = wanted_text(&r.values, r.operator);
    let key = &r.key;
    match r.operator {
        Operator::Exists => format!("{key}?"),
        Operator::NotExists => format!("!{key}?"),
        Operator::Eq => format!("{key}={wanted}"),
        Operator::Ne => format!("{key}!={wanted}"),
        Operator::Gt => format!("{key}>{wanted}"),
        Operator::Gte => format!("{key}>={wanted}"),
        Operator::Lt => format!("{key}<{wanted}"),
        Operator::Lte => format!("{key}<={wanted}"),
        Operator::Version => format!("{key}@{wanted}"),
        Operator::Regex => format!("{key}~{wanted}"),
        Operator::In => format!("{key} in {wanted}"),
        Operator::NotIn => format!("{key} not in {wanted}"),
        Operator::Contains => format!("{key} contains {wanted}"),
        Operator::ContainsAny => format!("{key} contains any {wanted}"),
    }
}

/// A toleration names a taint: 1 to [`MAX_TOLERATION_LEN`] bytes, no whitespace or control
/// characters.
fn check_toleration(t: &str) -> Result<(), String> {
    if t.is_empty() {
        return Err("toleration is empty".to_owned());
    }
    if t.len() > MAX_TOLERATION_LEN {
        return Err(format!(
            "toleration is {} bytes, longer than {MAX_TOLERATION_LEN}",
            t.len()
        ));
    }
    if t.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "toleration {t:?} holds whitespace or a control character"
        ));
    }
    Ok(())
}

fn check_capability_ref(c: &CapabilityRef, field: &str) -> Result<(), PlacementError> {
    if c.name.is_empty() {
        return Err(PlacementError::new(
            format!("{field}.name"),
            "capability name is empty",
        ));
    }
    if c.name.starts_with('.') || c.name.ends_with('.') || c.name.contains("..") {
        return Err(PlacementError::new(
            format!("{field}.name"),
            format!("`{}` is not a dotted name", c.name),
        ));
    }
    Ok(())
}

fn compile_requirement(
    r: &Requirement,
    field: &str,
) -> Result<CompiledRequirement, PlacementError> {
    if r.key.is_empty() {
        return Err(PlacementError::new(format!("{field}.key"), "key is empty"));
    }
    let values_field = format!("{field}.values");
    let n = r.values.len();
    match r.operator.arity() {
        Arity::Zero if n != 0 => {
            return Err(PlacementError::new(
                values_field,
                format!("{} takes no values, got {n}", r.operator),
            ));
        }
        Arity::One if n != 1 => {
            return Err(PlacementError::new(
                values_field,
                format!("{} takes exactly one value, got {n}", r.operator),
            ));
        }
        Arity::OneOrMore if n == 0 => {
            return Err(PlacementError::new(
                values_field,
                format!("{} takes one or more values, got none", r.operator),
            ));
        }
        _ => {}
    }
    let first_field = format!("{values_field}[0]");
    let operand = match r.operator {
        Operator::Exists | Operator::NotExists => Operand::None,
        Operator::In | Operator::NotIn | Operator::ContainsAny => Operand::Many(r.values.clone()),
        Operator::Regex => {
            let Some(Value::String(pattern)) = r.values.first() else {
                return Err(PlacementError::new(first_field, "REGEX takes a string"));
            };
            let re = RegexBuilder::new(pattern)
                .size_limit(1 << 20)
                .dfa_size_limit(1 << 20)
                .build()
                .map_err(|e| {
                    PlacementError::new(first_field, format!("invalid regular expression: {e}"))
                })?;
            Operand::Regex(re)
        }
        Operator::Version => {
            let text = match r.values.first() {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Number(n)) => n.to_string(),
                _ => {
                    return Err(PlacementError::new(
                        first_field,
                        "VERSION takes a range string",
                    ));
                }
            };
            Operand::Range(
                VersionRange::parse(&text)
                    .map_err(|e| PlacementError::new(first_field, e.to_string()))?,
            )
        }
        op if op.is_ordering() => {
            let ok = match r.values.first() {
                Some(Value::Number(_)) => true,
                Some(Value::String(s)) => is_number_text(s) || version::parse_lenient(s).is_some(),
                _ => false,
            };
            if !ok {
                let shown = r.values.first().map(display).unwrap_or_default();
                return Err(PlacementError::new(
                    first_field,
                    format!("{op} takes a number or a version, not `{shown}`"),
                ));
            }
            Operand::One(r.values.first().cloned().unwrap_or(Value::Null))
        }
        _ => Operand::One(r.values.first().cloned().unwrap_or(Value::Null)),
    };
    Ok(CompiledRequirement {
        requirement: r.clone(),
        operand,
    })
}

fn is_number_text(s: &str) -> bool {
    s.trim().parse::<f64>().is_ok_and(f64::is_finite)
}

/// JSON equality with numbers compared numerically.
pub fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(i), Some(j)) => i == j,
            _ => match (x.as_u64(), y.as_u64()) {
                (Some(i), Some(j)) => i == j,
                _ => x.as_f64() == y.as_f64(),
            },
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(i, j)| json_eq(i, j))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

/// Orders a document value against an operand under the ordering rules in the module doc; the
/// error says why they cannot be ordered.
pub fn order(actual: &Value, operand: &Value) -> Result<Ordering, String> {
    match actual {
        Value::Number(a) => {
            let a = a.as_f64().unwrap_or(f64::NAN);
            let b = match operand {
                Value::Number(b) => b.as_f64(),
                Value::String(s) if is_number_text(s) => s.trim().parse::<f64>().ok(),
                Value::String(s) => {
                    // A number against a version operand: compare as versions.
                    return match (version::from_json(actual), version::parse_lenient(s)) {
                        (Some(x), Some(y)) => Ok(x.cmp(&y)),
                        _ => Err(format!("`{s}` is not a number or version")),
                    };
                }
                _ => None,
            };
            b.and_then(|b| a.partial_cmp(&b))
                .ok_or_else(|| format!("operand {} is not a number", display(operand)))
        }
        Value::String(s) => {
            let a =
                version::parse_lenient(s).ok_or_else(|| "not a number or version".to_owned())?;
            let b = version::from_json(operand)
                .ok_or_else(|| format!("operand {} is not a version", display(operand)))?;
            Ok(a.cmp(&b))
        }
        other => Err(format!("{} is not a number or version", kind(other))),
    }
}

fn contains_item(haystack: &Value, needle: &Value) -> Result<bool, String> {
    match (haystack, needle) {
        (Value::Array(items), n) => Ok(items.iter().any(|i| json_eq(i, n))),
        (Value::String(s), Value::String(n)) => Ok(s.contains(n.as_str())),
        (Value::String(_), n) => Err(format!("a string cannot contain a {}", kind(n))),
        (other, _) => Err(format!("{} is not an array or string", kind(other))),
    }
}

impl CompiledRequirement {
    /// The requirement as written.
    pub fn requirement(&self) -> &Requirement {
        &self.requirement
    }

    /// `Ok` when `doc` satisfies the requirement; otherwise the value found (if any) and why the
    /// comparison could not be made (if it could not).
    pub fn check<'d>(&self, doc: &'d Value) -> Result<(), (Option<&'d Value>, Option<String>)> {
        let op = self.requirement.operator;
        let Some(actual) = lookup(doc, &self.requirement.key) else {
            return if op.holds_when_missing() {
                Ok(())
            } else {
                Err((None, None))
            };
        };
        self.check_value(actual)
            .map_err(|note| (Some(actual), note))
    }

    /// Whether `value`, found at the requirement's key, satisfies it.
    pub fn holds_for(&self, value: &Value) -> bool {
        self.check_value(value).is_ok()
    }

    /// [`CompiledRequirement::check`] of the value found at the key.
    fn check_value(&self, actual: &Value) -> Result<(), Option<String>> {
        let op = self.requirement.operator;
        let fail = |note: Option<String>| Err(note);
        let holds = match (&self.operand, op) {
            (_, Operator::Exists) => true,
            (_, Operator::NotExists) => false,
            (Operand::One(v), Operator::Eq) => json_eq(actual, v),
            (Operand::One(v), Operator::Ne) => !json_eq(actual, v),
            (Operand::Many(vs), Operator::In) => match actual {
                Value::Array(items) => items.iter().any(|i| vs.iter().any(|v| json_eq(i, v))),
                a => vs.iter().any(|v| json_eq(a, v)),
            },
            (Operand::Many(vs), Operator::NotIn) => match actual {
                Value::Array(items) => !items.iter().any(|i| vs.iter().any(|v| json_eq(i, v))),
                a => !vs.iter().any(|v| json_eq(a, v)),
            },
            (Operand::One(v), o) if o.is_ordering() => match order(actual, v) {
                Ok(ord) => match o {
                    Operator::Gt => ord == Ordering::Greater,
                    Operator::Gte => ord != Ordering::Less,
                    Operator::Lt => ord == Ordering::Less,
                    _ => ord != Ordering::Greater,
                },
                Err(note) => return fail(Some(note)),
            },
            (Operand::Range(range), Operator::Version) => match version::from_json(actual) {
                Some(v) => range.matches(&v),
                None => return fail(Some("not a version".into())),
            },
            (Operand::Regex(re), Operator::Regex) => match actual {
                Value::String(s) => re.is_match(s),
                other => return fail(Some(format!("{} is not a string", kind(other)))),
            },
            (Operand::One(v), Operator::Contains) => match contains_item(actual, v) {
                Ok(b) => b,
                Err(note) => return fail(Some(note)),
            },
            (Operand::Many(vs), Operator::ContainsAny) => {
                let mut any = false;
                for v in vs {
                    match contains_item(actual, v) {
                        Ok(true) => {
                            any = true;
                            break;
                        }
                        Ok(false) => {}
                        Err(note) => return fail(Some(note)),
                    }
                }
                any
            }
            _ => return fail(Some("operator and operand do not agree".into())),
        };
        if holds { Ok(()) } else { fail(None) }
    }

    fn unmet(&self, index: usize, doc: &Value) -> Option<Unmet> {
        let (actual, note) = self.check(doc).err()?;
        Some(Unmet::Requirement {
            index,
            key: self.requirement.key.clone(),
            operator: self.requirement.operator,
            wanted: wanted_text(&self.requirement.values, self.requirement.operator),
            actual: actual.cloned(),
            note,
        })
    }
}

/// Checks one capability ref against a document.
pub fn check_capability(c: &CapabilityRef, doc: &Value) -> Result<(), CapabilityProblem> {
    let Some(provided) = document::CapabilityDocument(doc).provided(&c.name) else {
        return Err(CapabilityProblem::Missing);
    };
    let major = provided
        .version
        .as_deref()
        .and_then(version::parse_lenient)
        .map(|v| v.major);
    if major != Some(u64::from(c.major)) {
        return Err(CapabilityProblem::WrongMajor {
            have: provided.version,
        });
    }
    if !provided.healthy {
        return Err(CapabilityProblem::Unhealthy {
            reason: provided.reason.map(str::to_owned),
        });
    }
    Ok(())
}

impl CompiledPlacement {
    /// The placement for a task of `kind`: only agents that handle the kind satisfy it.
    pub fn with_kind(mut self, kind: &str) -> Self {
        self.kind = Some(kind.to_owned());
        self
    }

    /// The task's kind, if compiled for a task.
    pub fn kind(&self) -> Option<&str> {
        self.kind.as_deref()
    }

    /// The placement as given.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// How qualifying agents rank ([`PlacementPolicy::Spread`] when unset).
    pub fn policy(&self) -> PlacementPolicy {
        self.placement.policy.unwrap_or_default()
    }

    /// What the task's resource request needs, when it needs more than one slot.
    pub fn resource_need(&self) -> Option<&Need> {
        self.resources.as_deref().map(|r| &r.need)
    }

    /// Whether a GPU (its object in the agent's `resources.gpus`) passes the request's filter.
    pub fn gpu_ok(&self, device: &Value) -> bool {
        self.resources
            .as_deref()
            .is_none_or(|r| r.gpu_filter.iter().all(|req| req.check(device).is_ok()))
    }

    /// The first resource an agent with `document` and `capacity` slots could never give the
    /// task; `None` when it could (always, for a task that needs one slot).
    pub fn never_fits(&self, document: &Value, capacity: u32) -> Option<Shortfall> {
        let need = self.resource_need()?;
        resources::never_fits(need, &Offer::of(document), capacity, |d| self.gpu_ok(d))
    }

    /// The document key the task spreads by, if any.
    pub fn spread_by(&self) -> Option<&str> {
        self.placement.spread_by.as_deref()
    }

    /// Whether a lease of the task holds more than one slot (a resource request, or a place
    /// in a spread): such a grant is re-checked against the agent's live leases.
    pub fn claims_beyond_slots(&self) -> bool {
        self.resources.is_some() || self.placement.spread_by.is_some()
    }

    /// What the agent would give the task now, its leases holding `active` slots and `held`:
    /// the claim (with the task's place in its spread, if it spreads), or the first resource
    /// short.
    pub fn assign(
        &self,
        document: &Value,
        capacity: u32,
        active: u32,
        held: &Held,
    ) -> Result<Claim, Shortfall> {
        let mut claim = self.assign_resources(document, capacity, active, held)?;
        claim.spread = self.spread_by().map(|key| SpreadMark {
            key: key.to_owned(),
            value: resources::spread_value(document, key),
        });
        Ok(claim)
    }

    fn assign_resources(
        &self,
        document: &Value,
        capacity: u32,
        active: u32,
        held: &Held,
    ) -> Result<Claim, Shortfall> {
        match self.resource_need() {
            None if active < capacity => Ok(Claim::one_slot()),
            None => Err(Shortfall::Slots {
                need: 1,
                free: 0,
                total: capacity,
            }),
            Some(need) => {
                resources::assign(need, &Offer::of(document), capacity, active, held, |d| {
                    self.gpu_ok(d)
                })
            }
        }
    }

    /// Whether the task tolerates `taint`.
    pub fn tolerates(&self, taint: &str) -> bool {
        self.placement.tolerations.iter().any(|t| t == taint)
    }

    /// The first of the document's taints the task does not tolerate.
    pub fn untolerated_taint<'d>(&self, doc: &'d Value) -> Option<&'d str> {
        document::CapabilityDocument(doc)
            .taints()
            .find(|t| !self.tolerates(t))
    }

    /// The compiled requirements, in order.
    pub fn requirements(&self) -> &[CompiledRequirement] {
        &self.requirements
    }

    /// Whether any preference can change the ranking.
    pub fn has_preferences(&self) -> bool {
        !self.preferences.is_empty()
    }

    /// The score of an agent satisfying every preference.
    pub fn max_preference_score(&self) -> u64 {
        self.max_score
    }

    /// The first hard constraint `doc` fails, in the order taints, tags, requirements,
    /// capability refs, schema; `None` when it satisfies them all.
    pub fn unmet(&self, doc: &Value) -> Option<Unmet> {
        if let Some(taint) = self.untolerated_taint(doc) {
            return Some(Unmet::Tainted {
                taint: taint.to_owned(),
            });
        }
        let view = document::CapabilityDocument(doc);
        if let Some(tag) = self
            .placement
            .required_tags
            .iter()
            .find(|t| !view.has_tag(t))
        {
            return Some(Unmet::MissingTag(tag.clone()));
        }
        if let Some(u) = self
            .requirements
            .iter()
            .enumerate()
            .find_map(|(i, r)| r.unmet(i, doc))
        {
            return Some(u);
        }
        for c in &self.placement.capabilities {
            if let Err(problem) = check_capability(c, doc) {
                return Some(Unmet::Capability {
                    capability: c.clone(),
                    problem,
                });
            }
        }
        if let Some(schema) = &self.schema
            && let Err(e) = schema.validate(doc)
        {
            return Some(Unmet::Schema {
                instance_path: e.instance_path().to_string(),
                keyword: e.kind().keyword().to_owned(),
                message: e.to_string(),
            });
        }
        None
    }

    /// Whether `doc` satisfies every hard constraint; [`Self::unmet`] without building a reason.
    pub fn satisfied_by(&self, doc: &Value) -> bool {
        let view = document::CapabilityDocument(doc);
        self.untolerated_taint(doc).is_none()
            && self.placement.required_tags.iter().all(|t| view.has_tag(t))
            && self.requirements.iter().all(|r| r.check(doc).is_ok())
            && self
                .placement
                .capabilities
                .iter()
                .all(|c| check_capability(c, doc).is_ok())
            && self.schema.as_ref().is_none_or(|s| s.is_valid(doc))
    }

    /// The total weight of the preferences `doc` satisfies.
    pub fn preference_score(&self, doc: &Value) -> u64 {
        let view = document::CapabilityDocument(doc);
        self.preferences
            .iter()
            .filter(|p| match &p.condition {
                CompiledCondition::Tag(t) => view.has_tag(t),
                CompiledCondition::Requirement(r) => r.check(doc).is_ok(),
                CompiledCondition::Capability(c) => check_capability(c, doc).is_ok(),
            })
            .map(|p| u64::from(p.weight))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(key: &str, op: Operator, values: Vec<Value>) -> Placement {
        Placement {
            requirements: vec![Requirement::new(key, op, values)],
            ..Placement::default()
        }
    }

    fn doc() -> Value {
        json!({
            "os": "linux", "arch": "x86_64", "hostname": "build-7",
            "tags": ["linux", "docker"],
            "software": {"node": {"version": "18.19.0"}, "git": {"version": "2.34.1"}, "rustc": {"version": "1.95.0-nightly"}},
            "memory": {"total": 16384, "unit": "MB"},
            "loadavg": {"1min": 0.5},
            "flag": true, "nothing": null,
            "packages": ["git", "deno"],
            "provides": {"ai.llm": {"version": "1.4.0", "healthy": false, "reason": "missing parameter API_KEY"},
                          "comm.gateway": {"version": "2.0.0"}}
        })
    }

    fn holds(key: &str, op: Operator, values: Vec<Value>) -> bool {
        compile(&req(key, op, values)).unwrap().satisfied_by(&doc())
    }

    fn reason(key: &str, op: Operator, values: Vec<Value>) -> String {
        compile(&req(key, op, values))
            .unwrap()
            .unmet(&doc())
            .unwrap()
            .to_string()
    }

    #[test]
    fn operator_names_round_trip() {
        for op in Operator::ALL {
            assert_eq!(op.as_str().parse::<Operator>().unwrap(), op);
            assert_eq!(
                format!("OPERATOR_{}", op.as_str())
                    .parse::<Operator>()
                    .unwrap(),
                op
            );
            assert_eq!(serde_json::to_value(op).unwrap(), json!(op.as_str()));
        }
        assert!("LIKE".parse::<Operator>().is_err());
    }

    #[test]
    fn exists_and_not_exists() {
        assert!(holds("nothing", Operator::Exists, vec![]));
        assert!(holds("memory.total", Operator::Exists, vec![]));
        assert!(!holds("gpu", Operator::Exists, vec![]));
        assert!(holds("gpu", Operator::NotExists, vec![]));
        assert!(!holds("nothing", Operator::NotExists, vec![]));
        assert_eq!(
            reason("gpu", Operator::Exists, vec![]),
            "gpu EXISTS: missing"
        );
        assert_eq!(
            reason("os", Operator::NotExists, vec![]),
            "os NOT_EXISTS: have linux"
        );
    }

    #[test]
    fn eq_and_ne() {
        assert!(holds("os", Operator::Eq, vec![json!("linux")]));
        assert!(holds("memory.total", Operator::Eq, vec![json!(16384.0)]));
        assert!(!holds("memory.total", Operator::Eq, vec![json!("16384")]));
        assert!(holds("flag", Operator::Eq, vec![json!(true)]));
        assert!(holds("os", Operator::Ne, vec![json!("windows")]));
        assert!(!holds("os", Operator::Ne, vec![json!("linux")]));
        assert!(!holds("gpu", Operator::Ne, vec![json!("x")]));
        assert!(!holds("gpu", Operator::Eq, vec![json!(null)]));
        assert_eq!(
            reason("os", Operator::Eq, vec![json!("darwin")]),
            "os EQ darwin: have linux"
        );
    }

    #[test]
    fn in_and_not_in() {
        assert!(holds(
            "arch",
            Operator::In,
            vec![json!("x86_64"), json!("aarch64")]
        ));
        assert!(!holds("arch", Operator::In, vec![json!("riscv64")]));
        assert!(!holds("gpu", Operator::In, vec![json!("x")]));
        assert!(holds("gpu", Operator::NotIn, vec![json!("x")]));
        assert!(holds("arch", Operator::NotIn, vec![json!("riscv64")]));
        assert!(!holds("arch", Operator::NotIn, vec![json!("x86_64")]));
        // Arrays are tested item by item.
        assert!(holds("tags", Operator::In, vec![json!("docker")]));
        assert!(!holds("tags", Operator::NotIn, vec![json!("docker")]));
        assert!(holds("tags", Operator::NotIn, vec![json!("gpu")]));
        assert_eq!(
            reason("arch", Operator::In, vec![json!("a"), json!("b")]),
            "arch IN (a, b): have x86_64"
        );
    }

    #[test]
    fn ordering_numbers() {
        assert!(holds("memory.total", Operator::Gte, vec![json!(16384)]));
        assert!(!holds("memory.total", Operator::Gt, vec![json!(16384)]));
        assert!(holds("memory.total", Operator::Lt, vec![json!(32768)]));
        assert!(holds("memory.total", Operator::Lte, vec![json!(16384)]));
        assert!(holds("loadavg.1min", Operator::Lt, vec![json!("0.75")]));
        assert!(!holds("loadavg.1min", Operator::Gt, vec![json!(0.5)]));
    }

    #[test]
    fn ordering_versions() {
        assert!(holds(
            "software.git.version",
            Operator::Gte,
            vec![json!("2.30")]
        ));
        assert!(!holds(
            "software.git.version",
            Operator::Gte,
            vec![json!("2.40")]
        ));
        assert!(holds(
            "software.node.version",
            Operator::Lt,
            vec![json!(20)]
        ));
        assert!(holds(
            "software.rustc.version",
            Operator::Gt,
            vec![json!("1.94")]
        ));
        assert!(holds(
            "software.rustc.version",
            Operator::Lt,
            vec![json!("1.95.0")]
        ));
    }

    #[test]
    fn ordering_never_compares_lexically() {
        assert_eq!(
            reason("os", Operator::Gt, vec![json!("1")]),
            "os GT 1: have linux (not a number or version)"
        );
        assert_eq!(
            reason("flag", Operator::Gt, vec![json!(1)]),
            "flag GT 1: have true (boolean is not a number or version)"
        );
        assert_eq!(
            reason("gpu", Operator::Lt, vec![json!(1)]),
            "gpu LT 1: missing"
        );
    }

    #[test]
    fn version_operator() {
        assert!(holds(
            "software.node.version",
            Operator::Version,
            vec![json!("^18")]
        ));
        assert!(holds(
            "software.git.version",
            Operator::Version,
            vec![json!(">=2.30, <3")]
        ));
        assert_eq!(
            reason(
                "software.node.version",
                Operator::Version,
                vec![json!("^20")]
            ),
            "software.node.version VERSION ^20: have 18.19.0"
        );
        assert_eq!(
            reason("os", Operator::Version, vec![json!("^1")]),
            "os VERSION ^1: have linux (not a version)"
        );
    }

    #[test]
    fn regex_operator() {
        assert!(holds("hostname", Operator::Regex, vec![json!("^build-")]));
        assert!(holds("hostname", Operator::Regex, vec![json!("\\d")]));
        assert!(!holds("hostname", Operator::Regex, vec![json!("^ci-")]));
        assert_eq!(
            reason("memory.total", Operator::Regex, vec![json!("1")]),
            "memory.total REGEX 1: have 16384 (number is not a string)"
        );
    }

    #[test]
    fn contains_and_contains_any() {
        assert!(holds("packages", Operator::Contains, vec![json!("git")]));
        assert!(!holds("packages", Operator::Contains, vec![json!("node")]));
        assert!(holds("hostname", Operator::Contains, vec![json!("uild")]));
        assert!(holds(
            "packages",
            Operator::ContainsAny,
            vec![json!("node"), json!("deno")]
        ));
        assert!(!holds(
            "packages",
            Operator::ContainsAny,
            vec![json!("node"), json!("uv")]
        ));
        assert!(!holds("memory", Operator::Contains, vec![json!("total")]));
        assert_eq!(
            reason(
                "packages",
                Operator::ContainsAny,
                vec![json!("node"), json!("uv")]
            ),
            "packages CONTAINS_ANY (node, uv): have [\"git\",\"deno\"]"
        );
    }

    #[test]
    fn missing_key_fails_all_but_not_exists_and_not_in() {
        for op in Operator::ALL {
            let values = match op.arity() {
                Arity::Zero => vec![],
                _ => vec![json!("1")],
            };
            assert_eq!(
                holds("absent.key", op, values),
                op.holds_when_missing(),
                "{op}"
            );
        }
    }

    #[test]
    fn capability_refs() {
        let p = |name: &str, major| Placement {
            capabilities: vec![CapabilityRef {
                name: name.into(),
                major,
            }],
            ..Placement::default()
        };
        let c = compile(&p("comm.gateway", 2)).unwrap();
        assert!(c.satisfied_by(&doc()));
        assert_eq!(
            compile(&p("comm.gateway", 1))
                .unwrap()
                .unmet(&doc())
                .unwrap()
                .to_string(),
            "capability comm.gateway@1 has version 2.0.0"
        );
        assert_eq!(
            compile(&p("ai.llm", 1))
                .unwrap()
                .unmet(&doc())
                .unwrap()
                .to_string(),
            "capability ai.llm@1 unhealthy: missing parameter API_KEY"
        );
        assert_eq!(
            compile(&p("ai.vision", 1))
                .unwrap()
                .unmet(&doc())
                .unwrap()
                .to_string(),
            "capability ai.vision@1 missing"
        );
    }

    #[test]
    fn json_schema_first_failure() {
        let p = Placement {
            json_schema: Some(json!({
                "type": "object",
                "required": ["os"],
                "properties": {"memory": {"properties": {"total": {"minimum": 32768}}}}
            })),
            ..Placement::default()
        };
        let c = compile(&p).unwrap();
        match c.unmet(&doc()).unwrap() {
            Unmet::Schema {
                instance_path,
                keyword,
                ..
            } => {
                assert_eq!(instance_path, "/memory/total");
                assert_eq!(keyword, "minimum");
            }
            other => panic!("{other:?}"),
        }
        let ok = Placement {
            json_schema: Some(json!({"required": ["os"]})),
            ..Placement::default()
        };
        assert!(compile(&ok).unwrap().satisfied_by(&doc()));
    }

    #[test]
    fn compile_errors_name_the_field() {
        let cases: Vec<(Placement, &str)> = vec![
            (req("os", Operator::Eq, vec![]), "requirements[0].values"),
            (
                req("os", Operator::Exists, vec![json!(1)]),
                "requirements[0].values",
            ),
            (req("os", Operator::In, vec![]), "requirements[0].values"),
            (req("", Operator::Exists, vec![]), "requirements[0].key"),
            (
                req("os", Operator::Regex, vec![json!("(")]),
                "requirements[0].values[0]",
            ),
            (
                req("os", Operator::Regex, vec![json!(1)]),
                "requirements[0].values[0]",
            ),
            (
                req("os", Operator::Version, vec![json!("^a")]),
                "requirements[0].values[0]",
            ),
            (
                req("os", Operator::Gt, vec![json!("abc")]),
                "requirements[0].values[0]",
            ),
            (
                req("os", Operator::Gt, vec![json!(true)]),
                "requirements[0].values[0]",
            ),
            (
                Placement {
                    json_schema: Some(json!({"type": 5})),
                    ..Placement::default()
                },
                "json_schema",
            ),
            (
                Placement {
                    json_schema: Some(json!([1])),
                    ..Placement::default()
                },
                "json_schema",
            ),
            (
                Placement {
                    required_tags: vec![String::new()],
                    ..Placement::default()
                },
                "required_tags[0]",
            ),
            (
                Placement {
                    preferences: vec![Preference {
                        weight: 0,
                        condition: PreferenceCondition::Tag("gpu".into()),
                    }],
                    ..Placement::default()
                },
                "preferences[0].weight",
            ),
            (
                Placement {
                    capabilities: vec![CapabilityRef {
                        name: "a..b".into(),
                        major: 1,
                    }],
                    ..Placement::default()
                },
                "capabilities[0].name",
            ),
        ];
        for (p, field) in cases {
            let err = compile(&p).unwrap_err();
            assert_eq!(err.field, field, "{err}");
        }
    }

    #[test]
    fn preferences_score() {
        let p = Placement {
            preferences: vec![
                Preference {
                    weight: 5,
                    condition: PreferenceCondition::Tag("docker".into()),
                },
                Preference {
                    weight: 3,
                    condition: PreferenceCondition::Tag("gpu".into()),
                },
                Preference {
                    weight: 2,
                    condition: PreferenceCondition::Requirement(Requirement::new(
                        "memory.total",
                        Operator::Gte,
                        vec![json!(8192)],
                    )),
                },
                Preference {
                    weight: 7,
                    condition: PreferenceCondition::Capability(CapabilityRef {
                        name: "ai.llm".into(),
                        major: 1,
                    }),
                },
            ],
            ..Placement::default()
        };
        let c = compile(&p).unwrap();
        assert_eq!(c.preference_score(&doc()), 7);
        assert_eq!(c.max_preference_score(), 17);
        assert!(c.satisfied_by(&doc()));
    }

    #[test]
    fn merge_combines_schemas() {
        let mut a = Placement {
            required_tags: vec!["a".into()],
            json_schema: Some(json!({"required": ["x"]})),
            ..Placement::default()
        };
        a.merge(Placement {
            required_tags: vec!["b".into()],
            json_schema: Some(json!({"required": ["y"]})),
            ..Placement::default()
        });
        assert_eq!(a.required_tags, vec!["a", "b"]);
        assert_eq!(
            a.json_schema,
            Some(json!({"allOf": [{"required": ["x"]}, {"required": ["y"]}]}))
        );
    }

    #[test]
    fn serde_shape() {
        let p: Placement = serde_json::from_value(json!({
            "required_tags": ["linux"],
            "requirements": [{"key": "memory.total", "operator": "GTE", "values": [16384]}],
            "capabilities": [{"name": "ai.llm", "major": 1}],
            "preferences": [{"weight": 5, "tag": "gpu"}, {"weight": 1, "requirement": {"key": "os", "operator": "EXISTS"}}]
        }))
        .unwrap();
        assert_eq!(
            p.preferences[0].condition,
            PreferenceCondition::Tag("gpu".into())
        );
        let back = serde_json::to_value(&p).unwrap();
        assert_eq!(back["preferences"][0], json!({"weight": 5, "tag": "gpu"}));
    }
}
