//! MNIST's four files under the names mirrors give them: with a dash or MNIST's original dot
//! before `idx`, raw or gzipped, in any mix; the first spelling present wins, and a missing
//! file is reported with every name tried.

mod common;

use std::io::Write;

use common::*;
use flate2::write::GzEncoder;
use flate2::Compression;
use tapejit_mnist::{self as mnist, Dataset, Error};

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// The four files' contents: train and test sets of different sizes, so a mix-up shows.
fn mnist_files() -> [(&'static str, Vec<u8>); 4] {
    [
        (mnist::TRAIN_IMAGES, images_bytes(&sample_images(6, 4, 4))),
        (mnist::TRAIN_LABELS, labels_bytes(&sample_labels(6))),
        (mnist::TEST_IMAGES, images_bytes(&sample_images(2, 4, 4))),
        (mnist::TEST_LABELS, labels_bytes(&sample_labels(2))),
    ]
}

fn expected() -> (Dataset, Dataset) {
    let train = Dataset {
        images: sample_images(6, 4, 4),
        labels: sample_labels(6),
    };
    let test = Dataset {
        images: sample_images(2, 4, 4),
        labels: sample_labels(2),
    };
    (train, test)
}

/// How a file is stored: which of `names_for`'s names, and whether gzipped.
#[derive(Clone, Copy, Debug)]
enum Spelling {
    Dashed,
    DashedGz,
    Dotted,
    DottedGz,
}

impl Spelling {
    const ALL: [Spelling; 4] = [
        Spelling::Dashed,
        Spelling::DashedGz,
        Spelling::Dotted,
        Spelling::DottedGz,
    ];

    fn store(self, dir: &TempDir, name: &str, bytes: &[u8]) {
        let dotted = name.replacen("-idx", ".idx", 1);
        match self {
            Spelling::Dashed => dir.write(name, bytes),
            Spelling::DashedGz => dir.write(&format!("{name}.gz"), &gzip(bytes)),
            Spelling::Dotted => dir.write(&dotted, bytes),
            Spelling::DottedGz => dir.write(&format!("{dotted}.gz"), &gzip(bytes)),
        }
    }
}

#[test]
fn names_for_lists_dashed_gzipped_dotted_and_dotted_gzipped() {
    assert_eq!(
        mnist::names_for(mnist::TEST_LABELS),
        [
            "t10k-labels-idx1-ubyte",
            "t10k-labels-idx1-ubyte.gz",
            "t10k-labels.idx1-ubyte",
            "t10k-labels.idx1-ubyte.gz",
        ]
    );
}

#[test]
fn load_mnist_reads_each_spelling() {
    for spelling in Spelling::ALL {
        let dir = TempDir::new(&format!("mnist-{spelling:?}"));
        for (name, bytes) in mnist_files() {
            spelling.store(&dir, name, &bytes);
        }
        assert_eq!(
            mnist::load_mnist(&dir.0).unwrap(),
            expected(),
            "{spelling:?}"
        );
    }
}

#[test]
fn load_mnist_reads_a_mix_of_spellings() {
    let dir = TempDir::new("mnist-mixed");
    for ((name, bytes), spelling) in mnist_files().into_iter().zip(Spelling::ALL.iter().rev()) {
        spelling.store(&dir, name, &bytes);
    }
    assert_eq!(mnist::load_mnist(&dir.0).unwrap(), expected());
    assert_eq!(mnist::load_train(&dir.0).unwrap(), expected().0);
    assert_eq!(mnist::load_test(&dir.0).unwrap(), expected().1);
}

/// With several spellings present the first of `names_for` wins, so a directory where
/// `scripts/fetch-mnist` unpacked the downloads reads the unpacked files.
#[test]
fn the_first_spelling_present_wins() {
    let dir = TempDir::new("mnist-both");
    dir.write(mnist::TRAIN_LABELS, b"the dashed raw file");
    Spelling::DottedGz.store(&dir, mnist::TRAIN_LABELS, b"the dotted gzipped file");
    assert_eq!(
        mnist::find(&dir.0, mnist::TRAIN_LABELS).unwrap(),
        dir.0.join(mnist::TRAIN_LABELS)
    );
    let dir = TempDir::new("mnist-gz-and-dotted");
    Spelling::Dotted.store(&dir, mnist::TRAIN_LABELS, b"");
    Spelling::DashedGz.store(&dir, mnist::TRAIN_LABELS, b"");
    assert_eq!(
        mnist::find(&dir.0, mnist::TRAIN_LABELS).unwrap(),
        dir.0.join("train-labels-idx1-ubyte.gz")
    );
}

#[test]
fn a_missing_file_lists_every_name_tried() {
    let dir = TempDir::new("mnist-no-test-labels");
    for (name, bytes) in &mnist_files()[..3] {
        Spelling::DottedGz.store(&dir, name, bytes);
    }
    let error = mnist::load_mnist(&dir.0).unwrap_err();
    let tried = mnist::names_for(mnist::TEST_LABELS);
    assert_eq!(
        error,
        Error::NotInDirectory {
            dir: dir.0.display().to_string(),
            tried: tried.to_vec(),
        }
    );
    let message = error.to_string();
    for name in &tried {
        assert!(message.contains(name.as_str()), "{message}");
    }
}
