//! A task's output on the agent: what a handler writes to its stdout,
//! stderr and log ([`OutputSink`]), line-buffered per stream, batched (every
//! [`OutputLimits::flush_every`], or at once when a batch fills), and
//! bounded per task by a total and a rate ([`OutputLimits`]). Past either
//! bound the newest output is kept in a tail of [`OutputLimits::tail_bytes`]
//! and the rest dropped; the tail goes out when the rate allows or the task
//! ends, its first chunk saying how many bytes were dropped before it. The
//! batches go to the session as [`OutputBatch`]es, in order, before the
//! lease's final report.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use switchyard_proto::v1::{self as pb, OutputStream};
use tokio::time::Instant;

/// How much of a task's output the agent sends, and how it batches it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutputLimits {
    /// Most bytes sent per task (the tail sent at its end aside).
    pub max_bytes: u64,
    /// Bytes per second sent per task, on average.
    pub bytes_per_sec: u64,
    /// Bytes a task may send at once before the rate holds it back.
    pub burst_bytes: u64,
    /// The newest output kept while over a bound, sent when the rate
    /// allows or the task ends.
    pub tail_bytes: usize,
    /// How often pending output is sent.
    pub flush_every: Duration,
    /// Pending output that is sent at once.
    pub batch_bytes: usize,
}

impl Default for OutputLimits {
    fn default() -> Self {
        Self {
            max_bytes: 8 * 1024 * 1024,
            bytes_per_sec: 1024 * 1024,
            burst_bytes: 1024 * 1024,
            tail_bytes: 64 * 1024,
            flush_every: Duration::from_millis(250),
            batch_bytes: 64 * 1024,
        }
    }
}

/// The most text one chunk carries (the server keeps 64 KiB of one).
const CHUNK_BYTES: usize = 32 * 1024;

/// A line longer than this is sent in pieces.
const LINE_BYTES: usize = 16 * 1024;

/// One batch of a lease's output, ready to send.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputBatch {
    /// The lease.
    pub lease_id: String,
    /// The chunks, numbered in order.
    pub chunks: Vec<pb::OutputChunk>,
}

/// Where a handler writes its output; cheap to clone. Writes never block
/// and never fail: past the task's bounds output is dropped and counted.
#[derive(Debug, Clone)]
pub struct OutputSink {
    inner: Option<Arc<Mutex<Buffer>>>,
}

/// Where a sink's batches go.
type Deliver = Box<dyn Fn(OutputBatch) + Send + Sync>;

impl OutputSink {
    /// A sink whose batches for the lease `lease_id` are handed to
    /// `deliver`, in order (it is called with the sink's lock held).
    pub fn new(
        lease_id: String,
        limits: OutputLimits,
        deliver: impl Fn(OutputBatch) + Send + Sync + 'static,
    ) -> Self {
        let buffer = Buffer {
            lease_id,
            limits,
            deliver: Box::new(deliver),
            sequence: 0,
            partial: Default::default(),
            pending: Vec::new(),
            pending_bytes: 0,
            tail: None,
            tokens: limits.burst_bytes as f64,
            refilled: Instant::now(),
            sent: 0,
            closed: false,
        };
        Self {
            inner: Some(Arc::new(Mutex::new(buffer))),
        }
    }

    /// A sink that drops everything (a context made outside a session).
    pub fn discard() -> Self {
        Self { inner: None }
    }

    fn buffer(&self) -> Option<MutexGuard<'_, Buffer>> {
        self.inner
            .as_ref()
            .map(|b| b.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Writes `text` to `stream` (lines are sent whole where they can be).
    pub fn write(&self, stream: OutputStream, text: &str) {
        if let Some(mut buffer) = self.buffer() {
            buffer.write(stream, text);
        }
    }

    /// Sends what is pending (and a line left open since the last flush);
    /// false once the sink is finished.
    pub fn flush(&self) -> bool {
        match self.buffer() {
            Some(mut buffer) if !buffer.closed => {
                buffer.flush(false);
                true
            }
            _ => false,
        }
    }

    /// Sends everything left, the tail kept past a bound included, and
    /// takes no more output.
    pub fn finish(&self) {
        if let Some(mut buffer) = self.buffer()
            && !buffer.closed
        {
            buffer.flush(true);
            buffer.closed = true;
        }
    }

    /// Flushes every `limits.flush_every` until the sink is finished.
    pub fn spawn_flusher(&self) {
        let Some(every) = self.buffer().map(|b| b.limits.flush_every) else {
            return;
        };
        let sink = self.clone();
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(every);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                if !sink.flush() {
                    return;
                }
            }
        });
    }
}

/// Output kept past a bound: the newest, and what was dropped before it.
#[derive(Debug, Default)]
struct Tail {
    blocks: VecDeque<(OutputStream, String)>,
    bytes: usize,
    dropped: u64,
}

impl Tail {
    /// Keeps `text`, dropping the oldest past `limit` bytes.
    fn push(&mut self, stream: OutputStream, text: &str, limit: usize) {
        self.bytes += text.len();
        self.blocks.push_back((stream, text.to_owned()));
        while self.bytes > limit {
            let excess = self.bytes - limit;
            let Some((_, front)) = self.blocks.front_mut() else {
                break;
            };
            if front.len() <= excess {
                self.bytes -= front.len();
                self.dropped += front.len() as u64;
                self.blocks.pop_front();
                continue;
            }
            // Cut the front block at a line start past the excess if there
            // is one, else at a character.
            let mut cut = excess;
            while !front.is_char_boundary(cut) {
                cut += 1;
            }
            if let Some(newline) = front[cut..].find('\n') {
                cut += newline + 1;
            }
            self.bytes -= cut;
            self.dropped += cut as u64;
            front.drain(..cut);
            if front.is_empty() {
                self.blocks.pop_front();
            }
        }
    }
}

/// A lease's output between the handler and the session.
struct Buffer {
    lease_id: String,
    limits: OutputLimits,
    deliver: Deliver,
    /// The last chunk's number.
    sequence: u64,
    /// The line each stream has open, and whether it was open at the last
    /// flush (it is then sent as it is).
    partial: [(String, bool); 3],
    /// Output to send at the next flush, consecutive writes to one stream
    /// merged.
    pending: Vec<(OutputStream, String)>,
    pending_bytes: usize,
    /// Set while over a bound: everything goes here until it is sent.
    tail: Option<Tail>,
    /// The rate's allowance, in bytes.
    tokens: f64,
    refilled: Instant,
    /// Bytes sent or pending so far.
    sent: u64,
    closed: bool,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("lease_id", &self.lease_id)
            .field("sequence", &self.sequence)
            .field("pending_bytes", &self.pending_bytes)
            .field("sent", &self.sent)
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

fn slot(stream: OutputStream) -> usize {
    match stream {
        OutputStream::Stderr => 1,
        OutputStream::Log => 2,
        OutputStream::Stdout | OutputStream::Unspecified => 0,
    }
}

const STREAMS: [OutputStream; 3] = [
    OutputStream::Stdout,
    OutputStream::Stderr,
    OutputStream::Log,
];

impl Buffer {
    fn write(&mut self, stream: OutputStream, text: &str) {
        if self.closed || text.is_empty() {
            return;
        }
        let open = &mut self.partial[slot(stream)].0;
        open.push_str(text);
        let whole = match open.rfind('\n') {
            Some(end) => end + 1,
            None if open.len() >= LINE_BYTES => open.len(),
            None => return,
        };
        let rest = open.split_off(whole);
        let lines = std::mem::replace(open, rest);
        self.partial[slot(stream)].1 = false;
        self.admit(stream, &lines);
    }

    fn refill(&mut self) {
        let now = Instant::now();
        let earned =
            now.duration_since(self.refilled).as_secs_f64() * self.limits.bytes_per_sec as f64;
        self.tokens = (self.tokens + earned).min(self.limits.burst_bytes as f64);
        self.refilled = now;
    }

    /// Takes `text` for sending if the bounds allow, as much as they allow
    /// (whole lines), and keeps the rest in the tail.
    fn admit(&mut self, stream: OutputStream, text: &str) {
        if let Some(tail) = &mut self.tail {
            tail.push(stream, text, self.limits.tail_bytes);
            return;
        }
        self.refill();
        let left = self.limits.max_bytes.saturating_sub(self.sent);
        let allowance = (self.tokens.max(0.0) as u64).min(left) as usize;
        let taken = if text.len() <= allowance {
            text.len()
        } else {
            let mut end = allowance;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text[..end].rfind('\n').map_or(0, |n| n + 1)
        };
        if taken > 0 {
            self.pend(stream, &text[..taken]);
        }
        if taken < text.len() {
            let mut tail = Tail::default();
            tail.push(stream, &text[taken..], self.limits.tail_bytes);
            self.tail = Some(tail);
        }
        if self.pending_bytes >= self.limits.batch_bytes {
            self.send();
        }
    }

    fn pend(&mut self, stream: OutputStream, text: &str) {
        self.tokens -= text.len() as f64;
        self.sent += text.len() as u64;
        self.pending_bytes += text.len();
        match self.pending.last_mut() {
            Some((s, last)) if *s == stream && last.len() + text.len() <= CHUNK_BYTES => {
                last.push_str(text);
            }
            _ => self.pending.push((stream, text.to_owned())),
        }
    }

    /// Sends what is pending; a line open since the last flush goes as it
    /// is, and so does the tail if the bounds allow (always at the end).
    fn flush(&mut self, last: bool) {
        for stream in STREAMS {
            let (open, stale) = &mut self.partial[slot(stream)];
            if open.is_empty() {
                continue;
            }
            if last || *stale {
                let text = std::mem::take(open);
                *stale = false;
                self.admit(stream, &text);
            } else {
                *stale = true;
            }
        }
        self.refill();
        let release = self.tail.as_ref().is_some_and(|tail| {
            last || (self.tokens >= tail.bytes as f64
                && self.sent + tail.bytes as u64 <= self.limits.max_bytes)
        });
        let mut dropped = 0;
        if release && let Some(tail) = self.tail.take() {
            dropped = tail.dropped;
            self.send();
            for (stream, text) in tail.blocks {
                self.pend(stream, &text);
            }
        }
        self.send_marked(dropped);
    }

    fn send(&mut self) {
        self.send_marked(0);
    }

    /// Sends what is pending as one batch, its first chunk saying `dropped`
    /// bytes went before it (a chunk of its own if nothing is pending).
    fn send_marked(&mut self, mut dropped: u64) {
        let mut chunks = Vec::new();
        for (stream, text) in std::mem::take(&mut self.pending) {
            let mut rest = text.as_str();
            while !rest.is_empty() {
                let mut end = rest.len().min(CHUNK_BYTES);
                while !rest.is_char_boundary(end) {
                    end -= 1;
                }
                self.sequence += 1;
                chunks.push(pb::OutputChunk {
                    stream: stream as i32,
                    sequence: self.sequence,
                    text: rest[..end].to_owned(),
                    dropped_bytes: std::mem::take(&mut dropped),
                });
                rest = &rest[end..];
            }
        }
        if dropped > 0 {
            self.sequence += 1;
            chunks.push(pb::OutputChunk {
                stream: OutputStream::Stdout as i32,
                sequence: self.sequence,
                text: String::new(),
                dropped_bytes: dropped,
            });
        }
        self.pending_bytes = 0;
        if !chunks.is_empty() {
            // Delivered under the lock: batches leave in the order of their
            // numbers.
            (self.deliver)(OutputBatch {
                lease_id: self.lease_id.clone(),
                chunks,
            });
        }
    }
}

/// Text from a byte stream that may cut a character in two: the complete
/// characters of each read, the rest carried to the next (bytes that are
/// not UTF-8 become U+FFFD).
#[derive(Debug, Default)]
pub struct Utf8Carry {
    carry: Vec<u8>,
}

impl Utf8Carry {
    /// The text of `bytes` after what was carried.
    pub fn decode(&mut self, bytes: &[u8]) -> String {
        self.carry.extend_from_slice(bytes);
        let keep = match std::str::from_utf8(&self.carry) {
            Ok(_) => 0,
            // An incomplete character at the end waits for the next read.
            Err(err) if err.error_len().is_none() => self.carry.len() - err.valid_up_to(),
            Err(_) => 0,
        };
        let rest = self.carry.split_off(self.carry.len() - keep);
        let text = String::from_utf8_lossy(&self.carry).into_owned();
        self.carry = rest;
        text
    }

    /// What is left at the end of the stream.
    pub fn finish(&mut self) -> String {
        String::from_utf8_lossy(&std::mem::take(&mut self.carry)).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    fn sink(limits: OutputLimits) -> (OutputSink, mpsc::UnboundedReceiver<OutputBatch>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let deliver = move |batch| {
            let _ = tx.send(batch);
        };
        (OutputSink::new("lease".into(), limits, deliver), rx)
    }

    fn drain(rx: &mut mpsc::UnboundedReceiver<OutputBatch>) -> Vec<pb::OutputChunk> {
        let mut chunks = Vec::new();
        while let Ok(batch) = rx.try_recv() {
            chunks.extend(batch.chunks);
        }
        chunks
    }

    #[tokio::test]
    async fn lines_are_batched_and_numbered_in_order() {
        let (sink, mut rx) = sink(OutputLimits::default());
        sink.write(OutputStream::Stdout, "one\ntw");
        sink.write(OutputStream::Stdout, "o\n");
        sink.write(OutputStream::Stderr, "oops\n");
        sink.write(OutputStream::Stdout, "three\n");
        assert!(drain(&mut rx).is_empty(), "nothing before a flush");
        sink.flush();
        let chunks = drain(&mut rx);
        let seen: Vec<(i32, u64, &str)> = chunks
            .iter()
            .map(|c| (c.stream, c.sequence, c.text.as_str()))
            .collect();
        assert_eq!(
            seen,
            [
                (OutputStream::Stdout as i32, 1, "one\ntwo\n"),
                (OutputStream::Stderr as i32, 2, "oops\n"),
                (OutputStream::Stdout as i32, 3, "three\n"),
            ]
        );
    }

    #[tokio::test]
    async fn an_open_line_waits_one_flush_then_goes_as_it_is() {
        let (sink, mut rx) = sink(OutputLimits::default());
        sink.write(OutputStream::Stdout, "progress 10%");
        sink.flush();
        assert!(drain(&mut rx).is_empty());
        sink.flush();
        assert_eq!(drain(&mut rx)[0].text, "progress 10%");
        sink.write(OutputStream::Log, "last words");
        sink.finish();
        assert_eq!(drain(&mut rx)[0].text, "last words");
        sink.write(OutputStream::Stdout, "after the end\n");
        assert!(!sink.flush());
        assert!(drain(&mut rx).is_empty());
    }

    #[tokio::test]
    async fn past_the_total_the_tail_is_kept_and_the_drop_counted() {
        let limits = OutputLimits {
            max_bytes: 100,
            bytes_per_sec: 1 << 30,
            burst_bytes: 1 << 30,
            tail_bytes: 30,
            ..OutputLimits::default()
        };
        let (sink, mut rx) = sink(limits);
        let mut written = 0;
        for n in 0..1_000 {
            let line = format!("line {n:04}\n");
            written += line.len();
            sink.write(OutputStream::Stdout, &line);
        }
        sink.flush();
        sink.finish();
        let chunks = drain(&mut rx);
        let text: String = chunks.iter().map(|c| c.text.as_str()).collect();
        let dropped: u64 = chunks.iter().map(|c| c.dropped_bytes).sum();
        assert!(text.starts_with("line 0000\n"), "{text}");
        assert!(text.ends_with("line 0999\n"), "{text}");
        assert_eq!(text.len() as u64 + dropped, written as u64);
        assert!(text.len() <= 100 + 30, "{}", text.len());
        let marked = chunks.iter().position(|c| c.dropped_bytes > 0).unwrap();
        assert!(
            chunks[marked].text.starts_with("line 09"),
            "{:?}",
            chunks[marked]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_rate_output_waits_in_the_tail_until_the_rate_allows() {
        let limits = OutputLimits {
            bytes_per_sec: 100,
            burst_bytes: 100,
            tail_bytes: 1_000,
            ..OutputLimits::default()
        };
        let (sink, mut rx) = sink(limits);
        sink.write(OutputStream::Stdout, &"a".repeat(99));
        sink.write(OutputStream::Stdout, "\n");
        sink.write(OutputStream::Stdout, "b\n");
        sink.flush();
        let first = drain(&mut rx);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].text.len(), 100);
        tokio::time::advance(Duration::from_secs(1)).await;
        sink.flush();
        let later = drain(&mut rx);
        assert_eq!(later[0].text, "b\n");
        assert_eq!(later[0].dropped_bytes, 0, "held back, not dropped");
    }

    #[test]
    fn a_character_cut_between_reads_is_kept_whole() {
        let mut carry = Utf8Carry::default();
        let bytes = "héllo".as_bytes();
        let (a, b) = bytes.split_at(2);
        assert_eq!(carry.decode(a), "h");
        assert_eq!(carry.decode(b), "éllo");
        assert_eq!(carry.decode(&[0xff, b'x']), "\u{fffd}x");
        assert_eq!(carry.finish(), "");
    }
}
