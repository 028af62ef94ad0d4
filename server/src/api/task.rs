//! `TaskService`: submitters and operators put tasks in and follow them
//! (their state, history and output).
//! Submit validates everything before anything is stored (a bad field is
//! INVALID_ARGUMENT naming it, and nothing is written), stores the task and
//! wakes the dispatcher; reads compute a queued task's reason (parked,
//! waiting for capacity, backing off) from the current fleet.

use std::collections::BTreeMap;

use switchyard_core::kinds::check_kind;
use switchyard_core::matcher::{self, AgentId};
use switchyard_core::placement as core_placement;
use switchyard_proto::v1::{self as pb, task_service_server::TaskService};
use tonic::{Request, Response, Status};
use tracing::instrument;

use super::convert::{struct_to_json, timestamp_ms};
use super::live::{LiveStream, QueueWatch};
use super::watch::{Watch, WatchStream};
use super::{Api, TaskApi, duration_within, invalid, namespace, page_size, parse_id};
use crate::auth::{Caller, Need};
use crate::error::{Error, Result};
use crate::model::{
    DEFAULT_BACKOFF_BASE_MS, DEFAULT_RETRY_JITTER, DEFAULT_RETRY_MULTIPLIER, Deadlines, Fairness,
    LimitUsage, MAX_BACKOFF_MS, MAX_CONCURRENCY_LIMIT, MAX_FAIRNESS_WEIGHT, MAX_RETRY_MULTIPLIER,
    NewTask, Page, QueuedReason, RetryPolicy, RevocationCause, TaskFilter, TaskRecord, TaskState,
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
    /// A task on the wire, with its queued reason (from the whole fleet)
    /// when it is queued.
    pub(crate) async fn task_with_reason(&self, record: &TaskRecord) -> Result<pb::Task> {
        let mut tasks = self
            .tasks_with_reasons(std::slice::from_ref(record))
            .await?;
        tasks.pop().ok_or_else(|| Error::Corrupt {
            context: "giving a task its queued reason",
            detail: "no task".to_owned(),
        })
    }

    /// Tasks on the wire, each queued one with its reason: BACKOFF while it
    /// is not yet due, CONCURRENCY_LIMIT while a limit holds it back, else
    /// what matching against the whole fleet says (PARKED or
    /// WAITING_FOR_CAPACITY, see [`crate::dispatch::Dispatcher::queued_reasons`]).
    /// GetTask and ListTasks say the same of a task.
    pub(crate) async fn tasks_with_reasons(&self, records: &[TaskRecord]) -> Result<Vec<pb::Task>> {
        let now = self.now_ms();
        let mut reasons: Vec<Option<QueuedReason>> = Vec::with_capacity(records.len());
        let mut matching = Vec::new();
        let mut limits: BTreeMap<(&str, Option<&str>), bool> = BTreeMap::new();
        for record in records {
            let reason = if record.state != TaskState::Queued {
                None
            } else if record.not_before_ms > now {
                Some(QueuedReason::Backoff)
            } else {
                let key = (record.namespace.as_str(), record.concurrency_key.as_deref());
                let full = match limits.get(&key) {
                    Some(full) => *full,
                    None => {
                        let full = self.limits(record).await?.full();
                        limits.insert(key, full);
                        full
                    }
                };
                if full {
                    Some(QueuedReason::ConcurrencyLimit)
                } else {
                    matching.push(reasons.len());
                    None
                }
            };
            reasons.push(reason);
        }
        if !matching.is_empty() {
            let due: Vec<&TaskRecord> = matching.iter().map(|&i| &records[i]).collect();
            let matched = self.dispatcher.queued_reasons(&due).await?;
            for (i, reason) in matching.into_iter().zip(matched) {
                reasons[i] = Some(reason);
            }
        }
        Ok(records
            .iter()
            .zip(reasons)
            .map(|(record, reason)| wire::task_with_reason(record, reason))
            .collect())
    }

    /// How full the concurrency limits a task is held to are (reads
    /// nothing for a task no limit counts).
    pub(crate) async fn limits(&self, record: &TaskRecord) -> Result<LimitUsage> {
        if record.concurrency_key.is_none() && self.settings.max_running_tasks_per_namespace == 0 {
            return Ok(LimitUsage::default());
        }
        self.store
            .limit_usage(&record.namespace, record.concurrency_key.as_deref())
            .await
    }

    /// A task the caller may see and act on; tasks of other namespaces are
    /// NOT_FOUND, exactly like missing ones.
    pub(crate) async fn task_for(&self, caller: &Caller, id: uuid::Uuid) -> Result<TaskRecord> {
        let record = self.store.get_task(id).await?;
        if !caller.sees(&record.namespace) {
            return Err(Error::NotFound {
                what: "task",
                id: id.to_string(),
            });
        }
        caller.require(Need::Tasks, &record.namespace)?;
        Ok(record)
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

/// The wire verdicts of an explanation, eligible first in rank order, with
/// agent names; the agents' own values in the reasons only when
/// `agent_values` (the caller may read the agents).
pub(crate) fn verdicts(
    explanation: &matcher::Explanation,
    names: &BTreeMap<AgentId, String>,
    agent_values: bool,
) -> Vec<pb::AgentVerdict> {
    let mut verdicts: Vec<pb::AgentVerdict> = explanation
        .verdicts
        .iter()
        .map(|v| pb::AgentVerdict {
            agent_id: v.agent_id.to_string(),
            agent_name: names.get(&v.agent_id).cloned().unwrap_or_default(),
            eligible: v.eligible,
            capable: v.capable,
            reason: if agent_values {
                v.reason_text()
            } else {
                v.reason_text_without_agent_values()
            },
            preference_score: u32::try_from(v.preference_score).unwrap_or(u32::MAX),
            rank: v.rank,
        })
        .collect();
    verdicts.sort_by(|a, b| {
        (!a.eligible, a.rank, &a.agent_name, &a.agent_id).cmp(&(
            !b.eligible,
            b.rank,
            &b.agent_name,
            &b.agent_id,
        ))
    });
    verdicts
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

#[tonic::async_trait]
impl TaskService for TaskApi {
    #[instrument(skip_all, fields(kind = %request.get_ref().kind))]
    async fn submit_task(
        &self,
        request: Request<pb::SubmitTaskRequest>,
    ) -> Result<Response<pb::SubmitTaskResponse>, Status> {
        let api = &self.0;
        let caller = api.caller(&request).await?;
        let mut tasks = api
            .new_tasks(&caller, vec![request.into_inner()], None)
            .await?;
        let (task, compiled) = tasks.pop().ok_or_else(|| Error::Corrupt {
            context: "submitting a task",
            detail: "no task".to_owned(),
        })?;
        let submitted = api.dispatcher.submit_task(task, &compiled).await?;
        let mut reason = submitted.queued_reason;
        if reason.is_some_and(|r| r != QueuedReason::Backoff)
            && api.limits(&submitted.task).await?.full()
        {
            reason = Some(QueuedReason::ConcurrencyLimit);
        }
        Ok(Response::new(pb::SubmitTaskResponse {
            task: Some(wire::task_with_reason(&submitted.task, reason)),
            created: submitted.created,
        }))
    }

    #[instrument(skip_all, fields(tasks = request.get_ref().tasks.len()))]
    async fn submit_tasks(
        &self,
        request: Request<pb::SubmitTasksRequest>,
    ) -> Result<Response<pb::SubmitTasksResponse>, Status> {
        let api = &self.0;
        let caller = api.caller(&request).await?;
        let requests = request.into_inner().tasks;
        if !(1..=MAX_SUBMITS_AT_ONCE).contains(&requests.len()) {
            return Err(invalid(
                "tasks",
                &format!(
                    "holds {} tasks: give from 1 to {MAX_SUBMITS_AT_ONCE}",
                    requests.len()
                ),
            )
            .into());
        }
        // The answer holds every task as stored: the request's fields and
        // what the server adds. Refused now if it could pass the largest
        // message, rather than stored and then not answered.
        let answer: usize = requests
            .iter()
            .map(|task| prost::Message::encoded_len(task) + ANSWER_BYTES_PER_TASK)
            .sum();
        let largest = api.settings.max_message_bytes;
        if answer > largest {
            return Err(invalid(
                "tasks",
                &format!(
                    "the answer to these {} tasks could take {answer} bytes, past the largest \
                     message of {largest} (--max-message-bytes): send fewer a call",
                    requests.len()
                ),
            )
            .into());
        }
        let (tasks, compiled): (Vec<_>, Vec<_>) = api
            .new_tasks(&caller, requests, Some("tasks"))
            .await?
            .into_iter()
            .unzip();
        let submitted = api
            .dispatcher
            .submit_tasks(tasks.into_iter().zip(&compiled).collect())
            .await?;
        let mut results = Vec::with_capacity(submitted.len());
        let mut limits: BTreeMap<(String, Option<String>), bool> = BTreeMap::new();
        for submitted in submitted {
            let mut reason = submitted.queued_reason;
            if reason.is_some_and(|r| r != QueuedReason::Backoff) {
                let task = &submitted.task;
                let key = (task.namespace.clone(), task.concurrency_key.clone());
                let full = match limits.get(&key) {
                    Some(full) => *full,
                    None => *limits.entry(key).or_insert(api.limits(task).await?.full()),
                };
                if full {
                    reason = Some(QueuedReason::ConcurrencyLimit);
                }
            }
            results.push(pb::SubmitTaskResponse {
                task: Some(wire::task_with_reason(&submitted.task, reason)),
                created: submitted.created,
            });
        }
        Ok(Response::new(pb::SubmitTasksResponse { results }))
    }

    #[instrument(skip_all, fields(task = %request.get_ref().task_id))]
    async fn get_task(
        &self,
        request: Request<pb::GetTaskRequest>,
    ) -> Result<Response<pb::GetTaskResponse>, Status> {
        let caller = self.0.caller(&request).await?;
        let id = parse_id("task_id", &request.get_ref().task_id)?;
        let record = self.0.task_for(&caller, id).await?;
        let task = self.0.task_with_reason(&record).await?;
        Ok(Response::new(pb::GetTaskResponse { task: Some(task) }))
    }

    async fn list_tasks(
        &self,
        request: Request<pb::ListTasksRequest>,
    ) -> Result<Response<pb::ListTasksResponse>, Status> {
        let caller = self.0.caller(&request).await?;
        let req = request.into_inner();
        let states = req
            .states
            .iter()
            .enumerate()
            .map(|(i, s)| {
                pb::TaskState::try_from(*s)
                    .ok()
                    .and_then(wire::store_task_state)
                    .ok_or_else(|| {
                        invalid(&format!("states[{i}]"), &format!("unknown task state {s}"))
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        let filter = TaskFilter {
            namespace: namespace("namespace", &req.namespace)?,
            states,
            kind: (!req.kind.is_empty()).then_some(req.kind),
        };
        caller.require(Need::Tasks, &filter.namespace)?;
        if !req.page_token.is_empty() && !crate::store::is_task_page_token(&req.page_token) {
            return Err(invalid("page_token", "not a token this server issued").into());
        }
        let page = Page {
            size: page_size("page_size", req.page_size)?,
            after: (!req.page_token.is_empty()).then_some(req.page_token),
        };
        let (tasks, next) = self.0.store.list_tasks(&filter, &page).await?;
        let mut wire_tasks = self.0.tasks_with_reasons(&tasks).await?;
        let kept = super::bounds::fitting(&wire_tasks);
        let next = if kept < wire_tasks.len() {
            wire_tasks.truncate(kept);
            Some(crate::store::task_page_token(&tasks[kept - 1]))
        } else {
            next
        };
        Ok(Response::new(pb::ListTasksResponse {
            tasks: wire_tasks,
            next_page_token: next.unwrap_or_default(),
        }))
    }

    #[instrument(skip_all, fields(task = %request.get_ref().task_id))]
    async fn cancel_task(
        &self,
        request: Request<pb::CancelTaskRequest>,
    ) -> Result<Response<pb::CancelTaskResponse>, Status> {
        let caller = self.0.caller(&request).await?;
        let req = request.into_inner();
        let id = parse_id("task_id", &req.task_id)?;
        let grace_ms = req
            .grace
            .as_ref()
            .map(|d| duration_within("grace", d, 0..=DAY_MS, "0s and 24h"))
            .transpose()?;
        self.0.task_for(&caller, id).await?;
        let reason = if req.reason.is_empty() {
            "canceled".to_owned()
        } else {
            super::bounds::reason("reason", &req.reason)?
        };
        let (record, lease) = self
            .0
            .store
            .cancel_task(id, &reason, grace_ms, self.0.now_ms())
            .await?;
        if let Some(lease) = &lease {
            // Local agents hear it now; agents on other replicas through the
            // store's LeaseRevoked event.
            self.0
                .dispatcher
                .revoke(lease, RevocationCause::Canceled, &reason);
        }
        Ok(Response::new(pb::CancelTaskResponse {
            task: Some(wire::task(&record)),
        }))
    }

    #[instrument(skip_all, fields(task = %request.get_ref().task_id))]
    async fn watch_task(
        &self,
        request: Request<pb::WatchTaskRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        let api = self.0.clone();
        let caller = api.caller(&request).await?;
        let req = request.get_ref();
        let id = parse_id("task_id", &req.task_id)?;
        let output = req.output.then_some(req.output_offset);
        if !req.output && req.output_offset != 0 {
            return Err(invalid("output_offset", "only with output").into());
        }
        // Subscribe before the first read so no change falls in between.
        let changes = api.dispatcher.watch_tasks();
        let record = api.task_for(&caller, id).await?;
        Ok(Response::new(Watch::start(api, record, changes, output)))
    }

    async fn get_queue_summary(
        &self,
        request: Request<pb::GetQueueSummaryRequest>,
    ) -> Result<Response<pb::GetQueueSummaryResponse>, Status> {
        let caller = self.0.caller(&request).await?;
        let ns = namespace("namespace", &request.get_ref().namespace)?;
        caller.require(Need::Tasks, &ns)?;
        let summary = self.0.dispatcher.queue_summary(&ns, true).await?;
        Ok(Response::new(pb::GetQueueSummaryResponse {
            summary: Some(wire::queue::summary(&summary)),
        }))
    }

    async fn watch_queue(
        &self,
        request: Request<pb::WatchQueueRequest>,
    ) -> Result<Response<LiveStream<pb::WatchQueueResponse>>, Status> {
        let caller = self.0.caller(&request).await?;
        let ns = namespace("namespace", &request.get_ref().namespace)?;
        caller.require(Need::Tasks, &ns)?;
        Ok(Response::new(QueueWatch::start(self.0.clone(), ns)))
    }

    async fn list_task_output(
        &self,
        request: Request<pb::ListTaskOutputRequest>,
    ) -> Result<Response<pb::ListTaskOutputResponse>, Status> {
        let caller = self.0.caller(&request).await?;
        let req = request.into_inner();
        let id = parse_id("task_id", &req.task_id)?;
        let size = page_size("page_size", req.page_size)?;
        let from: u64 = if req.page_token.is_empty() {
            0
        } else {
            req.page_token
                .parse()
                .map_err(|_| invalid("page_token", "not a token this server issued"))?
        };
        // Existence check: an unknown task is NOT_FOUND, not an empty page.
        self.0.task_for(&caller, id).await?;
        let token = (req.fencing_token != 0).then_some(req.fencing_token);
        let stored = self.0.store.task_output(id, from, token, size).await?;
        let (mut chunks, mut read_to) = wire::output::chunks(&stored, from);
        let fit = super::bounds::fitting(&chunks);
        if fit < chunks.len() {
            chunks.truncate(fit);
            read_to = stored[fit - 1].end_byte.max(from);
        }
        let more = fit < stored.len() || stored.len() == size as usize;
        Ok(Response::new(pb::ListTaskOutputResponse {
            chunks,
            next_page_token: if more {
                read_to.to_string()
            } else {
                String::new()
            },
        }))
    }

    #[instrument(skip_all, fields(task = %request.get_ref().task_id))]
    async fn explain_task(
        &self,
        request: Request<pb::ExplainTaskRequest>,
    ) -> Result<Response<pb::ExplainTaskResponse>, Status> {
        let api = &self.0;
        let caller = api.caller(&request).await?;
        let id = parse_id("task_id", &request.get_ref().task_id)?;
        let record = api.task_for(&caller, id).await?;
        let (explanation, names) = api.dispatcher.explanation(&record).await?;
        let mut summary = explanation.summary.clone();
        if record.state == TaskState::Queued {
            let held = api
                .limits(&record)
                .await?
                .describe(record.concurrency_key.as_deref(), &record.namespace);
            if !held.is_empty() {
                summary = format!("held back by {held}; {summary}");
            }
        }
        match record.state {
            TaskState::Queued if record.not_before_ms > api.now_ms() => {
                summary = format!("backing off until {} ms; {summary}", record.not_before_ms);
            }
            TaskState::Queued => {}
            state => summary = format!("task is {}; {summary}", state.as_str()),
        }
        let task = api.task_with_reason(&record).await?;
        Ok(Response::new(pb::ExplainTaskResponse {
            task: Some(task),
            summary,
            // A submitter may not read agents, so it does not read their
            // values here either.
            verdicts: verdicts(
                &explanation,
                &names,
                caller.require(Need::Fleet, &record.namespace).is_ok(),
            ),
        }))
    }

    async fn list_task_events(
        &self,
        request: Request<pb::ListTaskEventsRequest>,
    ) -> Result<Response<pb::ListTaskEventsResponse>, Status> {
        let caller = self.0.caller(&request).await?;
        let req = request.into_inner();
        let id = parse_id("task_id", &req.task_id)?;
        let size = page_size("page_size", req.page_size)?;
        let after = if req.page_token.is_empty() {
            0
        } else {
            req.page_token
                .parse()
                .map_err(|_| invalid("page_token", "not a token this server issued"))?
        };
        // Existence check: an unknown task is NOT_FOUND, not an empty page.
        self.0.task_for(&caller, id).await?;
        let events = self.0.store.task_events(id, after, size).await?;
        let next = if events.len() == size as usize {
            events
                .last()
                .map(|e| e.sequence.to_string())
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok(Response::new(pb::ListTaskEventsResponse {
            events: events.iter().map(wire::event).collect(),
            next_page_token: next,
        }))
    }
}

/// The shortest first retry wait a task may ask for.
const MIN_RETRY_BACKOFF_MS: i64 = 100;

/// A day, the longest lease TTL, retry wait and cancel grace.
const DAY_MS: i64 = 86_400_000;

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
