//! `TaskService`: submitters and operators put tasks in and follow them
//! (their state, history and output).
//! Submits are `submit.rs`'s; reads compute a queued task's reason (parked,
//! waiting for capacity, backing off) from the current fleet.

use std::collections::BTreeMap;

use switchyard_core::matcher::{self, AgentId};
use switchyard_proto::v1::{self as pb, task_service_server::TaskService};
use tonic::{Request, Response, Status};
use tracing::instrument;

use super::live::{LiveStream, QueueWatch};
use super::submit::DAY_MS;
use super::watch::{Watch, WatchStream};
use super::{Api, TaskApi, duration_within, invalid, namespace, page_size, parse_id};
use crate::auth::{Caller, Need};
use crate::error::{Error, Result};
use crate::model::{
    LimitUsage, Page, QueuedReason, RevocationCause, TaskFilter, TaskRecord, TaskState,
};
use crate::wire;

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
        let mut limits = BTreeMap::new();
        for record in records {
            let reason = if record.state != TaskState::Queued {
                None
            } else if record.not_before_ms > now {
                Some(QueuedReason::Backoff)
            } else {
                let full = self.limit_full(record, &mut limits).await?;
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

    /// Whether the concurrency limits `record` is held to are full, each
    /// limit read once per `seen` (by namespace and key).
    pub(super) async fn limit_full<'r>(
        &self,
        record: &'r TaskRecord,
        seen: &mut BTreeMap<(&'r str, Option<&'r str>), bool>,
    ) -> Result<bool> {
        let key = (record.namespace.as_str(), record.concurrency_key.as_deref());
        if let Some(full) = seen.get(&key) {
            return Ok(*full);
        }
        let full = self.limits(record).await?.full();
        seen.insert(key, full);
        Ok(full)
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

#[tonic::async_trait]
impl TaskService for TaskApi {
    #[instrument(skip_all, fields(kind = %request.get_ref().kind))]
    async fn submit_task(
        &self,
        request: Request<pb::SubmitTaskRequest>,
    ) -> Result<Response<pb::SubmitTaskResponse>, Status> {
        let caller = self.0.caller(&request).await?;
        let mut answers = self
            .0
            .submit(&caller, vec![request.into_inner()], None)
            .await?;
        let answer = answers.pop().ok_or_else(|| Error::Corrupt {
            context: "submitting a task",
            detail: "no answer".to_owned(),
        })?;
        Ok(Response::new(answer))
    }

    #[instrument(skip_all, fields(tasks = request.get_ref().tasks.len()))]
    async fn submit_tasks(
        &self,
        request: Request<pb::SubmitTasksRequest>,
    ) -> Result<Response<pb::SubmitTasksResponse>, Status> {
        let caller = self.0.caller(&request).await?;
        let requests = request.into_inner().tasks;
        self.0.check_call(&requests)?;
        let results = self.0.submit(&caller, requests, Some("tasks")).await?;
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
        let changes = api.dispatcher.watch_tasks().await;
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
