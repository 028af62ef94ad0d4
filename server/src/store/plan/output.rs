//! The store's decisions about a task's output, apart from its SQL: which
//! reported chunks come from the lease's holder and are new, where each goes
//! in the task's output (its byte range), and how much of what is kept must
//! go to stay within the task's bound. Both backends decide through
//! [`plan_output`].
//!
//! A task's output is one range of bytes, attempt after attempt: each chunk
//! takes the range after the one before it, a gap first if its runner
//! dropped bytes before it. A stored row whose text is empty marks a range
//! dropped on its own (by the runner, or by the namespace's bound). The
//! task's last row carries its mark: the last chunk's lease and sequence (a
//! resent chunk is recognised by them) and the bytes kept in all.

use std::collections::HashMap;

use uuid::Uuid;

use crate::error::{Error, Result};
use crate::model::{LeaseReport, OutputBounds, OutputChunk, ReportKind, TaskRecord, TaskState};

/// What the store holds of a task's output before a batch: its last row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct OutputMark {
    /// The fencing token of the lease that wrote the last chunk.
    pub fencing_token: u64,
    /// The runner's number of the last chunk.
    pub sequence: u64,
    /// Where the task's output ends.
    pub end_byte: u64,
    /// Bytes of text kept for the task in all.
    pub kept_bytes: u64,
}

/// One row to insert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OutputRow<'a> {
    /// The lease that wrote it.
    pub lease_id: Uuid,
    /// Its fencing token.
    pub fencing_token: u64,
    /// The chunk.
    pub chunk: &'a OutputChunk,
    /// Where the row starts (after the runner's gap, if any).
    pub at_byte: u64,
    /// Where it ends.
    pub end_byte: u64,
    /// False when the text is not kept (the batch alone passes the task's
    /// bound; its oldest chunks go): the row marks its range dropped.
    pub keeps_text: bool,
}

impl OutputRow<'_> {
    /// The text the row stores.
    pub fn text(&self) -> &str {
        if self.keeps_text {
            &self.chunk.text
        } else {
            ""
        }
    }

    /// Bytes of text the row keeps.
    pub fn kept(&self) -> u64 {
        self.text().len() as u64
    }
}

/// What a batch writes of one task's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskOutputWrite<'a> {
    /// The task.
    pub task_id: Uuid,
    /// Its namespace (the namespace's bound counts it).
    pub namespace: String,
    /// The rows to insert, in order.
    pub rows: Vec<OutputRow<'a>>,
    /// Bytes kept before the batch.
    pub kept_before: u64,
    /// Bytes of the rows stored before the batch that must go, the oldest
    /// first, to keep the task within its bound (whole rows: a little more
    /// may go); 0 if none.
    pub excess: u64,
}

impl TaskOutputWrite<'_> {
    /// Bytes of text the batch adds.
    pub fn added(&self) -> u64 {
        self.rows.iter().map(OutputRow::kept).sum()
    }

    /// Bytes kept once the batch is written and `deleted` bytes of the rows
    /// before it are gone.
    pub fn kept_after(&self, deleted: u64) -> u64 {
        (self.kept_before + self.added()).saturating_sub(deleted)
    }
}

/// Whether an output report comes from the holder of the task's live lease
/// (the task read under its lock): a stale token is refused like any stale
/// report, and so is output for a lease the task no longer has.
pub(crate) fn check_output_holder(task: &TaskRecord, report: &LeaseReport) -> Result<()> {
    if report.fencing_token != task.fencing_token {
        return Err(Error::StaleFencingToken {
            task_id: task.id,
            presented: report.fencing_token,
            current: task.fencing_token,
        });
    }
    let live = matches!(task.state, TaskState::Leased | TaskState::Running);
    if !live || task.lease_id != Some(report.lease_id) || task.agent_id != Some(report.agent_id) {
        return Err(Error::LeaseNotHeld {
            lease_id: report.lease_id,
            agent_id: report.agent_id,
        });
    }
    Ok(())
}

/// Plans the output reports of one task (in the order given) against its
/// locked record and the mark of what is stored: each report's answer (a
/// report from another than the holder is refused and writes nothing), and
/// the write, if anything is new. A chunk at or before the mark (resent
/// after a reconnect) and an empty one with no drop are skipped.
pub(crate) fn plan_output<'a>(
    task: &TaskRecord,
    mark: Option<OutputMark>,
    reports: &[&'a LeaseReport],
    bounds: &OutputBounds,
) -> (Vec<Result<()>>, Option<TaskOutputWrite<'a>>) {
    let mut answers = Vec::with_capacity(reports.len());
    let mark = mark.unwrap_or_default();
    let (mut last, mut end) = ((mark.fencing_token, mark.sequence), mark.end_byte);
    let mut rows = Vec::new();
    for report in reports {
        let ReportKind::Output(chunks) = &report.kind else {
            continue;
        };
        if let Err(refusal) = check_output_holder(task, report) {
            answers.push(Err(refusal));
            continue;
        }
        answers.push(Ok(()));
        if !bounds.keeps_output() {
            continue;
        }
        for chunk in chunks {
            let place = (report.fencing_token, chunk.sequence);
            if place <= last || (chunk.text.is_empty() && chunk.dropped_bytes == 0) {
                continue;
            }
            last = place;
            let at_byte = if chunk.text.is_empty() {
                end
            } else {
                end + chunk.dropped_bytes
            };
            end = at_byte
                + if chunk.text.is_empty() {
                    chunk.dropped_bytes
                } else {
                    chunk.text.len() as u64
                };
            rows.push(OutputRow {
                lease_id: report.lease_id,
                fencing_token: report.fencing_token,
                chunk,
                at_byte,
                end_byte: end,
                keeps_text: !chunk.text.is_empty(),
            });
        }
    }
    if rows.is_empty() {
        return (answers, None);
    }
    let mut write = TaskOutputWrite {
        task_id: task.id,
        namespace: task.namespace.clone(),
        rows,
        kept_before: mark.kept_bytes,
        excess: 0,
    };
    let mut over = (write.kept_before + write.added()).saturating_sub(bounds.per_task);
    if over > write.kept_before {
        // The batch alone passes the bound: its oldest chunks go too, and
        // everything stored before it.
        let mut own = over - write.kept_before;
        for row in &mut write.rows {
            if own == 0 {
                break;
            }
            own = own.saturating_sub(row.kept());
            row.keeps_text = false;
        }
        over = write.kept_before;
    }
    write.excess = over;
    (answers, Some(write))
}

/// Output reports grouped by task, in the order given, with their indices
/// in the batch.
pub(crate) fn outputs_by_task(reports: &[LeaseReport]) -> HashMap<Uuid, Vec<usize>> {
    let mut by_task: HashMap<Uuid, Vec<usize>> = HashMap::new();
    for (i, report) in reports.iter().enumerate() {
        if matches!(report.kind, ReportKind::Output(_)) {
            by_task.entry(report.task_id).or_default().push(i);
        }
    }
    by_task
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::OutputStream;

    fn task() -> TaskRecord {
        TaskRecord {
            id: Uuid::from_u128(1),
            namespace: "default".into(),
            kind: "exec".into(),
            payload: serde_json::json!({}),
            placement: serde_json::json!({}),
            priority: 0,
            state: TaskState::Running,
            attempts: 0,
            releases: 0,
            max_attempts: 3,
            retry: None,
            deadlines: Default::default(),
            cancel_deadline_ms: None,
            fairness: None,
            queue_rank: 0,
            concurrency_key: None,
            lease_ttl_ms: 30_000,
            idempotency_key: None,
            not_before_ms: 0,
            result: None,
            error: None,
            fencing_token: 2,
            lease_id: Some(Uuid::from_u128(7)),
            agent_id: Some(Uuid::from_u128(8)),
            lease_expires_at_ms: None,
            cancel_requested: false,
            progress: None,
            labels: Default::default(),
            created_at_ms: 0,
            updated_at_ms: 0,
        }
    }

    fn report(chunks: Vec<OutputChunk>) -> LeaseReport {
        LeaseReport {
            lease_id: Uuid::from_u128(7),
            task_id: task().id,
            agent_id: Uuid::from_u128(8),
            fencing_token: 2,
            kind: ReportKind::Output(chunks),
        }
    }

    fn chunk(sequence: u64, text: &str, dropped_bytes: u64) -> OutputChunk {
        OutputChunk {
            stream: OutputStream::Stdout,
            sequence,
            text: text.to_owned(),
            dropped_bytes,
        }
    }

    const ROOMY: OutputBounds = OutputBounds {
        per_task: 1_000,
        per_namespace: 0,
    };

    #[test]
    fn chunks_follow_each_other_and_a_runner_drop_is_a_gap() {
        let r = report(vec![
            chunk(1, "abc\n", 0),
            chunk(2, "de\n", 10),
            chunk(3, "", 5),
        ]);
        let (answers, write) = plan_output(&task(), None, &[&r], &ROOMY);
        assert!(answers.iter().all(Result::is_ok));
        let write = write.unwrap();
        let ranges: Vec<(u64, u64, &str)> = write
            .rows
            .iter()
            .map(|row| (row.at_byte, row.end_byte, row.text()))
            .collect();
        assert_eq!(ranges, [(0, 4, "abc\n"), (14, 17, "de\n"), (17, 22, "")]);
        assert_eq!((write.added(), write.excess), (7, 0));
    }

    #[test]
    fn what_is_stored_already_is_skipped() {
        let mark = OutputMark {
            fencing_token: 2,
            sequence: 2,
            end_byte: 40,
            kept_bytes: 40,
        };
        let r = report(vec![
            chunk(1, "old\n", 0),
            chunk(2, "old\n", 0),
            chunk(3, "new\n", 0),
        ]);
        let (_, write) = plan_output(&task(), Some(mark), &[&r], &ROOMY);
        let write = write.unwrap();
        assert_eq!(write.rows.len(), 1);
        assert_eq!(
            (write.rows[0].at_byte, write.rows[0].chunk.sequence),
            (40, 3)
        );
        let again = report(vec![chunk(3, "new\n", 0)]);
        let mark = OutputMark {
            sequence: 3,
            ..mark
        };
        assert_eq!(plan_output(&task(), Some(mark), &[&again], &ROOMY).1, None);
    }

    #[test]
    fn a_new_attempt_follows_the_last() {
        let mark = OutputMark {
            fencing_token: 1,
            sequence: 90,
            end_byte: 500,
            kept_bytes: 300,
        };
        let r = report(vec![chunk(1, "second attempt\n", 0)]);
        let write = plan_output(&task(), Some(mark), &[&r], &ROOMY).1.unwrap();
        assert_eq!(write.rows[0].at_byte, 500);
        assert_eq!(write.kept_after(0), 315);
    }

    #[test]
    fn output_from_another_than_the_holder_is_refused() {
        let mut stale = report(vec![chunk(1, "late\n", 0)]);
        stale.fencing_token = 1;
        let mut other = report(vec![chunk(1, "other\n", 0)]);
        other.agent_id = Uuid::from_u128(9);
        let (answers, write) = plan_output(&task(), None, &[&stale, &other], &ROOMY);
        assert!(matches!(answers[0], Err(Error::StaleFencingToken { .. })));
        assert!(matches!(answers[1], Err(Error::LeaseNotHeld { .. })));
        assert_eq!(write, None);
        let mut ended = task();
        ended.state = TaskState::Succeeded;
        let fine = report(vec![chunk(1, "after the end\n", 0)]);
        let (answers, _) = plan_output(&ended, None, &[&fine], &ROOMY);
        assert!(matches!(answers[0], Err(Error::LeaseNotHeld { .. })));
    }

    #[test]
    fn past_the_bound_the_oldest_goes() {
        let mark = OutputMark {
            fencing_token: 2,
            sequence: 1,
            end_byte: 900,
            kept_bytes: 900,
        };
        let text = "x".repeat(300);
        let r = report(vec![chunk(2, &text, 0)]);
        let write = plan_output(&task(), Some(mark), &[&r], &ROOMY).1.unwrap();
        assert_eq!(write.excess, 200);
        assert!(write.rows[0].keeps_text);
        // A batch alone past the bound keeps its newest chunks.
        let r = report(vec![
            chunk(2, &text, 0),
            chunk(3, &text, 0),
            chunk(4, &text, 0),
            chunk(5, &text, 0),
        ]);
        let write = plan_output(&task(), Some(mark), &[&r], &ROOMY).1.unwrap();
        assert_eq!(write.excess, 900);
        let kept: Vec<bool> = write.rows.iter().map(|row| row.keeps_text).collect();
        assert_eq!(kept, [false, true, true, true]);
        assert_eq!(write.kept_after(900), 900);
    }

    #[test]
    fn output_off_answers_and_keeps_nothing() {
        let off = OutputBounds {
            per_task: 0,
            per_namespace: 0,
        };
        let r = report(vec![chunk(1, "x\n", 0)]);
        let (answers, write) = plan_output(&task(), None, &[&r], &off);
        assert!(answers[0].is_ok());
        assert_eq!(write, None);
    }
}
