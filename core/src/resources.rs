//! Consumable resources: what an agent offers ([`Offer`], read from the `resources` section of
//! its document, with its slots), what its live leases hold ([`Held`]), what a task needs
//! ([`Need`]), and the two questions matching asks: could the agent ever take the task
//! ([`never_fits`]), and what would it give the task now ([`assign`]).
//!
//! The `resources` section, as the runners detect it and the tiers may override it:
//!
//! ```json
//! {"cpu_millicores": 8000, "memory_mb": 32003,
//!  "gpus": [{"index": 0, "uuid": "GPU-5a4f", "model": "NVIDIA H100 80GB HBM3", "memory_mb": 81559}],
//!  "licenses": {"matlab": 2}}
//! ```
//!
//! - `cpu_millicores` and `memory_mb` are amounts; an agent without one offers none of it.
//! - `gpus` is a list of devices; a device is named by its `uuid` (a non-empty string), else by
//!   its `index`, else by its position. A device selector is evaluated against the device's
//!   object, so its fields are what a task may constrain (`memory_mb>=40000, model~H100`).
//! - Any other non-negative integer under the section, however deep (through objects only), is a
//!   named countable resource under its dotted path below `resources` (`licenses.matlab`).
//! - Slots are one resource among them: the agent's capacity, not part of the document.
//!
//! A lease holds a [`Claim`]: the amounts and the device ids it was given. Assignment takes
//! free devices that pass the filter in the order the agent lists them. Everything here is pure;
//! the store re-checks a claim against the leases it has under the agent's lock.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

/// The document key of the resources section.
pub const SECTION: &str = "resources";

/// One device an agent offers, borrowed from its document.
#[derive(Debug, Clone, PartialEq)]
pub struct Device<'a> {
    /// How leases name it: its uuid, else its index, else its position.
    pub id: Cow<'a, str>,
    /// The device's object in the document (what a device selector reads).
    pub fields: &'a Value,
}

/// What an agent offers, read from (and borrowing) its document: reading it allocates nothing
/// for a document with no named resources and no GPU without a uuid, since matching reads it
/// for every agent it visits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Offer<'a> {
    /// CPU in millicores; `None` when the agent does not say.
    pub cpu_millicores: Option<u64>,
    /// Memory in MB; `None` when the agent does not say.
    pub memory_mb: Option<u64>,
    /// GPUs, in the order the agent lists them.
    pub gpus: Vec<Device<'a>>,
    /// Named countable resources by dotted path below the section.
    pub named: BTreeMap<String, u64>,
}

fn amount(value: &Value) -> Option<u64> {
    value.as_u64().or_else(|| {
        value
            .as_f64()
            .filter(|f| f.is_finite() && *f >= 0.0 && f.fract() == 0.0 && *f < 1.8e19)
            // Checked finite, non-negative, integral and in range just above.
            .map(|f| f as u64)
    })
}

impl<'a> Offer<'a> {
    /// The offer in `document`'s `resources` section (empty when absent or not an object).
    pub fn of(document: &'a Value) -> Offer<'a> {
        document
            .get(SECTION)
            .map(Offer::of_section)
            .unwrap_or_default()
    }

    /// The offer a `resources` section itself says (empty when it is not an object).
    pub fn of_section(section: &'a Value) -> Offer<'a> {
        let mut offer = Offer::default();
        let Some(section) = section.as_object() else {
            return offer;
        };
        for (key, value) in section {
            match key.as_str() {
                "cpu_millicores" => offer.cpu_millicores = amount(value),
                "memory_mb" => offer.memory_mb = amount(value),
                "gpus" => {
                    offer.gpus = value
                        .as_array()
                        .map(|items| {
                            items
                                .iter()
                                .enumerate()
                                .map(|(position, fields)| Device {
                                    id: device_id(fields, position),
                                    fields,
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                }
                _ => collect_named(value, key, &mut offer.named),
            }
        }
        offer
    }
}

fn device_id(fields: &Value, position: usize) -> Cow<'_, str> {
    if let Some(uuid) = fields.get("uuid").and_then(Value::as_str)
        && !uuid.is_empty()
    {
        return Cow::Borrowed(uuid);
    }
    Cow::Owned(match fields.get("index").and_then(amount) {
        Some(index) => index.to_string(),
        None => position.to_string(),
    })
}

fn collect_named(value: &Value, path: &str, out: &mut BTreeMap<String, u64>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                collect_named(value, &format!("{path}.{key}"), out);
            }
        }
        other => {
            if let Some(n) = amount(other) {
                out.insert(path.to_owned(), n);
            }
        }
    }
}

/// What a task needs of an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    /// Slots (at least 1).
    pub slots: u32,
    /// CPU in millicores.
    pub cpu_millicores: u64,
    /// Memory in MB.
    pub memory_mb: u64,
    /// How many GPUs.
    pub gpus: u32,
    /// The GPU filter as people read it (`memory_mb>=40000, model~H100`), empty when any GPU
    /// will do.
    pub gpu_filter: String,
    /// Named countable resources by dotted path.
    pub named: BTreeMap<String, u64>,
}

impl Default for Need {
    fn default() -> Self {
        Need {
            slots: 1,
            cpu_millicores: 0,
            memory_mb: 0,
            gpus: 0,
            gpu_filter: String::new(),
            named: BTreeMap::new(),
        }
    }
}

impl Need {
    /// Whether it needs nothing but one slot (every check then reduces to the slot count).
    pub fn is_one_slot(&self) -> bool {
        self.slots == 1
            && self.cpu_millicores == 0
            && self.memory_mb == 0
            && self.gpus == 0
            && self.named.is_empty()
    }
}

/// What one lease holds: the amounts it was given and the devices assigned to it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Claim {
    /// Slots.
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub slots: u32,
    /// CPU in millicores.
    #[serde(skip_serializing_if = "is_zero")]
    pub cpu_millicores: u64,
    /// Memory in MB.
    #[serde(skip_serializing_if = "is_zero")]
    pub memory_mb: u64,
    /// The ids of the GPUs assigned (see [`Device::id`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<String>,
    /// Named countable resources by dotted path.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub named: BTreeMap<String, u64>,
    /// For a task that spreads by a document key, the agent's value there when it was granted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spread: Option<SpreadMark>,
}

/// A lease's place in a spread: the document key its task spreads by, and the value the agent
/// had there when the lease was granted. Tasks spreading by one key go first to the agents whose
/// value the fewest live leases of such tasks hold.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpreadMark {
    /// The dotted document key.
    pub key: String,
    /// The agent's value there, as [`spread_value`] reads it.
    pub value: String,
}

/// An agent's value at `key` for spreading: a scalar as people read it, and `""` for a missing
/// key or a value that is an array or object (those agents form one group).
pub fn spread_value(document: &Value, key: &str) -> String {
    match crate::document::lookup(document, key) {
        Some(Value::Array(_) | Value::Object(_)) | None => String::new(),
        Some(v) => crate::document::display(v),
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

impl Claim {
    /// The claim of a lease that holds one slot and nothing else.
    pub fn one_slot() -> Claim {
        Claim {
            slots: 1,
            ..Claim::default()
        }
    }

    /// Whether it holds one slot and nothing else (the store then keeps no claim text).
    pub fn is_one_slot(&self) -> bool {
        self.slots == 1
            && self.cpu_millicores == 0
            && self.memory_mb == 0
            && self.gpus.is_empty()
            && self.named.is_empty()
            && self.spread.is_none()
    }
}

/// What an agent's live leases hold beyond slots, by the task each lease is for: a claim of one
/// slot alone is not recorded (the slots are counted apart).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    claims: HashMap<uuid::Uuid, Claim>,
    cpu_millicores: u64,
    memory_mb: u64,
    gpus: BTreeSet<String>,
    named: BTreeMap<String, u64>,
}

impl Held {
    /// What the given claims hold together.
    pub fn of(claims: impl IntoIterator<Item = (uuid::Uuid, Claim)>) -> Held {
        let mut held = Held::default();
        for (task, claim) in claims {
            held.hold(task, claim);
        }
        held
    }

    /// Records `claim` as held for `task` (replacing what it held before); a claim of one slot
    /// alone only removes what the task held.
    pub fn hold(&mut self, task: uuid::Uuid, claim: Claim) {
        self.release(task);
        if claim.is_one_slot() {
            return;
        }
        self.cpu_millicores = self.cpu_millicores.saturating_add(claim.cpu_millicores);
        self.memory_mb = self.memory_mb.saturating_add(claim.memory_mb);
        self.gpus.extend(claim.gpus.iter().cloned());
        for (name, n) in &claim.named {
            let held = self.named.entry(name.clone()).or_default();
            *held = held.saturating_add(*n);
        }
        self.claims.insert(task, claim);
    }

    /// Gives back what `task` held; what it was.
    pub fn release(&mut self, task: uuid::Uuid) -> Option<Claim> {
        let claim = self.claims.remove(&task)?;
        self.cpu_millicores = self.cpu_millicores.saturating_sub(claim.cpu_millicores);
        self.memory_mb = self.memory_mb.saturating_sub(claim.memory_mb);
        for gpu in &claim.gpus {
            self.gpus.remove(gpu);
        }
        for (name, n) in &claim.named {
            if let Some(held) = self.named.get_mut(name) {
                *held = held.saturating_sub(*n);
                if *held == 0 {
                    self.named.remove(name);
                }
            }
        }
        Some(claim)
    }

    /// Every recorded claim, by task.
    pub fn claims(&self) -> impl Iterator<Item = (&uuid::Uuid, &Claim)> {
        self.claims.iter()
    }

    /// What `task` holds.
    pub fn claim(&self, task: uuid::Uuid) -> Option<&Claim> {
        self.claims.get(&task)
    }

    /// The spread marks of the recorded claims.
    pub fn spread_marks(&self) -> impl Iterator<Item = &SpreadMark> {
        self.claims.values().filter_map(|c| c.spread.as_ref())
    }

    /// Whether the device is held by some lease.
    pub fn holds_gpu(&self, id: &str) -> bool {
        self.gpus.contains(id)
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }
}

/// Which resource falls short, by how much.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shortfall {
    /// Slots.
    Slots {
        /// Needed.
        need: u32,
        /// Free now.
        free: u32,
        /// The agent's capacity.
        total: u32,
    },
    /// CPU.
    Cpu {
        /// Needed, in millicores.
        need: u64,
        /// Free now.
        free: u64,
        /// Offered; `None` when the agent offers none.
        total: Option<u64>,
    },
    /// Memory.
    Memory {
        /// Needed, in MB.
        need: u64,
        /// Free now.
        free: u64,
        /// Offered; `None` when the agent offers none.
        total: Option<u64>,
    },
    /// GPUs.
    Gpus {
        /// Needed.
        need: u32,
        /// The filter, as people read it (empty: any GPU).
        filter: String,
        /// Devices that pass the filter and are free now.
        free: u32,
        /// Devices that pass the filter.
        matching: u32,
        /// Devices offered.
        total: u32,
    },
    /// A named countable resource.
    Named {
        /// Its dotted path.
        name: String,
        /// Needed.
        need: u64,
        /// Free now.
        free: u64,
        /// Offered; `None` when the agent offers none.
        total: Option<u64>,
    },
}

fn gpus_phrase(need: u32, filter: &str) -> String {
    let noun = if need == 1 { "GPU" } else { "GPUs" };
    if filter.is_empty() {
        format!("{need} {noun}")
    } else {
        format!("{need} {noun} with {filter}")
    }
}

impl Shortfall {
    /// Whether the agent could never cover the need, however many leases end.
    pub fn is_permanent(&self) -> bool {
        match self {
            Shortfall::Slots { need, total, .. } => need > total,
            Shortfall::Cpu { need, total, .. }
            | Shortfall::Memory { need, total, .. }
            | Shortfall::Named { need, total, .. } => total.is_none_or(|t| *need > t),
            Shortfall::Gpus { need, matching, .. } => need > matching,
        }
    }

    /// A short phrase agents short the same way share in a summary line (`too few GPUs with
    /// memory_mb>=40000`, `short of free memory`).
    pub fn summary(&self) -> String {
        let (few, what) = match self {
            Shortfall::Slots { .. } => (true, "slots".to_owned()),
            Shortfall::Cpu { .. } => (false, "cpu".to_owned()),
            Shortfall::Memory { .. } => (false, "memory".to_owned()),
            Shortfall::Gpus { filter, .. } if filter.is_empty() => (true, "GPUs".to_owned()),
            Shortfall::Gpus { filter, .. } => (true, format!("GPUs with {filter}")),
            Shortfall::Named { name, .. } => (false, name.clone()),
        };
        match (self.is_permanent(), few) {
            (true, true) => format!("too few {what}"),
            (true, false) => format!("too little {what}"),
            (false, _) => format!("short of free {what}"),
        }
    }
}

impl fmt::Display for Shortfall {
    /// `needs 2 GPUs with memory_mb>=40000: 1 of 4 free`, `needs memory 4096 MB: 2048 free`;
    /// for a permanent shortfall, what the agent has (`needs memory 4096 MB: has 2048`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let permanent = self.is_permanent();
        let amounts = |f: &mut fmt::Formatter<'_>, free: u64, total: Option<u64>| match total {
            None => f.write_str("offers none"),
            Some(total) if permanent => write!(f, "has {total}"),
            Some(_) => write!(f, "{free} free"),
        };
        match self {
            Shortfall::Slots { need, free, total } => {
                if permanent {
                    write!(f, "needs {need} slots: has {total}")
                } else {
                    write!(f, "needs {need} slots: {free} of {total} free")
                }
            }
            Shortfall::Cpu { need, free, total } => {
                write!(f, "needs cpu {need} millicores: ")?;
                amounts(f, *free, *total)
            }
            Shortfall::Memory { need, free, total } => {
                write!(f, "needs memory {need} MB: ")?;
                amounts(f, *free, *total)
            }
            Shortfall::Named {
                name,
                need,
                free,
                total,
            } => {
                write!(f, "needs {name} {need}: ")?;
                amounts(f, *free, *total)
            }
            Shortfall::Gpus {
                need,
                filter,
                free,
                matching,
                total,
            } => {
                write!(f, "needs {}: ", gpus_phrase(*need, filter))?;
                if permanent {
                    if filter.is_empty() {
                        write!(f, "has {total}")
                    } else {
                        write!(f, "{matching} of its {total} match")
                    }
                } else {
                    write!(f, "{free} of {matching} free")
                }
            }
        }
    }
}

/// The first resource the agent could never cover, as if none of its leases held anything:
/// `None` when it could take the task once enough of its leases end. `device_ok` is the GPU
/// filter.
pub fn never_fits(
    need: &Need,
    offer: &Offer,
    capacity: u32,
    device_ok: impl Fn(&Value) -> bool,
) -> Option<Shortfall> {
    shortfall(need, offer, capacity, 0, &Held::default(), &device_ok).err()
}

/// What the agent would give the task now: a claim of free devices that pass `device_ok` (in the
/// order the agent lists them) and the amounts needed, or the first resource short. `active` is
/// the slots its leases hold (the server counts them; `held` may know only the claims of some).
pub fn assign(
    need: &Need,
    offer: &Offer,
    capacity: u32,
    active: u32,
    held: &Held,
    device_ok: impl Fn(&Value) -> bool,
) -> Result<Claim, Shortfall> {
    shortfall(need, offer, capacity, active, held, &device_ok)
}

fn shortfall(
    need: &Need,
    offer: &Offer,
    capacity: u32,
    active: u32,
    held: &Held,
    device_ok: &dyn Fn(&Value) -> bool,
) -> Result<Claim, Shortfall> {
    let free_slots = capacity.saturating_sub(active);
    if need.slots > free_slots {
        return Err(Shortfall::Slots {
            need: need.slots,
            free: free_slots,
            total: capacity,
        });
    }
    let check = |need: u64, total: Option<u64>, held: u64| match total {
        Some(total) if need <= total.saturating_sub(held) => Ok(()),
        _ => Err((need, total.unwrap_or(0).saturating_sub(held), total)),
    };
    if need.cpu_millicores > 0 {
        check(
            need.cpu_millicores,
            offer.cpu_millicores,
            held.cpu_millicores,
        )
        .map_err(|(need, free, total)| Shortfall::Cpu { need, free, total })?;
    }
    if need.memory_mb > 0 {
        check(need.memory_mb, offer.memory_mb, held.memory_mb)
            .map_err(|(need, free, total)| Shortfall::Memory { need, free, total })?;
    }
    for (name, n) in &need.named {
        let held = held.named.get(name).copied().unwrap_or(0);
        check(*n, offer.named.get(name).copied(), held).map_err(|(need, free, total)| {
            Shortfall::Named {
                name: name.clone(),
                need,
                free,
                total,
            }
        })?;
    }
    let mut gpus = Vec::new();
    if need.gpus > 0 {
        let matching: Vec<&Device> = offer.gpus.iter().filter(|d| device_ok(d.fields)).collect();
        let wanted = need.gpus as usize;
        gpus = matching
            .iter()
            .filter(|d| !held.holds_gpu(&d.id))
            .take(wanted)
            .map(|d| d.id.clone().into_owned())
            .collect();
        if gpus.len() < wanted {
            let free = matching.iter().filter(|d| !held.holds_gpu(&d.id)).count();
            return Err(Shortfall::Gpus {
                need: need.gpus,
                filter: need.gpu_filter.clone(),
                free: u32::try_from(free).unwrap_or(u32::MAX),
                matching: u32::try_from(matching.len()).unwrap_or(u32::MAX),
                total: u32::try_from(offer.gpus.len()).unwrap_or(u32::MAX),
            });
        }
    }
    Ok(Claim {
        slots: need.slots,
        cpu_millicores: need.cpu_millicores,
        memory_mb: need.memory_mb,
        gpus,
        named: need.named.clone(),
        spread: None,
    })
}

/// Whether `claim` still fits the agent beside what `held` holds (the store's re-check under
/// the agent's lock): its devices exist and none is held, and every amount is within the
/// offer. Slots are counted by the store itself. The first problem, as people read it.
pub fn recheck(claim: &Claim, offer: &Offer, held: &Held) -> Result<(), String> {
    for gpu in &claim.gpus {
        if !offer.gpus.iter().any(|d| d.id == gpu.as_str()) {
            return Err(format!("GPU {gpu} is not offered"));
        }
        if held.holds_gpu(gpu) {
            return Err(format!("GPU {gpu} is held by another lease"));
        }
    }
    let within = |need: u64, total: Option<u64>, held: u64| {
        need == 0 || total.is_some_and(|t| held.saturating_add(need) <= t)
    };
    if !within(
        claim.cpu_millicores,
        offer.cpu_millicores,
        held.cpu_millicores,
    ) {
        return Err(format!(
            "cpu {} millicores is not free",
            claim.cpu_millicores
        ));
    }
    if !within(claim.memory_mb, offer.memory_mb, held.memory_mb) {
        return Err(format!("memory {} MB is not free", claim.memory_mb));
    }
    for (name, n) in &claim.named {
        let have = held.named.get(name).copied().unwrap_or(0);
        if !within(*n, offer.named.get(name).copied(), have) {
            return Err(format!("{name} {n} is not free"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn offer() -> Offer<'static> {
        let doc = Box::leak(Box::new(json!({"resources": {
            "cpu_millicores": 8000, "memory_mb": 32000,
            "gpus": [
                {"index": 0, "uuid": "GPU-a", "model": "H100", "memory_mb": 81559},
                {"index": 1, "uuid": "GPU-b", "model": "H100", "memory_mb": 81559},
                {"index": 2, "model": "T4", "memory_mb": 15360},
                {"model": "T4"},
            ],
            "licenses": {"matlab": 2}, "label": "not counted", "negative": -1,
        }})));
        Offer::of(doc)
    }

    fn task(n: u128) -> uuid::Uuid {
        uuid::Uuid::from_u128(n)
    }

    #[test]
    fn the_offer_reads_amounts_devices_and_named_counts() {
        let o = offer();
        assert_eq!(o.cpu_millicores, Some(8000));
        assert_eq!(o.memory_mb, Some(32000));
        let ids: Vec<&str> = o.gpus.iter().map(|d| d.id.as_ref()).collect();
        assert_eq!(ids, ["GPU-a", "GPU-b", "2", "3"]);
        assert_eq!(o.named, BTreeMap::from([("licenses.matlab".to_owned(), 2)]));
        assert_eq!(Offer::of(&json!({"resources": "x"})), Offer::default());
    }

    #[test]
    fn assignment_takes_free_matching_devices_and_says_what_is_short() {
        let o = offer();
        let h100 = |d: &Value| d["model"] == "H100";
        let need = Need {
            gpus: 2,
            gpu_filter: "model=H100".into(),
            memory_mb: 4096,
            ..Need::default()
        };
        let claim = assign(&need, &o, 4, 0, &Held::default(), h100).unwrap();
        assert_eq!(claim.gpus, ["GPU-a", "GPU-b"]);
        let held = Held::of([(task(1), claim)]);
        let short = assign(&need, &o, 4, 1, &held, h100).unwrap_err();
        assert_eq!(
            short.to_string(),
            "needs 2 GPUs with model=H100: 0 of 2 free"
        );
        assert!(!short.is_permanent());
        assert_eq!(short.summary(), "short of free GPUs with model=H100");
        let three = Need { gpus: 3, ..need };
        let never = never_fits(&three, &o, 4, h100).unwrap();
        assert_eq!(
            never.to_string(),
            "needs 3 GPUs with model=H100: 2 of its 4 match"
        );
        assert!(never.is_permanent());
        let memory = Need {
            memory_mb: 40000,
            ..Need::default()
        };
        assert_eq!(
            never_fits(&memory, &o, 4, |_| true).unwrap().to_string(),
            "needs memory 40000 MB: has 32000"
        );
        let matlab = Need {
            named: BTreeMap::from([("licenses.matlab".to_owned(), 2)]),
            ..Need::default()
        };
        let held = Held::of([(
            task(2),
            assign(&matlab, &o, 4, 0, &Held::default(), |_| true).unwrap(),
        )]);
        assert_eq!(
            assign(&matlab, &o, 4, 1, &held, |_| true)
                .unwrap_err()
                .to_string(),
            "needs licenses.matlab 2: 0 free"
        );
        let slots = Need {
            slots: 5,
            ..Need::default()
        };
        assert_eq!(
            never_fits(&slots, &o, 4, |_| true).unwrap().to_string(),
            "needs 5 slots: has 4"
        );
    }

    #[test]
    fn released_claims_come_back_and_recheck_refuses_a_held_device() {
        let o = offer();
        let need = Need {
            gpus: 1,
            cpu_millicores: 6000,
            ..Need::default()
        };
        let first = assign(&need, &o, 4, 0, &Held::default(), |_| true).unwrap();
        let mut held = Held::of([(task(1), first.clone())]);
        assert_eq!(
            recheck(&first, &o, &held).unwrap_err(),
            "GPU GPU-a is held by another lease"
        );
        assert!(
            assign(&need, &o, 4, 1, &held, |_| true).is_err(),
            "cpu is short"
        );
        assert_eq!(held.release(task(1)), Some(first.clone()));
        assert!(held.is_empty());
        assert_eq!(assign(&need, &o, 4, 0, &held, |_| true).unwrap(), first);
        assert!(recheck(&first, &o, &held).is_ok());
    }
}
