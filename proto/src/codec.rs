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
//! the message and what was wrong. A response that does not decode stays
//! INTERNAL.

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
                Status::invalid_argument(format!(
                    "the request does not decode as a {name}: {}",
                    status.message()
                ))
            } else {
                status
            }
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
