//! The protobuf codec of every generated client and server: prost's, with
//! smaller per-call buffers.
//!
//! tonic gives each call an 8 KiB decode buffer and an 8 KiB encode buffer,
//! held for the call's life. An agent's session is one call that lives for
//! hours, and its messages are mostly heartbeats of a few hundred bytes, so
//! with 10,000 agents those buffers alone were 160 MiB of the server's
//! memory. Buffers here start at 1 KiB and grow in 1 KiB steps (a larger
//! message still decodes; only its first reads take more steps).

use std::marker::PhantomData;
use tonic::codec::{BufferSettings, Codec};
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
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::new(BUFFER_SIZE, YIELD_THRESHOLD))
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(BufferSettings::new(BUFFER_SIZE, YIELD_THRESHOLD))
    }
}
