//! Payload compression codecs, in the exact formats Pulsar clients use.
//!
//! | type   | format |
//! |--------|--------|
//! | NONE   | as is |
//! | LZ4    | raw LZ4 block: no frame, no size prefix (the size is in the metadata) |
//! | ZLIB   | zlib stream (RFC 1950 header + deflate) |
//! | ZSTD   | standard zstd frame |
//! | SNAPPY | raw snappy block (not the framed format) |
//!
//! Owns: those codecs. Guarantees: `decompress` checks the announced
//! uncompressed size against the caller's limit before allocating, never
//! writes more than that size, and fails unless the output has exactly that
//! size. The broker never needs this on the write path; clients and tools do.

use std::io::{Read, Write};

use bytes::Bytes;

use crate::proto::CompressionType;

/// zstd level Pulsar's clients use (the library default).
pub const ZSTD_LEVEL: i32 = 3;

/// Why compressing or decompressing failed.
#[derive(Debug, thiserror::Error)]
pub enum CompressionError {
    /// The announced uncompressed size exceeds the caller's limit.
    #[error("uncompressed size {uncompressed_bytes} exceeds the limit of {max_bytes} bytes")]
    TooLarge {
        uncompressed_bytes: usize,
        max_bytes: usize,
    },
    /// The data does not decode with the codec.
    #[error("{codec:?} data is corrupt: {reason}")]
    Corrupt {
        codec: CompressionType,
        reason: String,
    },
    /// The data decodes to a size other than the announced one.
    #[error("{codec:?} data decompresses to {actual_bytes} bytes, metadata says {expected_bytes}")]
    SizeMismatch {
        codec: CompressionType,
        expected_bytes: usize,
        actual_bytes: usize,
    },
    /// The codec failed while compressing (should not happen with in-memory buffers).
    #[error("{codec:?} compression failed: {reason}")]
    CompressFailed {
        codec: CompressionType,
        reason: String,
    },
}

/// Compresses `input` with `codec`.
pub fn compress(codec: CompressionType, input: &[u8]) -> Result<Bytes, CompressionError> {
    let failed = |error: std::io::Error| CompressionError::CompressFailed {
        codec,
        reason: error.to_string(),
    };
    let output = match codec {
        CompressionType::None => input.to_vec(),
        CompressionType::Lz4 => lz4_flex::block::compress(input),
        CompressionType::Zlib => {
            let mut encoder =
                flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            encoder.write_all(input).map_err(failed)?;
            encoder.finish().map_err(failed)?
        }
        CompressionType::Zstd => zstd::bulk::compress(input, ZSTD_LEVEL).map_err(failed)?,
        CompressionType::Snappy => {
            snap::raw::Encoder::new()
                .compress_vec(input)
                .map_err(|error| CompressionError::CompressFailed {
                    codec,
                    reason: error.to_string(),
                })?
        }
    };
    Ok(Bytes::from(output))
}

/// Decompresses `input` that the metadata says holds `uncompressed_bytes`,
/// refusing anything above `max_bytes` before allocating.
pub fn decompress(
    codec: CompressionType,
    input: &[u8],
    uncompressed_bytes: usize,
    max_bytes: usize,
) -> Result<Bytes, CompressionError> {
    let corrupt = |reason: String| CompressionError::Corrupt { codec, reason };
    let mismatch = |actual_bytes: usize| CompressionError::SizeMismatch {
        codec,
        expected_bytes: uncompressed_bytes,
        actual_bytes,
    };
    // For NONE the size field is optional; only the limit applies.
    let limited_bytes = if codec == CompressionType::None {
        input.len()
    } else {
        uncompressed_bytes
    };
    if limited_bytes > max_bytes {
        return Err(CompressionError::TooLarge {
            uncompressed_bytes: limited_bytes,
            max_bytes,
        });
    }
    let output = match codec {
        CompressionType::None => input.to_vec(),
        CompressionType::Lz4 => {
            let mut output = vec![0u8; uncompressed_bytes];
            let written = lz4_flex::block::decompress_into(input, &mut output)
                .map_err(|error| corrupt(error.to_string()))?;
            if written != uncompressed_bytes {
                return Err(mismatch(written));
            }
            output
        }
        CompressionType::Zlib => {
            let mut output = Vec::with_capacity(uncompressed_bytes);
            // Read one byte more than announced to detect longer data.
            flate2::read::ZlibDecoder::new(input)
                .take((uncompressed_bytes as u64).saturating_add(1))
                .read_to_end(&mut output)
                .map_err(|error| corrupt(error.to_string()))?;
            if output.len() != uncompressed_bytes {
                return Err(mismatch(output.len()));
            }
            output
        }
        CompressionType::Zstd => {
            // Fails if the frame decodes to more than the capacity.
            let output = zstd::bulk::decompress(input, uncompressed_bytes)
                .map_err(|error| corrupt(error.to_string()))?;
            if output.len() != uncompressed_bytes {
                return Err(mismatch(output.len()));
            }
            output
        }
        CompressionType::Snappy => {
            let announced =
                snap::raw::decompress_len(input).map_err(|error| corrupt(error.to_string()))?;
            if announced != uncompressed_bytes {
                return Err(mismatch(announced));
            }
            let mut output = vec![0u8; uncompressed_bytes];
            let written = snap::raw::Decoder::new()
                .decompress(input, &mut output)
                .map_err(|error| corrupt(error.to_string()))?;
            if written != uncompressed_bytes {
                return Err(mismatch(written));
            }
            output
        }
    };
    Ok(Bytes::from(output))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const CODECS: [CompressionType; 5] = [
        CompressionType::None,
        CompressionType::Lz4,
        CompressionType::Zlib,
        CompressionType::Zstd,
        CompressionType::Snappy,
    ];

    fn sample() -> Vec<u8> {
        (0..10_000u32)
            .flat_map(|i| (i % 97).to_le_bytes())
            .collect()
    }

    #[test]
    fn round_trip_every_codec() {
        let input = sample();
        for codec in CODECS {
            let compressed = compress(codec, &input).unwrap();
            let output = decompress(codec, &compressed, input.len(), input.len()).unwrap();
            assert_eq!(output, input, "{codec:?}");
        }
        for codec in CODECS {
            let compressed = compress(codec, b"").unwrap();
            assert!(
                decompress(codec, &compressed, 0, 10).unwrap().is_empty(),
                "{codec:?}"
            );
        }
    }

    #[test]
    fn known_formats() {
        // zlib stream header (deflate, default level), not raw deflate or gzip.
        assert_eq!(
            &compress(CompressionType::Zlib, b"x").unwrap()[..2],
            &[0x78, 0x9c]
        );
        // zstd frame magic.
        assert_eq!(
            &compress(CompressionType::Zstd, b"x").unwrap()[..4],
            &[0x28, 0xb5, 0x2f, 0xfd]
        );
        // raw snappy starts with the uncompressed length varint (not the framed stream id 0xff).
        assert_eq!(compress(CompressionType::Snappy, b"abc").unwrap()[0], 3);
        // raw LZ4 block: a literal-only block is token + literals, no frame magic or size prefix.
        assert_eq!(
            &compress(CompressionType::Lz4, b"abc").unwrap()[..],
            &[0x30, b'a', b'b', b'c']
        );
    }

    #[test]
    fn limits_and_lies_are_typed_errors() {
        let input = sample();
        for codec in CODECS {
            let compressed = compress(codec, &input).unwrap();
            assert!(
                matches!(
                    decompress(codec, &compressed, input.len(), input.len() - 1),
                    Err(CompressionError::TooLarge { .. })
                ),
                "{codec:?}"
            );
            if codec == CompressionType::None {
                continue;
            }
            // A size that lies, smaller or larger: never a panic, always an error.
            for size in [input.len() - 1, input.len() + 1, 0] {
                assert!(
                    decompress(codec, &compressed, size, usize::MAX).is_err(),
                    "{codec:?} {size}"
                );
            }
            // Garbage input.
            assert!(
                decompress(codec, &[0xff; 64], 1000, 1000).is_err(),
                "{codec:?}"
            );
            // Truncated input.
            let cut = &compressed[..compressed.len() / 2];
            assert!(
                decompress(codec, cut, input.len(), input.len()).is_err(),
                "{codec:?}"
            );
        }
        // The limit is checked before allocating: a huge size fails at once.
        assert!(matches!(
            decompress(CompressionType::Lz4, b"", usize::MAX, 1 << 20),
            Err(CompressionError::TooLarge { .. })
        ));
    }
}
