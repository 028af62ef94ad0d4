//! A task's output: the pieces of stdout, stderr and handler log its
//! runners send while they hold its lease ([`OutputChunk`]), as the store
//! keeps them ([`StoredChunk`]: placed by byte offset in the task's output,
//! attempt after attempt), the bounds on what is kept ([`OutputBounds`]),
//! and the tail of a failed attempt that goes into its error
//! ([`output_tail`]).

use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::names::{StoredName, display};

/// Where a piece of output was written (`OutputStream` in task.proto).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
    /// The handler's own log.
    Log,
}

impl StoredName for OutputStream {
    const WHAT: &'static str = "output stream";
    const NAMES: &'static [(Self, &'static str)] = &[
        (Self::Stdout, "stdout"),
        (Self::Stderr, "stderr"),
        (Self::Log, "log"),
    ];
}

impl OutputStream {
    /// The name stored in the `stream` column.
    pub fn as_str(self) -> &'static str {
        StoredName::stored(self)
    }
}

impl fmt::Display for OutputStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        display(*self, f)
    }
}

/// A piece of a lease's output as its runner sent it (checked, cut to
/// [`MAX_CHUNK_BYTES`] and redacted by the API).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputChunk {
    /// Where it was written.
    pub stream: OutputStream,
    /// The runner's number of the chunk within its lease, from 1.
    pub sequence: u64,
    /// The text.
    pub text: String,
    /// Bytes the runner (or the API, cutting a long text) dropped just
    /// before it.
    pub dropped_bytes: u64,
}

/// A piece of a task's output as the store keeps it. A task's output is
/// one range of bytes, attempt after attempt; a chunk holds `[at_byte,
/// end_byte)`, and a gap before it is output dropped there (by its runner's
/// bounds, or by the server's, the oldest first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredChunk {
    /// The task.
    pub task_id: Uuid,
    /// The lease that wrote it.
    pub lease_id: Uuid,
    /// That lease's fencing token.
    pub fencing_token: u64,
    /// The runner's number of the chunk within its lease.
    pub sequence: u64,
    /// Where it was written.
    pub stream: OutputStream,
    /// The text; empty when the chunk marks a range dropped on its own (a
    /// runner's drop with nothing after it yet, or the task's last chunk
    /// once the namespace's bound dropped its text).
    pub text: String,
    /// Where it starts in the task's output.
    pub at_byte: u64,
    /// Where it ends.
    pub end_byte: u64,
    /// When it was stored.
    pub written_at_ms: i64,
}

impl StoredChunk {
    /// Bytes of output dropped just before this chunk's text, for a reader
    /// who read up to `read_to` (the end of the chunk before it, or where
    /// its read began): the gap between, and the chunk's own range if it
    /// marks a drop.
    pub fn dropped_after(&self, read_to: u64) -> u64 {
        let gap = self.at_byte.saturating_sub(read_to);
        if self.text.is_empty() {
            gap + self.end_byte.saturating_sub(self.at_byte)
        } else {
            gap
        }
    }
}

/// How much output the server keeps (`--output-bytes-per-task`,
/// `--output-bytes-per-namespace`); the oldest is dropped first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputBounds {
    /// Most bytes kept per task, every attempt together; 0: output is not
    /// kept at all (chunks are acknowledged and dropped).
    pub per_task: u64,
    /// Most bytes kept per namespace (0: no bound but the tasks'): past it
    /// the sweeper drops the output of the namespace's oldest tasks.
    pub per_namespace: u64,
}

impl OutputBounds {
    /// 4 MiB per task.
    pub const DEFAULT_PER_TASK: u64 = 4 * 1024 * 1024;
    /// 1 GiB per namespace.
    pub const DEFAULT_PER_NAMESPACE: u64 = 1024 * 1024 * 1024;
    /// The smallest bound per task that is not 0: one chunk always fits.
    pub const MIN_PER_TASK: u64 = MAX_CHUNK_BYTES as u64;

    /// Whether output is kept at all.
    pub fn keeps_output(&self) -> bool {
        self.per_task > 0
    }
}

impl Default for OutputBounds {
    fn default() -> Self {
        Self {
            per_task: Self::DEFAULT_PER_TASK,
            per_namespace: Self::DEFAULT_PER_NAMESPACE,
        }
    }
}

/// The most text one chunk keeps (a longer one keeps its end).
pub const MAX_CHUNK_BYTES: usize = 64 * 1024;

/// The most chunks one output report may carry.
pub const MAX_CHUNKS_PER_REPORT: usize = 1_024;

/// The most lines of a failed attempt's output its error carries.
pub const TAIL_LINES: usize = 20;

/// The most bytes of a failed attempt's output its error carries.
pub const TAIL_BYTES: usize = 4 * 1024;

/// The last [`TAIL_LINES`] lines (at most [`TAIL_BYTES`]) of `texts`, the
/// attempt's chunks oldest first, every stream interleaved as written (a
/// chunk that does not end its line continues into the next); a trailing
/// newline does not count as an empty last line.
pub fn output_tail<'a>(texts: impl DoubleEndedIterator<Item = &'a str>) -> String {
    let mut last: Vec<&str> = Vec::new();
    let (mut bytes, mut newlines) = (0, 0);
    for text in texts.rev() {
        last.push(text);
        bytes += text.len();
        newlines += text.matches('\n').count();
        if bytes > TAIL_BYTES || newlines > TAIL_LINES {
            break;
        }
    }
    let joined: String = last.into_iter().rev().collect();
    let mut kept: Vec<&str> = Vec::new();
    let mut bytes = 0;
    for line in joined.trim_end_matches('\n').rsplit('\n').take(TAIL_LINES) {
        if bytes + line.len() > TAIL_BYTES {
            if kept.is_empty() {
                // One long line: its end.
                let mut from = line.len() - TAIL_BYTES;
                while !line.is_char_boundary(from) {
                    from += 1;
                }
                kept.push(&line[from..]);
            }
            break;
        }
        bytes += line.len() + 1;
        kept.push(line);
    }
    kept.reverse();
    kept.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_is_the_last_lines_of_every_chunk() {
        let chunks = ["one\ntwo\n", "three\n", "four\nfive"];
        assert_eq!(
            output_tail(chunks.iter().copied()),
            "one\ntwo\nthree\nfour\nfive"
        );
        let many: Vec<String> = (1..=30).map(|n| format!("line {n}\n")).collect();
        let tail = output_tail(many.iter().map(String::as_str));
        assert_eq!(tail.lines().count(), TAIL_LINES);
        assert!(
            tail.starts_with("line 11\n") && tail.ends_with("line 30"),
            "{tail}"
        );
    }

    #[test]
    fn the_tail_stops_at_its_byte_bound() {
        let long = "x".repeat(3_000);
        let chunks = [long.as_str(), "\n", long.as_str()];
        let tail = output_tail(chunks.iter().copied());
        assert_eq!(tail, long);
        let longer = "é".repeat(5_000);
        let tail = output_tail([longer.as_str()].into_iter());
        assert!(
            tail.len() <= TAIL_BYTES && tail.len() > TAIL_BYTES - 2,
            "{}",
            tail.len()
        );
    }

    #[test]
    fn a_line_cut_between_chunks_is_one_line() {
        let chunks = ["first\nhal", "f a line\n"];
        assert_eq!(output_tail(chunks.iter().copied()), "first\nhalf a line");
    }

    #[test]
    fn a_dropped_chunk_counts_its_own_bytes_and_the_gap_before_it() {
        let chunk = StoredChunk {
            task_id: Uuid::nil(),
            lease_id: Uuid::nil(),
            fencing_token: 1,
            sequence: 3,
            stream: OutputStream::Stdout,
            text: String::new(),
            at_byte: 100,
            end_byte: 150,
            written_at_ms: 0,
        };
        assert_eq!(chunk.dropped_after(40), 60 + 50);
        let kept = StoredChunk {
            text: "x".repeat(50),
            ..chunk
        };
        assert_eq!(kept.dropped_after(100), 0);
        assert_eq!(kept.dropped_after(93), 7);
    }
}
