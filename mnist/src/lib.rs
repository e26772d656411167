//! MNIST for tapejit's examples, benchmarks and tests: the IDX file format, raw or gzipped,
//! and MNIST's four files under either naming convention. The compiler core does not depend
//! on this crate; it only ever sees `f64` inputs.
//!
//! An IDX file is a tiny big-endian header followed by raw bytes:
//!
//! | bytes | content |
//! |---|---|
//! | 2 | zero (the magic) |
//! | 1 | data type; only `0x08` (unsigned byte) is used by MNIST and accepted here |
//! | 1 | `d`, the number of dimensions: 3 for images, 1 for labels |
//! | 4·d | the size of each dimension, `u32` big-endian: count (then rows, cols) |
//! | rest | the data, row-major, exactly the product of the sizes in bytes |
//!
//! Files come from outside the program, so every malformed input is a typed
//! [`Error::Idx`] that names the file and an [`IdxProblem`] that locates the fault, never a
//! panic. Nothing is allocated beyond what the file holds: a raw file's declared sizes are
//! checked against its length first, and a gzipped file is decompressed only as far as its
//! header declares.
//!
//! What a model makes of an example is the caller's business: [`Dataset::pixels`] and
//! [`Dataset::label`] give the bytes, [`write_normalized`] and [`write_one_hot`] turn them
//! into `f64`s wherever the model's inputs want them.
//!
//! ```no_run
//! let (train, _test) = tapejit_mnist::load_mnist("data/mnist")?;
//! let mut pixels = vec![0.0; train.images.pixels_per_image()];
//! tapejit_mnist::write_normalized(train.pixels(0), &mut pixels)?;
//! let mut label = [0.0; 10];
//! tapejit_mnist::write_one_hot(train.label(0), &mut label)?;
//! # Ok::<(), tapejit_mnist::Error>(())
//! ```

mod data;
mod error;
mod format;
mod gzip;
mod mnist;
mod read;
mod write;

pub use data::{write_normalized, write_one_hot, Dataset, Images, Labels};
pub use error::{Error, IdxProblem, Result};
pub use format::Kind;
pub use mnist::{
    find, load_mnist, load_test, load_train, names_for, TEST_IMAGES, TEST_LABELS, TRAIN_IMAGES,
    TRAIN_LABELS,
};
pub use read::{
    load_dataset, load_images, load_labels, parse_images, parse_labels, read_images, read_labels,
};
pub use write::{write_images, write_labels};
