//! Submits: the tasks a `SubmitTask` or `SubmitTasks` call asks for, each
//! validated before anything is stored (a bad field is INVALID_ARGUMENT
//! naming it, `tasks[i].field` in a call of many, and nothing is written),
//! the call sized against the largest message its answer may take, the
//! namespaces' queue caps admitting its tasks all or none, the concurrency
//! limits they give set, then handed to the dispatcher in one batch and
//! answered each with its queued reason.

use std::collections::BTreeMap;

use switchyard_core::kinds::check_kind;
use switchyard_core::placement as core_placement;
use switchyard_proto::v1 as pb;

use super::convert::{struct_to_json, timestamp_ms};
use super::{Api, duration_within, invalid, namespace};
use crate::auth::{Caller, Need};
use crate::error::{Error, Result};
use crate::model::{
    DEFAULT_BACKOFF_BASE_MS, DEFAULT_RETRY_JITTER, DEFAULT_RETRY_MULTIPLIER, Deadlines, Fairness,
    MAX_BACKOFF_MS, MAX_CONCURRENCY_LIMIT, MAX_FAIRNESS_WEIGHT, MAX_RETRY_MULTIPLIER, NewTask,
    QueuedReason, RetryPolicy,
};
use crate::wire;

/// Longest accepted idempotency key and label.
const MAX_NAME: usize = 256;

/// The most tasks one `SubmitTasks` call queues.
const MAX_SUBMITS_AT_ONCE: usize = 1_000;

/// The most a task as stored (`Task`, in a `SubmitTaskResponse`) takes on
/// the wire beyond the fields of the `SubmitTaskRequest` it came from: its
/// ids, state, times, lease, defaults filled in, and its place in the list.
const ANSWER_BYTES_PER_TASK: usize = 1_024;

impl Api {
    /// Submits `requests` (see the module doc), `field` naming the list
    /// they came in when there are several; answers each in order.
    pub(super) async fn submit(
        &self,
        caller: &Caller,
        requests: Vec<pb::SubmitTaskRequest>,
        field: Option<&str>,
    ) -> Result<Vec<pb::SubmitTaskResponse>> {
        let (tasks, compiled): (Vec<_>, Vec<_>) = self
            .new_tasks(caller, requests, field)
            .await?
            .into_iter()
            .unzip();
        let submitted = self
            .dispatcher
            .submit_tasks(tasks.into_iter().zip(&compiled).collect())
            .await?;
        let mut limits = BTreeMap::new();
        let mut answers = Vec::with_capacity(submitted.len());
        for submitted in &submitted {
            let mut reason = submitted.queued_reason;
            if reason.is_some_and(|r| r != QueuedReason::Backoff)
                && self.limit_full(&submitted.task, &mut limits).await?
            {
                reason = Some(QueuedReason::ConcurrencyLimit);
            }
            answers.push(pb::SubmitTaskResponse {
                task: Some(wire::task_with_reason(&submitted.task, reason)),
                created: submitted.created,
            });
        }
        Ok(answers)
    }

    /// A `SubmitTasks` call's size: from 1 to 1,000 tasks, and an answer
    /// that cannot pass the largest message (it holds every task as
    /// stored: refused now rather than stored and then not answered).
    pub(super) fn check_call(&self, requests: &[pb::SubmitTaskRequest]) -> Result<()> {
        if !(1..=MAX_SUBMITS_AT_ONCE).contains(&requests.len()) {
            return Err(invalid(
                "tasks",
                &format!(
                    "holds {} tasks: give from 1 to {MAX_SUBMITS_AT_ONCE}",
                    requests.len()
                ),
            ));
        }
        let answer: usize = requests
            .iter()
            .map(|task| prost::Message::encoded_len(task) + ANSWER_BYTES_PER_TASK)
            .sum();
        let largest = self.settings.max_message_bytes;
        if answer > largest {
            return Err(invalid(
                "tasks",
                &format!(
                    "the answer to these {} tasks could take {answer} bytes, past the largest \
                     message of {largest} (--max-message-bytes): send fewer a call",
                    requests.len()
                ),
            ));
        }
        Ok(())
    }

    /// The tasks a submit asks for, validated before anything is stored (a
    /// bad field is INVALID_ARGUMENT naming it, under `field` and the
    /// task's index when there are several, and a namespace the caller may
    /// not submit to is PERMISSION_DENIED naming the task so), each with its placement
    /// compiled; then the namespaces' queue caps admit them, and the
    /// concurrency limits they give are set. A task may rely on a limit an
    /// earlier task of the same call gives its key.
    async fn new_tasks(
        &self,
        caller: &Caller,
        requests: Vec<pb::SubmitTaskRequest>,
        field: Option<&str>,
    ) -> Result<Vec<(NewTask, core_placement::CompiledPlacement)>> {
        let under = |i: usize, err: Error| match (field, err) {
            (Some(list), Error::Invalid { field, reason }) => Error::Invalid {
                field: format!("{list}[{i}].{field}"),
                reason,
            },
            (Some(list), Error::PermissionDenied(why)) => {
                Error::PermissionDenied(format!("{list}[{i}]: {why}"))
            }
            (_, err) => err,
        };
        let mut checked = Vec::with_capacity(requests.len());
        for (i, req) in requests.into_iter().enumerate() {
            checked.push(self.check_task(caller, req).map_err(|err| under(i, err))?);
        }
        // Reads first: a task that keeps its key's limit needs one, set
        // before or by an earlier task of the call (each key read once).
        let mut known: std::collections::BTreeSet<(&str, &str)> = Default::default();
        for (i, (task, _, limit)) in checked.iter().enumerate() {
            let Some(key) = task.concurrency_key.as_deref() else {
                continue;
            };
            let namespace = task.namespace.as_str();
            let kept = *limit > 0
                || known.contains(&(namespace, key))
                || self
                    .store
                    .concurrency_limit(namespace, key)
                    .await?
                    .is_some();
            if kept {
                known.insert((namespace, key));
            } else {
                return Err(under(
                    i,
                    invalid(
                        "concurrency_limit",
                        "the key has no limit yet: give one, from 1 to 10000",
                    ),
                ));
            }
        }
        let cap = self.settings.max_queued_tasks_per_namespace;
        if cap > 0 {
            let mut adding: BTreeMap<&str, u64> = BTreeMap::new();
            for (task, _, _) in &checked {
                *adding.entry(task.namespace.as_str()).or_default() += 1;
            }
            for (namespace, n) in adding {
                self.queued_counts
                    .admit(self.store.as_ref(), namespace, cap, n)
                    .await?;
            }
        }
        // Last, with everything valid and admitted: the limits given, each
        // key's last (as one submit after another would leave it).
        let mut limits: BTreeMap<(&str, &str), u32> = BTreeMap::new();
        for (task, _, limit) in &checked {
            if let (Some(key), 1..) = (task.concurrency_key.as_deref(), *limit) {
                limits.insert((task.namespace.as_str(), key), *limit);
            }
        }
        for ((namespace, key), limit) in limits {
            self.store
                .set_concurrency_limit(namespace, key, limit, self.now_ms())
                .await?;
        }
        Ok(checked
            .into_iter()
            .map(|(task, compiled, _)| (task, compiled))
            .collect())
    }

    /// One task a submit asks for, validated (reading nothing), with its
    /// placement compiled and the concurrency limit it gives its key (0:
    /// none, it keeps the key's).
    fn check_task(
        &self,
        caller: &Caller,
        mut req: pb::SubmitTaskRequest,
    ) -> Result<(NewTask, core_placement::CompiledPlacement, u32)> {
        let namespace = namespace("namespace", &req.namespace)?;
        caller.require(Need::Tasks, &namespace)?;
        check_kind(&req.kind).map_err(|err| invalid("kind", &err.to_string()))?;
        check_name("idempotency_key", &req.idempotency_key)?;
        let labels = super::bounds::labels("labels", std::mem::take(&mut req.labels))?;
        let payload = match &req.payload {
            Some(p) => {
                struct_to_json(p).map_err(|e| invalid(&format!("payload.{}", e.path), e.reason))?
            }
            None => serde_json::json!({}),
        };
        if let Some(v) = self.settings.document_limits.violations(&payload).first() {
            return Err(invalid(&super::field_path("payload", &v.path), &v.reason));
        }
        let retry = req.retry.as_ref().map(retry_policy).transpose()?;
        let mut placement = super::bounds::wire_placement(req.placement.as_ref())?;
        // The namespace's default policy is the task's from now on: what
        // explain, the dispatcher and every replica read.
        placement
            .policy
            .get_or_insert(self.settings.placement_policy.of(&namespace));
        let max_attempts = match req.max_attempts {
            0 => self.settings.default_max_attempts,
            n @ 1..=100 => n,
            _ => {
                return Err(invalid(
                    "max_attempts",
                    "must be between 1 and 100 (0 for the default)",
                ));
            }
        };
        let lease_ttl_ms = match &req.lease_ttl {
            None => self.settings.default_lease_ttl_ms,
            Some(d) => duration_within("lease_ttl", d, 1_000..=DAY_MS, "1s and 24h")?,
        };
        let deadlines = deadlines(&req)?;
        let not_before_ms = match &req.not_before {
            None => None,
            Some(ts) => {
                let latest = self.now_ms() + super::bounds::MAX_NOT_BEFORE_AHEAD_MS;
                let ms = timestamp_ms(ts);
                if !(0..=999_999_999).contains(&ts.nanos) || ts.seconds < 0 || ms > latest {
                    return Err(invalid(
                        "not_before",
                        "must be a valid time from 1970 to a year and a day from now",
                    ));
                }
                Some(ms)
            }
        };
        let fairness = fairness(&req)?;
        let concurrency = concurrency(&req)?;
        let compiled = core_placement::compile(&placement)
            .map_err(|err| invalid(&format!("placement.{}", err.field), &err.message))?
            .with_kind(&req.kind);
        let task = NewTask {
            namespace,
            kind: req.kind,
            payload,
            placement: serde_json::to_value(&placement).map_err(|e| Error::Corrupt {
                context: "encoding a placement",
                detail: e.to_string(),
            })?,
            priority: req.priority,
            max_attempts,
            retry,
            deadlines,
            fairness,
            concurrency_key: concurrency.as_ref().map(|(key, _)| key.clone()),
            lease_ttl_ms,
            idempotency_key: (!req.idempotency_key.is_empty()).then_some(req.idempotency_key),
            not_before_ms,
            labels,
        };
        let limit = concurrency.map_or(0, |(_, limit)| limit);
        Ok((task, compiled, limit))
    }
}

fn check_name(field: &str, value: &str) -> Result<()> {
    if value.len() > MAX_NAME {
        return Err(invalid(
            field,
            &format!("is {} bytes, at most {MAX_NAME} allowed", value.len()),
        ));
    }
    Ok(())
}

/// The shortest first retry wait a task may ask for.
const MIN_RETRY_BACKOFF_MS: i64 = 100;

/// A day, the longest lease TTL, retry wait and cancel grace.
pub(super) const DAY_MS: i64 = 86_400_000;

/// A submit's deadlines, each within its range (INVALID_ARGUMENT naming
/// the field otherwise).
fn deadlines(req: &pb::SubmitTaskRequest) -> Result<Deadlines> {
    let within = |field, d: Option<&prost_types::Duration>, range, text| {
        d.map(|d| duration_within(field, d, range, text))
            .transpose()
    };
    Ok(Deadlines {
        start_timeout_ms: within(
            "start_timeout",
            req.start_timeout.as_ref(),
            1_000..=30 * DAY_MS,
            "1s and 30d",
        )?,
        execution_timeout_ms: within(
            "execution_timeout",
            req.execution_timeout.as_ref(),
            1_000..=7 * DAY_MS,
            "1s and 7d",
        )?,
        cancel_grace_ms: within(
            "cancel_grace",
            req.cancel_grace.as_ref(),
            0..=DAY_MS,
            "0s and 24h",
        )?,
    })
}

/// A submit's concurrency key and the limit it sets (0: the key's own);
/// a limit without a key, or out of range, is INVALID_ARGUMENT naming it.
fn concurrency(req: &pb::SubmitTaskRequest) -> Result<Option<(String, u32)>> {
    if req.concurrency_key.is_empty() {
        if req.concurrency_limit != 0 {
            return Err(invalid("concurrency_limit", "needs a concurrency_key"));
        }
        return Ok(None);
    }
    check_name("concurrency_key", &req.concurrency_key)?;
    if req.concurrency_limit > MAX_CONCURRENCY_LIMIT {
        return Err(invalid(
            "concurrency_limit",
            "must be between 1 and 10000 (0 for the key's own)",
        ));
    }
    Ok(Some((req.concurrency_key.clone(), req.concurrency_limit)))
}

/// A submit's fairness key and weight; a weight without a key, or out of
/// range, is INVALID_ARGUMENT naming it.
fn fairness(req: &pb::SubmitTaskRequest) -> Result<Option<Fairness>> {
    if req.fairness_key.is_empty() {
        if req.fairness_weight != 0 {
            return Err(invalid("fairness_weight", "needs a fairness_key"));
        }
        return Ok(None);
    }
    check_name("fairness_key", &req.fairness_key)?;
    let weight = match req.fairness_weight {
        0 => 1,
        w @ 1..=MAX_FAIRNESS_WEIGHT => w,
        _ => {
            return Err(invalid(
                "fairness_weight",
                "must be between 1 and 100 (0 for 1)",
            ));
        }
    };
    Ok(Some(Fairness {
        key: req.fairness_key.clone(),
        weight,
    }))
}

/// A submitted retry policy, its unset fields filled with the defaults; an
/// `INVALID_ARGUMENT` naming the field that is out of range.
fn retry_policy(policy: &pb::RetryPolicy) -> Result<RetryPolicy> {
    let wait = |field: &str, d: Option<&prost_types::Duration>, default: i64, min: i64| {
        d.map_or(Ok(default), |d| {
            duration_within(
                &format!("retry.{field}"),
                d,
                min..=DAY_MS,
                &format!("{min}ms and 24h"),
            )
        })
    };
    let initial = wait(
        "initial_backoff",
        policy.initial_backoff.as_ref(),
        DEFAULT_BACKOFF_BASE_MS,
        MIN_RETRY_BACKOFF_MS,
    )?;
    let max = wait(
        "max_backoff",
        policy.max_backoff.as_ref(),
        MAX_BACKOFF_MS.max(initial),
        initial,
    )?;
    let multiplier = match policy.multiplier {
        0.0 => DEFAULT_RETRY_MULTIPLIER,
        m if (1.0..=MAX_RETRY_MULTIPLIER).contains(&m) => m,
        _ => {
            return Err(invalid(
                "retry.multiplier",
                "must be between 1 and 10 (0 for the default, 2)",
            ));
        }
    };
    let jitter = match policy.jitter {
        None => DEFAULT_RETRY_JITTER,
        Some(j) if (0.0..=1.0).contains(&j) => j,
        Some(_) => {
            return Err(invalid(
                "retry.jitter",
                "must be between 0 and 1 (unset for the default, 0.2)",
            ));
        }
    };
    Ok(RetryPolicy {
        initial_backoff_ms: initial,
        max_backoff_ms: max,
        multiplier,
        jitter,
    })
}
