//! A task's output on the wire: stored chunks as `TaskOutputChunk`s, each
//! saying how much was dropped just before it for a reader who read up to
//! a given offset, and the wire's output streams.

use switchyard_proto::v1 as pb;

use super::convert::timestamp;
use crate::model::{OutputStream, StoredChunk};

/// The wire stream of a stored one.
pub fn stream(stream: OutputStream) -> pb::OutputStream {
    match stream {
        OutputStream::Stdout => pb::OutputStream::Stdout,
        OutputStream::Stderr => pb::OutputStream::Stderr,
        OutputStream::Log => pb::OutputStream::Log,
    }
}

/// The stored stream of a wire one; `None` for UNSPECIFIED.
pub fn stored_stream(stream: pb::OutputStream) -> Option<OutputStream> {
    match stream {
        pb::OutputStream::Unspecified => None,
        pb::OutputStream::Stdout => Some(OutputStream::Stdout),
        pb::OutputStream::Stderr => Some(OutputStream::Stderr),
        pb::OutputStream::Log => Some(OutputStream::Log),
    }
}

/// `chunks` (in order) on the wire, for a reader who read up to `read_to`,
/// and the offset the reader has read up to after them.
pub fn chunks(chunks: &[StoredChunk], mut read_to: u64) -> (Vec<pb::TaskOutputChunk>, u64) {
    let mut out = Vec::with_capacity(chunks.len());
    for chunk in chunks {
        out.push(pb::TaskOutputChunk {
            stream: stream(chunk.stream) as i32,
            text: chunk.text.clone(),
            lease_id: chunk.lease_id.to_string(),
            fencing_token: chunk.fencing_token,
            sequence: chunk.sequence,
            offset: if chunk.text.is_empty() {
                chunk.end_byte
            } else {
                chunk.at_byte
            },
            dropped_bytes: chunk.dropped_after(read_to),
            written_at: Some(timestamp(chunk.written_at_ms)),
        });
        read_to = read_to.max(chunk.end_byte);
    }
    (out, read_to)
}
