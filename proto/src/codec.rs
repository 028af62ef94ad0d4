//! The protobuf codec of every generated client and server: prost's, with
//! smaller per-call buffers, and a request that does not decode answered
//! as the caller's error.
//!
//! tonic gives each call an 8 KiB decode buffer and an 8 KiB encode buffer,
//! held for the call's life. An agent's session is one call that lives for
//! hours, and its messages are mostly heartbeats of a few hundred bytes, so
//! with 10,000 agents those buffers alone were 160 MiB of the server's
//! memory. Buffers here start at 1 KiB and grow in 1 KiB steps (a larger
//! message still decodes; only its first reads take more steps).
//!
//! prost's decoder reports bytes that are not the message (truncated, a
//! wrong wire type, invalid UTF-8 in a string, nesting past its recursion
//! limit) as INTERNAL, the server's fault. When what fails to decode is a
//! request (every request message's name ends in `Request`, as buf's
//! STANDARD lint requires), it is the caller's: INVALID_ARGUMENT, naming
//! the message and what was wrong. A value nested past prost's recursion
//! limit is said in one line (the field and the limit) rather than as
//! prost's chain of every message on the way. A response that does not
//! decode stays INTERNAL.

use std::marker::PhantomData;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// Initial size and growth step of a call's encode and decode buffers.
pub const BUFFER_SIZE: usize = 1024;
/// tonic's default: an encoder yields a batch once this many bytes are buffered.
const YIELD_THRESHOLD: usize = 32 * 1024;

/// [`ProstCodec`] with [`BUFFER_SIZE`] buffers.
#[derive(Debug, Clone, Copy)]
pub struct CompactCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for CompactCodec<T, U> {
    fn default() -> Self {
        Self { _pd: PhantomData }
    }
}

impl<T, U> Codec for CompactCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = RequestDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::new(BUFFER_SIZE, YIELD_THRESHOLD))
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder(ProstCodec::<T, U>::raw_decoder(BufferSettings::new(
            BUFFER_SIZE,
            YIELD_THRESHOLD,
        )))
    }
}

/// prost's decoder; a request that does not decode is INVALID_ARGUMENT.
#[derive(Debug)]
pub struct RequestDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for RequestDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| {
            let name = std::any::type_name::<U>().rsplit("::").next().unwrap_or("");
            if status.code() == tonic::Code::Internal && name.ends_with("Request") {
                let why = too_deep(status.message()).unwrap_or_else(|| status.message().to_owned());
                Status::invalid_argument(format!("the request does not decode as a {name}: {why}"))
            } else {
                status
            }
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

/// What prost says of a value nested past its recursion limit (a chain of
/// every message and field on the way, innermost first, over a thousand
/// characters for a deep JSON document), said in one line: the field,
/// from the request down to where its JSON value starts, and the limit.
fn too_deep(message: &str) -> Option<String> {
    let stack = message
        .strip_prefix("failed to decode Protobuf message: ")?
        .strip_suffix("recursion limit reached")?;
    let mut path = Vec::new();
    for entry in stack.rsplit(": ").filter(|e| !e.is_empty()) {
        let (message, field) = entry.split_once('.')?;
        if matches!(message, "Struct" | "Value" | "ListValue") {
            break;
        }
        path.push(field);
    }
    let field = if path.is_empty() {
        "a value".to_owned()
    } else {
        path.join(".")
    };
    Some(format!(
        "{field} is nested too deeply: protobuf decoding stops at {RECURSION_LIMIT} nested \
         messages (a JSON value in a Struct takes two per level; documents, payloads and results \
         may nest at most 32 levels)"
    ))
}

/// prost's recursion limit when decoding.
const RECURSION_LIMIT: u32 = 100;

#[cfg(test)]
mod tests {
    use super::too_deep;

    #[test]
    fn a_value_nested_too_deeply_is_named_in_one_line() {
        let chain = "Struct.fields: Value.kind: ".repeat(40);
        let prost = format!(
            "failed to decode Protobuf message: {chain}PatchOperation.value: \
             CapabilityDiff.operations: Heartbeat.capability_diff: ConnectRequest.message: \
             recursion limit reached"
        );
        let said = too_deep(&prost).unwrap();
        assert!(
            said.starts_with(
                "message.capability_diff.operations.value is nested too deeply: protobuf decoding \
                 stops at 100 nested messages"
            ),
            "{said}"
        );
        assert!(!said.contains('\n') && said.len() < 250, "{said}");
        assert_eq!(
            too_deep("failed to decode Protobuf message: invalid wire type"),
            None
        );
    }
}
