//! How the CLI prints for people: tasks, agents and explanations as aligned
//! tables (comfy-table), a watch as one line per event, a task's output as
//! it was written, and a finished task's result or error (with the last
//! lines of a failed attempt's output). JSON for scripts is [`super::json`]'s, the reply
//! itself.

use comfy_table::{Table, presets};
use switchyard_proto::convert;
use switchyard_proto::v1 as pb;

fn table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table
        .load_style(presets::NOTHING)
        .set_header(header.to_vec());
    table
}

/// A table without the padding comfy-table puts before its first column.
fn print_table(table: &Table) {
    for line in table.lines() {
        println!("{}", line.strip_prefix(' ').unwrap_or(&line).trim_end());
    }
}

fn state_name(state: pb::TaskState) -> String {
    state
        .as_str_name()
        .trim_start_matches("TASK_STATE_")
        .to_ascii_lowercase()
}

fn queued_reason(task: &pb::Task) -> Option<String> {
    match task.queued_reason() {
        pb::QueuedReason::Unspecified => None,
        reason => Some(
            reason
                .as_str_name()
                .trim_start_matches("QUEUED_REASON_")
                .to_ascii_lowercase(),
        ),
    }
}

/// The attempt a task is on, or ended on, out of its maximum: `attempts`
/// counts the attempts that ended without success, so one that holds a
/// lease, or succeeded, is one more.
pub(super) fn attempt(task: &pb::Task) -> String {
    let current = match task.state() {
        pb::TaskState::Leased | pb::TaskState::Running | pb::TaskState::Succeeded => 1,
        pb::TaskState::Canceled => u32::from(task.lease.is_some()),
        _ => 0,
    };
    format!("{}/{}", task.attempts + current, task.max_attempts)
}

/// Progress as people read it: the percent only when known (the contract
/// says negative for unknown), then the message.
pub(super) fn progress(p: &pb::TaskProgress) -> String {
    let percent = (p.percent >= 0.0).then(|| format!("{:.0}%", p.percent.min(100.0)));
    match (percent, p.message.is_empty()) {
        (Some(percent), true) => percent,
        (Some(percent), false) => format!("{percent} {}", p.message),
        (None, _) => p.message.clone(),
    }
}

fn agent_status(agent: &pb::Agent) -> String {
    agent
        .status()
        .as_str_name()
        .trim_start_matches("AGENT_STATUS_")
        .to_ascii_lowercase()
}

fn tier_name(tier: pb::Tier) -> String {
    tier.as_str_name()
        .trim_start_matches("TIER_")
        .to_ascii_lowercase()
}

/// One task: its id, kind and state, then its error and result.
pub(super) fn task(task: &pb::Task, note: &str) {
    let mut line = format!(
        "{}  {}  {}",
        task.task_id,
        task.kind,
        state_name(task.state())
    );
    if let Some(reason) = queued_reason(task) {
        line.push_str(&format!(" ({reason})"));
    }
    line.push_str(&format!("  attempt {}", attempt(task)));
    if !note.is_empty() {
        line.push_str(&format!("  [{note}]"));
    }
    println!("{line}");
    outcome(task);
}

/// A finished task's error and result, each on a line of its own.
pub(super) fn outcome(task: &pb::Task) {
    if let Some(error) = &task.error {
        let code = if error.code.is_empty() {
            String::new()
        } else {
            format!(" ({})", error.code)
        };
        println!("  error: {}{code}", error.message);
        if !error.output_tail.is_empty() {
            println!("  last output:");
            for line in error.output_tail.lines() {
                println!("    {line}");
            }
        }
    }
    if let Some(result) = task
        .result
        .as_ref()
        .and_then(|r| convert::struct_to_json(r).ok())
    {
        println!("  result: {result}");
    }
}

pub(super) fn task_list(tasks: &[pb::Task]) {
    let mut t = table(&["TASK", "KIND", "STATE", "ATTEMPT", "PRIORITY"]);
    for task in tasks {
        let mut state = state_name(task.state());
        if let Some(reason) = queued_reason(task) {
            state.push_str(&format!(" ({reason})"));
        }
        t.add_row(vec![
            task.task_id.clone(),
            task.kind.clone(),
            state,
            attempt(task),
            task.priority.to_string(),
        ]);
    }
    print_table(&t);
}

pub(super) fn agent(agent: &pb::Agent, leases: &[pb::Lease]) {
    println!(
        "{}  {}  {}  leases {}/{}{}",
        agent.agent_id,
        agent.name,
        agent_status(agent),
        agent.active_leases,
        agent.capacity,
        if agent.drained { "  (drained)" } else { "" }
    );
    for reason in &agent.status_reasons {
        println!("  reason: {reason}");
    }
    if let Some(caps) = &agent.capabilities {
        println!("capabilities (generation {}):", caps.generation);
        let doc = caps
            .document
            .as_ref()
            .and_then(|d| convert::struct_to_json(d).ok())
            .unwrap_or_default();
        let mut t = table(&["PATH", "VALUE", "TIER"]);
        for entry in &caps.provenance {
            let value = switchyard_core::document::lookup(&doc, &entry.path)
                .map(ToString::to_string)
                .unwrap_or_default();
            t.add_row(vec![entry.path.clone(), value, tier_name(entry.tier())]);
        }
        print_table(&t);
        for r in &caps.rejections {
            println!(
                "rejected [{}] {}: {}",
                tier_name(r.tier()),
                r.path,
                r.reason
            );
        }
    }
    if !leases.is_empty() {
        let mut t = table(&["LEASE", "TASK", "FENCING TOKEN"]);
        for lease in leases {
            t.add_row(vec![
                lease.lease_id.clone(),
                lease.task_id.clone(),
                lease.fencing_token.to_string(),
            ]);
        }
        print_table(&t);
    }
}

pub(super) fn agent_list(agents: &[pb::Agent]) {
    let mut t = table(&["AGENT", "NAME", "STATUS", "LEASES", "REASONS"]);
    for a in agents {
        let mut status = agent_status(a);
        if a.drained {
            status.push_str(" (drained)");
        }
        t.add_row(vec![
            a.agent_id.clone(),
            a.name.clone(),
            status,
            format!("{}/{}", a.active_leases, a.capacity),
            a.status_reasons.join("; "),
        ]);
    }
    print_table(&t);
}

pub(super) fn explanation(
    task: Option<&pb::Task>,
    summary: &str,
    verdicts: &[pb::AgentVerdict],
    ranking: &str,
) {
    if let Some(t) = task {
        self::task(t, "");
    }
    println!("{summary}");
    if !ranking.is_empty() {
        println!("{ranking}");
    }
    let mut t = table(&["RANK", "AGENT", "VERDICT"]);
    for v in verdicts {
        let (rank, verdict) = if v.eligible {
            (
                format!("#{}", v.rank),
                format!("eligible (preference {})", v.preference_score),
            )
        } else {
            ("-".to_owned(), v.reason.clone())
        };
        t.add_row(vec![rank, v.agent_name.clone(), verdict]);
    }
    if !verdicts.is_empty() {
        print_table(&t);
    }
}

/// One line of a watch: the state as of the event, what happened, the
/// progress, the event's message.
pub(super) fn watch_line(event: Option<&pb::TaskEvent>, task: &pb::Task) {
    let state = event.map_or(task.state(), pb::TaskEvent::state);
    let kind = event.map_or("state", |e| e.kind.as_str());
    let mut line = format!("{}  {}", state_name(state), kind);
    if let Some(p) = &task.progress {
        let shown = progress(p);
        if !shown.is_empty() {
            line.push_str(&format!("  {shown}"));
        }
    }
    if let Some(e) = event.filter(|e| !e.message.is_empty()) {
        line.push_str(&format!("  — {}", e.message));
    }
    println!("{line}");
}

/// What of a task's output was printed: to tell a new attempt's output from
/// the last one's.
#[derive(Debug, Default)]
pub(super) struct OutputShown {
    /// The fencing token of the last chunk printed.
    lease: Option<u64>,
}

impl OutputShown {
    /// Prints `chunks` as they were written: stdout's text to stdout, the
    /// rest to stderr; a line on stderr where a new attempt's output begins
    /// and where output was dropped.
    pub(super) fn chunks(&mut self, chunks: &[pb::TaskOutputChunk]) {
        use std::io::Write;
        let (mut stdout, mut stderr) = (std::io::stdout().lock(), std::io::stderr().lock());
        for chunk in chunks {
            if self.lease.is_some_and(|lease| lease != chunk.fencing_token) {
                let _ = stdout.flush();
                let _ = writeln!(
                    stderr,
                    "--- lease {} (another attempt) ---",
                    chunk.fencing_token
                );
            }
            self.lease = Some(chunk.fencing_token);
            if chunk.dropped_bytes > 0 {
                let _ = stdout.flush();
                let _ = writeln!(stderr, "{}", dropped(chunk.dropped_bytes));
            }
            if chunk.stream() == pb::OutputStream::Stdout {
                let _ = stdout.write_all(chunk.text.as_bytes());
            } else {
                let _ = stdout.flush();
                let _ = stderr.write_all(chunk.text.as_bytes());
            }
        }
        let _ = stdout.flush();
    }
}

/// The line that marks dropped output.
fn dropped(bytes: u64) -> String {
    format!("[... {bytes} bytes of output dropped here (the runner's or the server's bound) ...]")
}

/// How a followed task ended, on stderr (its output went to stdout).
pub(super) fn ending(task: &pb::Task) {
    let mut line = format!("task {}", state_name(task.state()));
    if let Some(error) = &task.error {
        line.push_str(&format!(": {}", error.message));
    }
    eprintln!("{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_counts_the_one_under_way_or_that_succeeded() {
        let mut t = pb::Task {
            max_attempts: 3,
            state: pb::TaskState::Succeeded as i32,
            ..Default::default()
        };
        assert_eq!(attempt(&t), "1/3");
        t.state = pb::TaskState::Queued as i32;
        assert_eq!(attempt(&t), "0/3");
        t.attempts = 1;
        t.state = pb::TaskState::Running as i32;
        assert_eq!(attempt(&t), "2/3");
        t.attempts = 3;
        t.state = pb::TaskState::Failed as i32;
        assert_eq!(attempt(&t), "3/3");
    }

    #[test]
    fn unknown_progress_shows_no_percent() {
        let unknown = pb::TaskProgress {
            percent: -1.0,
            message: "compiling".into(),
            reported_at: None,
        };
        assert_eq!(progress(&unknown), "compiling");
        let half = pb::TaskProgress {
            percent: 50.0,
            message: String::new(),
            reported_at: None,
        };
        assert_eq!(progress(&half), "50%");
    }
}
