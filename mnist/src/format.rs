//! The IDX header: what it may say and how much data it declares. Nothing here allocates for
//! the data; callers check the declared size against the bytes they have first.

use std::fmt;

use byteorder::{BigEndian, ByteOrder};

use crate::error::IdxProblem;

/// Byte 2 of the header: the data are unsigned bytes.
pub(crate) const UNSIGNED_BYTE: u8 = 0x08;
/// Magic, data type and dimension count precede the sizes.
const FIXED_HEADER_LEN: usize = 4;
/// The largest label MNIST uses (the digits 0-9).
const MAX_LABEL: u8 = 9;

/// Which of the two MNIST file kinds a file is, told apart by its number of dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// 3 dimensions: count, rows, cols.
    Images,
    /// 1 dimension: count.
    Labels,
}

impl Kind {
    /// The number of dimensions a file of this kind declares in byte 3.
    pub fn dimensions(self) -> u8 {
        match self {
            Kind::Images => 3,
            Kind::Labels => 1,
        }
    }

    /// The header length of a file of this kind: fixed part plus one `u32` per dimension.
    pub fn header_len(self) -> usize {
        FIXED_HEADER_LEN + 4 * self.dimensions() as usize
    }

    fn from_dimensions(dimensions: u8) -> Option<Kind> {
        [Kind::Images, Kind::Labels]
            .into_iter()
            .find(|kind| kind.dimensions() == dimensions)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Images => "images",
            Kind::Labels => "labels",
        })
    }
}

/// A checked header: the declared sizes and the data length they multiply to.
pub(crate) struct Header {
    pub sizes: Vec<usize>,
    pub header_len: usize,
    pub data_len: usize,
}

/// Checks the header at the start of `bytes` (the whole file or only its first bytes) as a
/// file of `kind`; `bytes` shorter than the header is a truncated header.
pub(crate) fn check_header(bytes: &[u8], kind: Kind) -> Result<Header, IdxProblem> {
    let Some(fixed) = bytes.get(..FIXED_HEADER_LEN) else {
        return Err(IdxProblem::TruncatedHeader {
            expected: kind.header_len(),
            found: bytes.len(),
        });
    };
    check_fixed_header([fixed[0], fixed[1], fixed[2], fixed[3]], kind)?;
    let header_len = kind.header_len();
    let Some(size_fields) = bytes.get(FIXED_HEADER_LEN..header_len) else {
        return Err(IdxProblem::TruncatedHeader {
            expected: header_len,
            found: bytes.len(),
        });
    };
    // u32 always fits in usize on the 32- and 64-bit targets LLVM's JIT supports.
    let sizes: Vec<usize> = size_fields
        .chunks_exact(4)
        .map(|field| BigEndian::read_u32(field) as usize)
        .collect();
    let data_len = sizes
        .iter()
        .try_fold(1usize, |product, &size| product.checked_mul(size))
        .ok_or_else(|| IdxProblem::SizeOverflow {
            sizes: sizes.clone(),
        })?;
    Ok(Header {
        sizes,
        header_len,
        data_len,
    })
}

/// Checks that `found` data bytes after the header are exactly what it declares.
pub(crate) fn check_data_len(header: &Header, found: usize) -> Result<(), IdxProblem> {
    let expected = header.data_len;
    if found < expected {
        return Err(IdxProblem::Truncated {
            sizes: header.sizes.clone(),
            header_len: header.header_len,
            expected,
            found,
        });
    }
    if found > expected {
        return Err(IdxProblem::TrailingBytes {
            offset: header.header_len + expected,
            extra: found - expected,
        });
    }
    Ok(())
}

/// Magic, data type and dimension count: everything before the sizes.
fn check_fixed_header(fixed: [u8; 4], kind: Kind) -> Result<(), IdxProblem> {
    let [magic0, magic1, data_type, dimensions] = fixed;
    if [magic0, magic1] != [0, 0] {
        return Err(IdxProblem::BadMagic {
            found: [magic0, magic1],
        });
    }
    if data_type != UNSIGNED_BYTE {
        return Err(IdxProblem::WrongDataType { found: data_type });
    }
    if dimensions != kind.dimensions() {
        return Err(match Kind::from_dimensions(dimensions) {
            Some(found) => IdxProblem::WrongKind {
                expected: kind,
                found,
            },
            None => IdxProblem::WrongDimensions {
                kind,
                expected: kind.dimensions(),
                found: dimensions,
            },
        });
    }
    Ok(())
}

/// The first label above 9, located by its index and its byte offset (`data_start` + index).
pub(crate) fn check_label_range(labels: &[u8], data_start: usize) -> Result<(), IdxProblem> {
    match labels.iter().position(|&label| label > MAX_LABEL) {
        Some(index) => Err(IdxProblem::LabelOutOfRange {
            index,
            offset: data_start + index,
            value: labels[index],
        }),
        None => Ok(()),
    }
}
