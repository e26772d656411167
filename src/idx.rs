//! The IDX file format of MNIST: a tiny big-endian header followed by raw bytes.
//!
//! | bytes | content |
//! |---|---|
//! | 2 | zero (the magic) |
//! | 1 | data type; only `0x08` (unsigned byte) is used by MNIST and accepted here |
//! | 1 | `d`, the number of dimensions: 3 for images, 1 for labels |
//! | 4·d | the size of each dimension, `u32` big-endian: count (then rows, cols) |
//! | rest | the data, row-major, exactly the product of the sizes in bytes |
//!
//! Files come from outside the program, so every malformed input is a typed [`Error::Idx`]
//! that names the file and an [`IdxProblem`] that locates the fault, never a panic. The
//! declared sizes are checked against the bytes actually present before anything is
//! allocated, so a corrupt header cannot request gigabytes.
//!
//! `scripts/fetch-mnist` downloads the four MNIST files under the names [`TRAIN_IMAGES`],
//! [`TRAIN_LABELS`], [`TEST_IMAGES`] and [`TEST_LABELS`] into `data/mnist`.

use std::fmt;
use std::io::{self, Read, Write};
use std::path::Path;

use byteorder::{BigEndian, ByteOrder, WriteBytesExt};
use thiserror::Error;

use crate::error::{Error, Result};

/// MNIST's training images (60,000 of 28×28), as named by `scripts/fetch-mnist`.
pub const TRAIN_IMAGES: &str = "train-images-idx3-ubyte";
/// MNIST's training labels (60,000).
pub const TRAIN_LABELS: &str = "train-labels-idx1-ubyte";
/// MNIST's test images (10,000 of 28×28).
pub const TEST_IMAGES: &str = "t10k-images-idx3-ubyte";
/// MNIST's test labels (10,000).
pub const TEST_LABELS: &str = "t10k-labels-idx1-ubyte";

/// Byte 2 of the header: the data are unsigned bytes.
const UNSIGNED_BYTE: u8 = 0x08;
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

/// What is wrong with an IDX file. Each variant carries the offsets and the expected and
/// found values that locate the problem; [`Error::Idx`] adds the file name.
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
    /// The file ends inside its header.
    #[error("the file is {} long, shorter than its {expected}-byte header", plural(*.found, "byte"))]
    TruncatedHeader { expected: usize, found: usize },
    /// Bytes 0-1 are not zero.
    #[error("{}", describe_bad_magic(.found))]
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

fn describe_bad_magic(found: &[u8; 2]) -> String {
    let hint = if found == &[0x1f, 0x8b] {
        " (it looks gzip-compressed: gunzip it first)"
    } else {
        ""
    };
    format!(
        "bytes 0-1 are {:#04x} {:#04x}, not 0x00 0x00, so this is not an IDX file{hint}",
        found[0], found[1]
    )
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

impl IdxProblem {
    /// Keeps what matters of an I/O error; a missing file gets its own variant because it is
    /// the common case (data not downloaded yet) and deserves a plain message.
    fn from_io(error: &io::Error) -> IdxProblem {
        match error.kind() {
            io::ErrorKind::NotFound => IdxProblem::NotFound,
            kind => IdxProblem::Io {
                kind,
                message: error.to_string(),
            },
        }
    }

    fn in_file(self, file: &str) -> Error {
        Error::Idx {
            file: file.to_string(),
            problem: self,
        }
    }
}

/// A set of equally sized greyscale images, one byte per pixel.
#[derive(Clone, PartialEq, Eq)]
pub struct Images {
    pub count: usize,
    pub rows: usize,
    pub cols: usize,
    /// Row-major; image `i` is `pixels[i * rows * cols..(i + 1) * rows * cols]`.
    pub pixels: Vec<u8>,
}

impl Images {
    /// The number of images.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether there are no images.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// `rows * cols`.
    pub fn pixels_per_image(&self) -> usize {
        self.rows * self.cols
    }

    /// The pixels of image `i`, row-major.
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`, like slice indexing.
    pub fn image(&self, i: usize) -> &[u8] {
        assert!(i < self.count, "image {i} of {} images", self.count);
        let size = self.pixels_per_image();
        &self.pixels[i * size..(i + 1) * size]
    }
}

/// Summarizes rather than printing every pixel, so a failed `assert_eq!` stays readable.
impl fmt::Debug for Images {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Images")
            .field("count", &self.count)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("pixels.len()", &self.pixels.len())
            .finish()
    }
}

/// One digit 0-9 per example.
#[derive(Clone, PartialEq, Eq)]
pub struct Labels {
    pub labels: Vec<u8>,
}

impl Labels {
    /// The number of labels.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no labels.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

/// Summarizes rather than printing every label, so a failed `assert_eq!` stays readable.
impl fmt::Debug for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Labels")
            .field("labels.len()", &self.labels.len())
            .finish()
    }
}

/// Images and their labels; `images.len() == labels.len()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dataset {
    pub images: Images,
    pub labels: Labels,
}

impl Dataset {
    pub fn len(&self) -> usize {
        self.images.len()
    }

    pub fn is_empty(&self) -> bool {
        self.images.is_empty()
    }

    /// Writes sample `i` in [`crate::nn::Classifier`]'s input layout: the pixels scaled to
    /// `[0, 1]`, then the label one-hot over `classes`. `inputs` must hold exactly
    /// `pixels_per_image() + classes` values and the label must be below `classes`.
    pub fn fill_inputs(&self, i: usize, classes: usize, inputs: &mut [f64]) -> Result<()> {
        let pixels = self.images.image(i);
        let label = self.labels.labels[i] as usize;
        if inputs.len() != pixels.len() + classes || label >= classes {
            return Err(Error::WrongLength {
                what: "classifier inputs (pixels + one-hot label)",
                expected: pixels.len() + classes.max(label + 1),
                got: inputs.len(),
            });
        }
        let (x, onehot) = inputs.split_at_mut(pixels.len());
        for (x, &p) in x.iter_mut().zip(pixels) {
            *x = p as f64 / 255.0;
        }
        onehot.fill(0.0);
        onehot[label] = 1.0;
        Ok(())
    }
}

/// Where the data of a checked file are: the declared sizes and the data's byte range.
struct Layout {
    sizes: Vec<usize>,
    data_start: usize,
}

/// Checks header and length of `bytes` as a file of `kind` without allocating for the data.
fn check_layout(bytes: &[u8], kind: Kind) -> std::result::Result<Layout, IdxProblem> {
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
    let expected = sizes
        .iter()
        .try_fold(1usize, |product, &size| product.checked_mul(size))
        .ok_or_else(|| IdxProblem::SizeOverflow {
            sizes: sizes.clone(),
        })?;
    let found = bytes.len() - header_len;
    if found < expected {
        return Err(IdxProblem::Truncated {
            sizes,
            header_len,
            expected,
            found,
        });
    }
    if found > expected {
        return Err(IdxProblem::TrailingBytes {
            offset: header_len + expected,
            extra: found - expected,
        });
    }
    Ok(Layout {
        sizes,
        data_start: header_len,
    })
}

/// Magic, data type and dimension count: everything before the sizes.
fn check_fixed_header(fixed: [u8; 4], kind: Kind) -> std::result::Result<(), IdxProblem> {
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

fn images_from_layout(layout: &Layout, pixels: Vec<u8>) -> Images {
    Images {
        count: layout.sizes[0],
        rows: layout.sizes[1],
        cols: layout.sizes[2],
        pixels,
    }
}

fn check_label_range(labels: &[u8], data_start: usize) -> std::result::Result<(), IdxProblem> {
    match labels.iter().position(|&label| label > MAX_LABEL) {
        Some(index) => Err(IdxProblem::LabelOutOfRange {
            index,
            offset: data_start + index,
            value: labels[index],
        }),
        None => Ok(()),
    }
}

/// Parses the bytes of an IDX images file; `file` names it in errors.
pub fn parse_images(bytes: &[u8], file: &str) -> Result<Images> {
    let layout = check_layout(bytes, Kind::Images).map_err(|p| p.in_file(file))?;
    let pixels = bytes[layout.data_start..].to_vec();
    Ok(images_from_layout(&layout, pixels))
}

/// Parses the bytes of an IDX labels file; `file` names it in errors.
pub fn parse_labels(bytes: &[u8], file: &str) -> Result<Labels> {
    let layout = check_layout(bytes, Kind::Labels).map_err(|p| p.in_file(file))?;
    let labels = &bytes[layout.data_start..];
    check_label_range(labels, layout.data_start).map_err(|p| p.in_file(file))?;
    Ok(Labels {
        labels: labels.to_vec(),
    })
}

/// Like [`parse_images`] but keeps the buffer: MNIST's training images are 47 MB, and
/// dropping the header in place avoids a second copy.
fn images_from_owned(mut bytes: Vec<u8>, file: &str) -> Result<Images> {
    let layout = check_layout(&bytes, Kind::Images).map_err(|p| p.in_file(file))?;
    bytes.drain(..layout.data_start);
    Ok(images_from_layout(&layout, bytes))
}

/// Like [`parse_labels`] but keeps the buffer.
fn labels_from_owned(mut bytes: Vec<u8>, file: &str) -> Result<Labels> {
    let layout = check_layout(&bytes, Kind::Labels).map_err(|p| p.in_file(file))?;
    check_label_range(&bytes[layout.data_start..], layout.data_start)
        .map_err(|p| p.in_file(file))?;
    bytes.drain(..layout.data_start);
    Ok(Labels { labels: bytes })
}

fn read_all(mut reader: impl Read, file: &str) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    reader
        .read_to_end(&mut bytes)
        .map_err(|e| IdxProblem::from_io(&e).in_file(file))?;
    Ok(bytes)
}

fn read_path(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| IdxProblem::from_io(&e).in_file(&path.display().to_string()))
}

/// Reads an IDX images file to its end from `reader`; `file` names it in errors.
pub fn read_images(reader: impl Read, file: &str) -> Result<Images> {
    images_from_owned(read_all(reader, file)?, file)
}

/// Reads an IDX labels file to its end from `reader`; `file` names it in errors.
pub fn read_labels(reader: impl Read, file: &str) -> Result<Labels> {
    labels_from_owned(read_all(reader, file)?, file)
}

/// Loads an IDX images file; errors name it by `path.display()`.
pub fn load_images(path: impl AsRef<Path>) -> Result<Images> {
    let path = path.as_ref();
    images_from_owned(read_path(path)?, &path.display().to_string())
}

/// Loads an IDX labels file; errors name it by `path.display()`.
pub fn load_labels(path: impl AsRef<Path>) -> Result<Labels> {
    let path = path.as_ref();
    labels_from_owned(read_path(path)?, &path.display().to_string())
}

/// Loads an images file and its labels file, which must hold the same number of examples
/// (otherwise the error names the labels file and its message the images file).
pub fn load_dataset(images: impl AsRef<Path>, labels: impl AsRef<Path>) -> Result<Dataset> {
    let (images_path, labels_path) = (images.as_ref(), labels.as_ref());
    let images = load_images(images_path)?;
    let labels = load_labels(labels_path)?;
    if images.len() != labels.len() {
        return Err(IdxProblem::CountMismatch {
            images_file: images_path.display().to_string(),
            images: images.len(),
            labels: labels.len(),
        }
        .in_file(&labels_path.display().to_string()));
    }
    Ok(Dataset { images, labels })
}

/// Loads MNIST's `(train, test)` datasets from the four files named [`TRAIN_IMAGES`],
/// [`TRAIN_LABELS`], [`TEST_IMAGES`] and [`TEST_LABELS`] in `dir` (`scripts/fetch-mnist`
/// puts them in `data/mnist`).
pub fn load_mnist(dir: impl AsRef<Path>) -> Result<(Dataset, Dataset)> {
    let dir = dir.as_ref();
    let train = load_dataset(dir.join(TRAIN_IMAGES), dir.join(TRAIN_LABELS))?;
    let test = load_dataset(dir.join(TEST_IMAGES), dir.join(TEST_LABELS))?;
    Ok((train, test))
}

fn invalid_input(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// A size as the header's `u32`, or an error if the format cannot express it.
fn header_size(size: usize, what: &str) -> io::Result<u32> {
    u32::try_from(size)
        .map_err(|_| invalid_input(format!("{what} {size} does not fit an IDX header's u32")))
}

/// Converts every size before writing the first byte, so a refused file leaves `w` untouched.
fn write_header(mut w: impl Write, sizes: &[(usize, &str)]) -> io::Result<()> {
    let fields = sizes
        .iter()
        .map(|&(size, what)| header_size(size, what))
        .collect::<io::Result<Vec<u32>>>()?;
    w.write_all(&[0, 0, UNSIGNED_BYTE, fields.len() as u8])?;
    for field in fields {
        w.write_u32::<BigEndian>(field)?;
    }
    Ok(())
}

/// Writes `images` as an IDX images file. Refuses (`InvalidInput`, before writing anything)
/// what [`parse_images`] would reject: sizes beyond `u32` or a pixel count that does not
/// match `count * rows * cols`.
pub fn write_images(mut w: impl Write, images: &Images) -> io::Result<()> {
    let expected = images
        .count
        .checked_mul(images.rows)
        .and_then(|n| n.checked_mul(images.cols));
    if expected != Some(images.pixels.len()) {
        return Err(invalid_input(format!(
            "{} images of {}×{} need {} pixels, but there are {}",
            images.count,
            images.rows,
            images.cols,
            expected.map_or("more".to_string(), |n| n.to_string()),
            images.pixels.len()
        )));
    }
    let sizes = [
        (images.count, "image count"),
        (images.rows, "rows"),
        (images.cols, "cols"),
    ];
    write_header(&mut w, &sizes)?;
    w.write_all(&images.pixels)
}

/// Writes `labels` as an IDX labels file. Refuses (`InvalidInput`, before writing anything)
/// what [`parse_labels`] would reject: more than `u32::MAX` labels or a label above 9.
pub fn write_labels(mut w: impl Write, labels: &Labels) -> io::Result<()> {
    if let Err(problem) = check_label_range(&labels.labels, Kind::Labels.header_len()) {
        return Err(invalid_input(problem.to_string()));
    }
    write_header(&mut w, &[(labels.len(), "label count")])?;
    w.write_all(&labels.labels)
}
