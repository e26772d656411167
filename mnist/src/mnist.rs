//! MNIST's four files in a directory, under whichever name they were saved.
//!
//! Mirrors differ: `scripts/fetch-mnist` writes `train-images-idx3-ubyte`, LeCun's original
//! names have a dot (`train-images.idx3-ubyte`), and most downloads are still gzipped. Each
//! file is looked up under all four spellings, so a directory of downloads works as it is.

use std::path::{Path, PathBuf};

use crate::data::Dataset;
use crate::error::{Error, Result};
use crate::read::load_dataset;

/// MNIST's training images (60,000 of 28×28), under the name `scripts/fetch-mnist` uses.
pub const TRAIN_IMAGES: &str = "train-images-idx3-ubyte";
/// MNIST's training labels (60,000).
pub const TRAIN_LABELS: &str = "train-labels-idx1-ubyte";
/// MNIST's test images (10,000 of 28×28).
pub const TEST_IMAGES: &str = "t10k-images-idx3-ubyte";
/// MNIST's test labels (10,000).
pub const TEST_LABELS: &str = "t10k-labels-idx1-ubyte";

/// The names `name` (one of [`TRAIN_IMAGES`] and so on) goes by, in the order they are
/// tried: as given, gzipped, with the original dot before `idx`, and that gzipped.
pub fn names_for(name: &str) -> [String; 4] {
    let dotted = name.replacen("-idx", ".idx", 1);
    let dotted_gz = format!("{dotted}.gz");
    [name.to_string(), format!("{name}.gz"), dotted, dotted_gz]
}

/// The path of the first of [`names_for`]`(name)` present in `dir`, or
/// [`Error::NotInDirectory`] listing them all.
pub fn find(dir: impl AsRef<Path>, name: &str) -> Result<PathBuf> {
    let dir = dir.as_ref();
    let names = names_for(name);
    names
        .iter()
        .map(|candidate| dir.join(candidate))
        .find(|path| path.exists())
        .ok_or_else(|| Error::NotInDirectory {
            dir: dir.display().to_string(),
            tried: names.to_vec(),
        })
}

/// Loads MNIST's 60,000 training examples from `dir` (see [`find`] for the names).
pub fn load_train(dir: impl AsRef<Path>) -> Result<Dataset> {
    let dir = dir.as_ref();
    load_dataset(find(dir, TRAIN_IMAGES)?, find(dir, TRAIN_LABELS)?)
}

/// Loads MNIST's 10,000 test examples from `dir` (see [`find`] for the names).
pub fn load_test(dir: impl AsRef<Path>) -> Result<Dataset> {
    let dir = dir.as_ref();
    load_dataset(find(dir, TEST_IMAGES)?, find(dir, TEST_LABELS)?)
}

/// Loads MNIST's `(train, test)` datasets from the four files in `dir`, each raw or gzipped,
/// named with a dash or with MNIST's original dot before `idx` (see [`find`]).
pub fn load_mnist(dir: impl AsRef<Path>) -> Result<(Dataset, Dataset)> {
    let dir = dir.as_ref();
    Ok((load_train(dir)?, load_test(dir)?))
}
