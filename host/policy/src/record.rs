//! The recorder checkpoints are written and read with: Burn's binary
//! format (bincode, exactly what `BinFileRecorder` writes, so checkpoints
//! of either load with the other), read with a bound on what the decoder
//! may allocate.
//!
//! A checkpoint is bytes a crash, a full disk or someone else may have
//! left. Reading from a file, bincode sizes a buffer by the length it
//! reads, before it reads the contents: a damaged length of 2⁶³ aborts the
//! process with a failed allocation, which no error handling can catch.
//! Here the file is read whole and decoded from its bytes, and the decoder
//! may claim at most [`EXPANSION`] times the file's size in all (a length
//! in the file takes at least a byte per element it counts, and no element
//! grows more than that in memory), so a damaged length is an error.
//!
//! Burn's decoder still trusts a tensor's shape when its stored type is
//! not `f32` (it converts by the shape, not the bytes), so a damaged type
//! and shape can still abort it: checkpoints therefore record each file's
//! SHA-256 and are checked before decoding (`ragen-learner`'s checkpoint
//! module).

use burn::record::{BinFileRecorder, FileRecorder, FullPrecisionSettings, Recorder, RecorderError};
use burn::tensor::backend::Backend;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::path::PathBuf;

/// How many bytes in memory one byte of the file may decode to, at most
/// (a varint of one byte becomes a `u64`).
const EXPANSION: usize = 8;

/// Burn's binary file record, read with a bound (see the module doc).
#[derive(Debug, Clone, Default)]
pub struct CheckpointRecorder;

impl<B: Backend> FileRecorder<B> for CheckpointRecorder {
    fn file_extension() -> &'static str {
        <BinFileRecorder<FullPrecisionSettings> as FileRecorder<B>>::file_extension()
    }
}

impl<B: Backend> Recorder<B> for CheckpointRecorder {
    type Settings = FullPrecisionSettings;
    type RecordArgs = PathBuf;
    type RecordOutput = ();
    type LoadArgs = PathBuf;

    fn save_item<I: Serialize>(&self, item: I, file: PathBuf) -> Result<(), RecorderError> {
        Recorder::<B>::save_item(&BinFileRecorder::<FullPrecisionSettings>::new(), item, file)
    }

    fn load_item<I: DeserializeOwned>(&self, file: &mut PathBuf) -> Result<I, RecorderError> {
        file.set_extension(<Self as FileRecorder<B>>::file_extension());
        let bytes = std::fs::read(&*file).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => RecorderError::FileNotFound(e.to_string()),
            _ => RecorderError::Unknown(e.to_string()),
        })?;
        decode_bounded(&bytes).map_err(RecorderError::Unknown)
    }
}

/// `bytes` decoded, the decoder's claims bounded by [`EXPANSION`] times
/// their length: bincode takes its limit as a constant, so the smallest
/// power of two that covers it is picked (at most twice the bound).
fn decode_bounded<I: DeserializeOwned>(bytes: &[u8]) -> Result<I, String> {
    use bincode::config::standard;
    macro_rules! within {
        ($($limit:expr),*) => {{
            let claims = bytes.len().saturating_mul(EXPANSION);
            $(if claims <= $limit {
                return bincode::serde::decode_from_slice(bytes, standard().with_limit::<{ $limit }>()).map(|(item, _)| item).map_err(|e| e.to_string());
            })*
            Err(format!("{} bytes is more than a checkpoint file holds", bytes.len()))
        }};
    }
    within!(
        1 << 20,
        1 << 21,
        1 << 22,
        1 << 23,
        1 << 24,
        1 << 25,
        1 << 26,
        1 << 27,
        1 << 28,
        1 << 29,
        1 << 30,
        1 << 31,
        1 << 32,
        1 << 33,
        1 << 34,
        1 << 35,
        1 << 36,
        1 << 37,
        1 << 38,
        1 << 39,
        1 << 40
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A length of 2⁶³ − 1 (253, then 8 bytes, in bincode's
    /// variable-length integers) before a tensor's bytes is an error.
    /// Burn's recorder decoded from a reader, where that much is allocated
    /// before reading and the process aborts. (Decoding from the slice
    /// alone already refuses this one; the limit is for the allocations
    /// inside Burn's records that the fuzzing hit, which no small input
    /// here reproduces.)
    #[test]
    fn a_huge_length_is_an_error_not_an_allocation() {
        let mut bytes: Vec<u8> = [253].into_iter().chain((u64::MAX / 2).to_le_bytes()).collect();
        bytes.extend_from_slice(b"abc");
        let error = decode_bounded::<burn::tensor::Bytes>(&bytes).unwrap_err();
        assert!(error.to_lowercase().contains("limit"), "{error}");
        // And what fits decodes as Burn's recorder wrote it.
        let fine = bincode::serde::encode_to_vec("abc", bincode::config::standard()).unwrap();
        assert_eq!(decode_bounded::<String>(&fine).unwrap(), "abc");
    }
}
