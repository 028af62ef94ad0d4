//! A namespace's queue summary ([`QueueSummary`]) as the wire's
//! `QueueSummary`: live tasks by state, queued tasks by reason, and the
//! groups of one kind and placement with their explanations.

use switchyard_proto::v1 as pb;

use super::convert::timestamp;
use super::{placement, queued_reason, task_state};
use crate::model::QueueSummary;

/// `summary` as the wire message.
pub fn summary(summary: &QueueSummary) -> pb::QueueSummary {
    pb::QueueSummary {
        namespace: summary.namespace.clone(),
        states: summary
            .states
            .iter()
            .map(|(state, count)| pb::TaskStateCount {
                state: task_state(*state) as i32,
                count: *count,
            })
            .collect(),
        queued_reasons: summary
            .reasons
            .iter()
            .map(|(reason, count)| pb::QueuedReasonCount {
                reason: queued_reason(*reason) as i32,
                count: *count,
            })
            .collect(),
        groups: summary
            .groups
            .iter()
            .map(|group| pb::QueueGroup {
                kind: group.row.kind.clone(),
                placement: placement(&group.row.placement),
                tasks: group.row.tasks,
                not_yet_due: group.row.not_yet_due,
                oldest_submitted_at: Some(timestamp(group.row.oldest_submitted_ms)),
                reason: group
                    .reason
                    .map_or(pb::QueuedReason::Unspecified, queued_reason)
                    as i32,
                explanation: group.explanation.clone(),
                capable_agents: group.capable_agents,
                eligible_agents: group.eligible_agents,
            })
            .collect(),
        more_groups: u32::try_from(summary.more_groups).unwrap_or(u32::MAX),
        computed_at: Some(timestamp(summary.made_at_ms)),
        agents_taking_work: summary.agents_taking_work,
        agents_registered: summary.agents_registered,
        explained: summary.explained,
    }
}
