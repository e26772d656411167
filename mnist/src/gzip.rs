//! Gzipped IDX files, as MNIST's mirrors serve them. flate2 inflates; this module decides
//! how much to ask of it: the header first, then exactly the data the header declares, then
//! one byte to prove the stream ends there. Neither a lying header nor a gzip bomb makes the
//! reader allocate more than the decompressed data it actually gets.

use std::io::Read;

use flate2::read::MultiGzDecoder;

use crate::error::IdxProblem;
use crate::format::{check_data_len, check_header, Header, Kind};

/// gzip's first two bytes. An IDX file starts with two zero bytes, so the two never clash.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Deflate's largest expansion: one compressed byte yields at most 1032 bytes (zlib's
/// technical notes). The data buffer is reserved up front only as far as the compressed size
/// can justify; past that it grows as decompressed bytes actually arrive.
const MAX_DEFLATE_RATIO: usize = 1032;

/// Whether `bytes` start like a gzip stream.
pub(crate) fn is_gzip(bytes: &[u8]) -> bool {
    bytes.starts_with(&GZIP_MAGIC)
}

/// Decompresses `compressed` as an IDX file of `kind`: its checked header and its data.
/// Every gzip member is read, as `gunzip` does; a corrupt or truncated stream, a wrong
/// checksum and bytes after the last member are [`IdxProblem::Gzip`].
pub(crate) fn decompress(compressed: &[u8], kind: Kind) -> Result<(Header, Vec<u8>), IdxProblem> {
    let mut decoder = MultiGzDecoder::new(compressed);
    let mut header_bytes = Vec::with_capacity(kind.header_len());
    read_at_most(&mut decoder, kind.header_len(), &mut header_bytes)?;
    let header = check_header(&header_bytes, kind)?;

    let justified = compressed.len().saturating_mul(MAX_DEFLATE_RATIO);
    let mut data = Vec::with_capacity(header.data_len.min(justified));
    read_at_most(&mut decoder, header.data_len, &mut data)?;
    check_data_len(&header, data.len())?;

    // Reading on to the end of the stream also verifies each member's CRC and length.
    if read_at_most(&mut decoder, 1, &mut Vec::new())? > 0 {
        return Err(IdxProblem::DecompressesPastData {
            offset: header.header_len + header.data_len,
        });
    }
    Ok((header, data))
}

/// Appends at most `limit` decompressed bytes to `out`, fewer only where the stream ends.
fn read_at_most(decoder: impl Read, limit: usize, out: &mut Vec<u8>) -> Result<usize, IdxProblem> {
    // The input is already in memory, so any error is the stream's, not the disk's.
    decoder
        .take(limit as u64)
        .read_to_end(out)
        .map_err(|error| IdxProblem::Gzip {
            message: error.to_string(),
        })
}
