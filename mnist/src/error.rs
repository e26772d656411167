//! The crate's error type. A file error names the file and carries an [`IdxProblem`] that
//! locates the fault; the other variants carry the arguments that were refused.

use std::io;

use thiserror::Error;

use crate::format::Kind;

/// Everything that can go wrong when finding, reading or using MNIST's files.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum Error {
    /// A missing, unreadable or malformed IDX file, raw or gzipped.
    #[error("{file}: {problem}")]
    Idx { file: String, problem: IdxProblem },
    /// None of the names one of MNIST's files goes by is present in `dir`.
    #[error("{dir}: found none of {}", tried.join(", "))]
    NotInDirectory { dir: String, tried: Vec<String> },
    /// A slice passed to a helper has the wrong length.
    #[error("{what}: expected {expected} values, got {got}")]
    WrongLength {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// A label with no slot in a one-hot vector of `classes` values.
    #[error("label {label} has no slot in a one-hot vector of {classes} values")]
    NoSlotForLabel { label: u8, classes: usize },
}

pub type Result<T> = std::result::Result<T, Error>;

/// What is wrong with an IDX file. Each variant carries the offsets and the expected and
/// found values that locate the problem; [`Error::Idx`] adds the file name. Offsets and sizes
/// of a gzipped file are those of its decompressed content.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum IdxProblem {
    /// Opening the file found nothing at that path.
    #[error("the file does not exist")]
    NotFound,
    /// Opening or reading failed for another reason. The `io::Error` itself is not `Clone`,
    /// so its kind and message are kept.
    #[error("cannot read the file: {message}")]
    Io {
        kind: io::ErrorKind,
        message: String,
    },
    /// The file starts like gzip but does not decompress: a corrupt or truncated stream, a
    /// wrong checksum, or bytes after the last gzip member.
    #[error("the file is gzip-compressed but cannot be decompressed: {message}")]
    Gzip { message: String },
    /// The file ends inside its header.
    #[error("the file is {} long, shorter than its {expected}-byte header", plural(*.found, "byte"))]
    TruncatedHeader { expected: usize, found: usize },
    /// Bytes 0-1 are not zero.
    #[error("bytes 0-1 are {:#04x} {:#04x}, not 0x00 0x00, so this is not an IDX file", .found[0], .found[1])]
    BadMagic { found: [u8; 2] },
    /// Byte 2 names a data type other than unsigned byte.
    #[error(
        "byte 2 says the data type is {found:#04x}, but only 0x08 (unsigned byte) is supported"
    )]
    WrongDataType { found: u8 },
    /// Byte 3 declares the number of dimensions of the other kind of file.
    #[error("byte 3 declares {}, so this is an IDX {found} file, but an IDX {expected} file ({}) was expected", plural(.found.dimensions().into(), "dimension"), plural(.expected.dimensions().into(), "dimension"))]
    WrongKind { expected: Kind, found: Kind },
    /// Byte 3 declares a number of dimensions that neither kind has.
    #[error("byte 3 declares {}, but an IDX {kind} file has {expected}", plural((*.found).into(), "dimension"))]
    WrongDimensions { kind: Kind, expected: u8, found: u8 },
    /// The product of the declared sizes does not fit in `usize`.
    #[error("the header's sizes {} multiply to more bytes than this machine can address", describe_sizes(.sizes))]
    SizeOverflow { sizes: Vec<usize> },
    /// The header declares more data than the file holds.
    #[error("the header declares {} = {}, but the file holds only {} after its {header_len}-byte header", describe_sizes(.sizes), plural(*.expected, "data byte"), plural(*.found, "byte"))]
    Truncated {
        sizes: Vec<usize>,
        header_len: usize,
        expected: usize,
        found: usize,
    },
    /// Bytes follow the declared data.
    #[error("the data end at byte offset {offset}, but the file has {} after them", plural(*.extra, "byte"))]
    TrailingBytes { offset: usize, extra: usize },
    /// A gzipped file decompresses past the declared data. Decompression stops at the first
    /// extra byte, so a gzip bomb costs no more than the data its header declares.
    #[error("the data end at byte offset {offset}, but the file decompresses to more")]
    DecompressesPastData { offset: usize },
    /// An images file and a labels file that do not describe the same examples.
    #[error("it holds {labels} labels, but {images_file} holds {images} images")]
    CountMismatch {
        images_file: String,
        images: usize,
        labels: usize,
    },
    /// A label that is not a digit.
    #[error("label {index} (byte offset {offset}) is {value}, not a digit 0-9")]
    LabelOutOfRange {
        index: usize,
        offset: usize,
        value: u8,
    },
}

impl IdxProblem {
    /// Keeps what matters of an I/O error; a missing file gets its own variant because it is
    /// the common case (data not downloaded yet) and deserves a plain message.
    pub(crate) fn from_io(error: &io::Error) -> IdxProblem {
        match error.kind() {
            io::ErrorKind::NotFound => IdxProblem::NotFound,
            kind => IdxProblem::Io {
                kind,
                message: error.to_string(),
            },
        }
    }

    pub(crate) fn in_file(self, file: &str) -> Error {
        Error::Idx {
            file: file.to_string(),
            problem: self,
        }
    }
}

/// `1 byte`, `2 bytes`.
fn plural(n: usize, noun: &str) -> String {
    let s = if n == 1 { "" } else { "s" };
    format!("{n} {noun}{s}")
}

/// `60000×28×28`.
fn describe_sizes(sizes: &[usize]) -> String {
    let parts: Vec<String> = sizes.iter().map(usize::to_string).collect();
    parts.join("×")
}
