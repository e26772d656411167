//! The IDX reader on raw files: round trips of generated files, one test per kind of
//! malformed input, a mutation sweep (every truncation, every header byte changed) that must
//! never panic, and the real MNIST files when `scripts/fetch-mnist` has put them in
//! `data/mnist`. Gzipped files are `gzip.rs`'s, MNIST's file names `names.rs`'s.

mod common;

use std::io::{self, Read};
use std::panic::catch_unwind;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use tapejit_mnist::{self as idx, Dataset, Error, IdxProblem, Images, Kind, Labels};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn images_problem(bytes: &[u8]) -> IdxProblem {
    idx_problem(idx::parse_images(bytes, "images.idx"), "images.idx")
}

fn labels_problem(bytes: &[u8]) -> IdxProblem {
    idx_problem(idx::parse_labels(bytes, "labels.idx"), "labels.idx")
}

/// A header for `dims` with the given data type, no data.
fn header(data_type: u8, dims: &[u32]) -> Vec<u8> {
    let mut bytes = vec![0, 0, data_type, dims.len() as u8];
    for d in dims {
        bytes.extend_from_slice(&d.to_be_bytes());
    }
    bytes
}

// ---------------------------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------------------------

#[test]
fn images_round_trip_through_parse_read_and_load() {
    let images = sample_images(5, 3, 4);
    let bytes = images_bytes(&images);
    assert_eq!(bytes.len(), 16 + 5 * 3 * 4);
    assert_eq!(&bytes[..4], &[0, 0, 8, 3]);
    assert_eq!(&bytes[4..16], &[0, 0, 0, 5, 0, 0, 0, 3, 0, 0, 0, 4]);

    assert_eq!(idx::parse_images(&bytes, "mem").unwrap(), images);
    assert_eq!(idx::read_images(&bytes[..], "mem").unwrap(), images);
    let file = TempFile::new("images", &bytes);
    assert_eq!(idx::load_images(&file.0).unwrap(), images);
}

#[test]
fn labels_round_trip_through_parse_read_and_load() {
    let labels = sample_labels(11);
    let bytes = labels_bytes(&labels);
    assert_eq!(bytes.len(), 8 + 11);
    assert_eq!(&bytes[..8], &[0, 0, 8, 1, 0, 0, 0, 11]);

    assert_eq!(idx::parse_labels(&bytes, "mem").unwrap(), labels);
    assert_eq!(idx::read_labels(&bytes[..], "mem").unwrap(), labels);
    let file = TempFile::new("labels", &bytes);
    assert_eq!(idx::load_labels(&file.0).unwrap(), labels);
}

#[test]
fn images_accessors_slice_row_major() {
    let images = sample_images(3, 2, 5);
    assert_eq!(images.len(), 3);
    assert!(!images.is_empty());
    assert_eq!(images.pixels_per_image(), 10);
    for i in 0..3 {
        assert_eq!(images.image(i), &images.pixels[i * 10..(i + 1) * 10]);
    }
}

#[test]
fn empty_files_round_trip() {
    let images = sample_images(0, 28, 28);
    let parsed = idx::parse_images(&images_bytes(&images), "mem").unwrap();
    assert!(parsed.is_empty());
    assert_eq!((parsed.rows, parsed.cols), (28, 28));
    let labels = idx::parse_labels(&labels_bytes(&sample_labels(0)), "mem").unwrap();
    assert!(labels.is_empty());
}

#[test]
fn load_dataset_pairs_images_with_labels() {
    let (images, labels) = (sample_images(4, 2, 2), sample_labels(4));
    let images_file = TempFile::new("ds-images", &images_bytes(&images));
    let labels_file = TempFile::new("ds-labels", &labels_bytes(&labels));
    let dataset = idx::load_dataset(&images_file.0, &labels_file.0).unwrap();
    assert_eq!(dataset, Dataset { images, labels });
}

#[test]
fn load_mnist_reads_the_four_canonical_names() {
    let dir = TempDir::new("mnist");
    let (train_images, train_labels) = (sample_images(6, 4, 4), sample_labels(6));
    let (test_images, test_labels) = (sample_images(2, 4, 4), sample_labels(2));
    dir.write(idx::TRAIN_IMAGES, &images_bytes(&train_images));
    dir.write(idx::TRAIN_LABELS, &labels_bytes(&train_labels));
    dir.write(idx::TEST_IMAGES, &images_bytes(&test_images));
    dir.write(idx::TEST_LABELS, &labels_bytes(&test_labels));

    let (train, test) = idx::load_mnist(&dir.0).unwrap();
    assert_eq!(train.images, train_images);
    assert_eq!(train.labels, train_labels);
    assert_eq!(test.images, test_images);
    assert_eq!(test.labels, test_labels);
}

#[test]
fn load_mnist_lists_the_names_it_tried_for_the_first_missing_file() {
    let dir = TempDir::new("mnist-missing");
    let error = idx::load_mnist(&dir.0).unwrap_err();
    let tried = [
        "train-images-idx3-ubyte",
        "train-images-idx3-ubyte.gz",
        "train-images.idx3-ubyte",
        "train-images.idx3-ubyte.gz",
    ];
    assert_eq!(
        error,
        Error::NotInDirectory {
            dir: dir.0.display().to_string(),
            tried: tried.map(String::from).to_vec(),
        }
    );
    assert_message(&error, &dir.0.display().to_string(), &tried);
}

// ---------------------------------------------------------------------------------------------
// One test per malformed kind
// ---------------------------------------------------------------------------------------------

#[test]
fn nonzero_magic_is_not_an_idx_file() {
    let mut bytes = images_bytes(&sample_images(1, 2, 2));
    bytes[1] = 0x42;
    assert_eq!(
        images_problem(&bytes),
        IdxProblem::BadMagic { found: [0, 0x42] }
    );
    let error = idx::parse_images(&bytes, "x.idx").unwrap_err();
    assert_message(&error, "x.idx", &["bytes 0-1", "0x42", "not an IDX file"]);
}

#[test]
fn data_type_other_than_unsigned_byte_is_refused() {
    let mut bytes = labels_bytes(&sample_labels(3));
    bytes[2] = 0x0D; // float
    assert_eq!(
        labels_problem(&bytes),
        IdxProblem::WrongDataType { found: 0x0D }
    );
    let error = idx::parse_labels(&bytes, "f.idx").unwrap_err();
    assert_message(&error, "f.idx", &["data type", "0x0d", "0x08"]);
}

#[test]
fn images_file_where_labels_are_expected_is_the_wrong_kind() {
    let bytes = images_bytes(&sample_images(2, 2, 2));
    assert_eq!(
        labels_problem(&bytes),
        IdxProblem::WrongKind {
            expected: Kind::Labels,
            found: Kind::Images
        }
    );
    let error = idx::parse_labels(&bytes, "imgs").unwrap_err();
    assert_message(&error, "imgs", &["IDX images file", "IDX labels file"]);
}

#[test]
fn labels_file_where_images_are_expected_is_the_wrong_kind() {
    let bytes = labels_bytes(&sample_labels(2));
    assert_eq!(
        images_problem(&bytes),
        IdxProblem::WrongKind {
            expected: Kind::Images,
            found: Kind::Labels
        }
    );
}

#[test]
fn other_dimension_counts_are_refused() {
    let bytes = header(0x08, &[2, 2]);
    assert_eq!(
        images_problem(&bytes),
        IdxProblem::WrongDimensions {
            kind: Kind::Images,
            expected: 3,
            found: 2
        }
    );
    assert_eq!(
        labels_problem(&bytes),
        IdxProblem::WrongDimensions {
            kind: Kind::Labels,
            expected: 1,
            found: 2
        }
    );
    let error = idx::parse_images(&bytes, "d2").unwrap_err();
    assert_message(&error, "d2", &["2 dimensions", "has 3"]);
}

#[test]
fn sizes_whose_product_overflows_are_refused() {
    let bytes = header(0x08, &[u32::MAX, u32::MAX, u32::MAX]);
    let max = u32::MAX as usize;
    assert_eq!(
        images_problem(&bytes),
        IdxProblem::SizeOverflow {
            sizes: vec![max, max, max]
        }
    );
    let error = idx::parse_images(&bytes, "big").unwrap_err();
    assert_message(&error, "big", &["4294967295×4294967295×4294967295"]);
}

/// 0xFFFFFFFF images of 28×28 would be 3.4 TB: the declared size is checked against the bytes
/// present before anything is allocated, so this fails at once (an attempt to allocate would
/// abort the test process).
#[test]
#[cfg(target_pointer_width = "64")]
fn huge_declared_count_fails_fast_without_allocating() {
    let mut bytes = header(0x08, &[u32::MAX, 28, 28]);
    bytes.extend_from_slice(&[0; 100]);
    let start = Instant::now();
    let expected = IdxProblem::Truncated {
        sizes: vec![u32::MAX as usize, 28, 28],
        header_len: 16,
        expected: u32::MAX as usize * 28 * 28,
        found: 100,
    };
    assert_eq!(images_problem(&bytes), expected);
    assert_eq!(
        idx_problem(idx::read_images(&bytes[..], "r"), "r"),
        expected
    );
    let mut labels = header(0x08, &[u32::MAX]);
    labels.push(1);
    assert!(matches!(
        labels_problem(&labels),
        IdxProblem::Truncated { found: 1, .. }
    ));
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn truncated_header_is_refused() {
    let bytes = images_bytes(&sample_images(1, 2, 2));
    assert_eq!(
        images_problem(&bytes[..2]),
        IdxProblem::TruncatedHeader {
            expected: 16,
            found: 2
        }
    );
    assert_eq!(
        images_problem(&bytes[..10]),
        IdxProblem::TruncatedHeader {
            expected: 16,
            found: 10
        }
    );
    assert_eq!(
        labels_problem(&[]),
        IdxProblem::TruncatedHeader {
            expected: 8,
            found: 0
        }
    );
    let error = idx::parse_images(&bytes[..10], "h").unwrap_err();
    assert_message(&error, "h", &["10 bytes", "16-byte header"]);
}

#[test]
fn truncated_data_is_refused() {
    let bytes = images_bytes(&sample_images(3, 2, 2));
    let cut = &bytes[..bytes.len() - 5];
    assert_eq!(
        images_problem(cut),
        IdxProblem::Truncated {
            sizes: vec![3, 2, 2],
            header_len: 16,
            expected: 12,
            found: 7
        }
    );
    let error = idx::parse_images(cut, "t").unwrap_err();
    assert_message(
        &error,
        "t",
        &["3×2×2 = 12 data bytes", "only 7 bytes after"],
    );

    let labels = labels_bytes(&sample_labels(4));
    assert_eq!(
        labels_problem(&labels[..9]),
        IdxProblem::Truncated {
            sizes: vec![4],
            header_len: 8,
            expected: 4,
            found: 1
        }
    );
}

#[test]
fn trailing_bytes_are_refused() {
    let mut bytes = images_bytes(&sample_images(2, 2, 2));
    bytes.extend_from_slice(&[9, 9, 9]);
    assert_eq!(
        images_problem(&bytes),
        IdxProblem::TrailingBytes {
            offset: 24,
            extra: 3
        }
    );
    let error = idx::parse_images(&bytes, "tr").unwrap_err();
    assert_message(&error, "tr", &["offset 24", "3 bytes after them"]);

    let mut labels = labels_bytes(&sample_labels(2));
    labels.push(0);
    assert_eq!(
        labels_problem(&labels),
        IdxProblem::TrailingBytes {
            offset: 10,
            extra: 1
        }
    );
}

#[test]
fn image_and_label_counts_must_agree() {
    let images_file = TempFile::new("mm-images", &images_bytes(&sample_images(3, 2, 2)));
    let labels_file = TempFile::new("mm-labels", &labels_bytes(&sample_labels(4)));
    let error = idx::load_dataset(&images_file.0, &labels_file.0).unwrap_err();
    assert_eq!(
        error,
        Error::Idx {
            file: labels_file.display(),
            problem: IdxProblem::CountMismatch {
                images_file: images_file.display(),
                images: 3,
                labels: 4
            }
        }
    );
    assert_message(
        &error,
        &labels_file.display(),
        &["4 labels", "3 images", &images_file.display()],
    );
}

#[test]
fn labels_outside_0_to_9_report_index_and_value() {
    let mut bytes = labels_bytes(&sample_labels(6));
    bytes[8 + 4] = 10;
    bytes[8 + 5] = 200; // only the first bad label is reported
    let expected = IdxProblem::LabelOutOfRange {
        index: 4,
        offset: 12,
        value: 10,
    };
    assert_eq!(labels_problem(&bytes), expected);
    assert_eq!(
        idx_problem(idx::read_labels(&bytes[..], "r"), "r"),
        expected
    );
    let error = idx::parse_labels(&bytes, "l").unwrap_err();
    assert_message(&error, "l", &["label 4", "offset 12", "is 10", "0-9"]);
}

#[test]
fn missing_file_says_it_does_not_exist() {
    let path = unique_temp_path("never-written");
    let file = path.display().to_string();
    for error in [
        idx::load_images(&path).unwrap_err(),
        idx::load_labels(&path).unwrap_err(),
        idx::load_dataset(&path, &path).unwrap_err(),
    ] {
        assert_eq!(
            error,
            Error::Idx {
                file: file.clone(),
                problem: IdxProblem::NotFound
            }
        );
        assert_message(&error, &file, &["the file does not exist"]);
    }
}

#[test]
fn unreadable_path_is_an_io_error() {
    let dir = TempDir::new("a-directory");
    let file = dir.0.display().to_string();
    let problem = idx_problem(idx::load_images(&dir.0), &file);
    assert!(
        matches!(problem, IdxProblem::Io { .. }),
        "reading a directory: {problem:?}"
    );
    assert!(problem.to_string().starts_with("cannot read the file: "));
}

/// A reader that yields some bytes, then fails.
struct FailingReader {
    before_failure: Vec<u8>,
}

impl Read for FailingReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.before_failure.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "peer went away",
            ));
        }
        let n = buf.len().min(self.before_failure.len());
        buf[..n].copy_from_slice(&self.before_failure[..n]);
        self.before_failure.drain(..n);
        Ok(n)
    }
}

#[test]
fn read_errors_keep_kind_and_message() {
    let reader = FailingReader {
        before_failure: images_bytes(&sample_images(1, 2, 2)),
    };
    let error = idx::read_images(reader, "socket").unwrap_err();
    assert_eq!(
        error,
        Error::Idx {
            file: "socket".into(),
            problem: IdxProblem::Io {
                kind: io::ErrorKind::ConnectionReset,
                message: "peer went away".into()
            }
        }
    );
    assert_message(&error, "socket", &["cannot read", "peer went away"]);
}

// ---------------------------------------------------------------------------------------------
// Writers refuse what the readers would refuse
// ---------------------------------------------------------------------------------------------

#[test]
fn write_images_refuses_inconsistent_sizes_and_writes_nothing() {
    let mut images = sample_images(2, 2, 2);
    images.pixels.pop();
    let mut out = Vec::new();
    let error = idx::write_images(&mut out, &images).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    assert!(out.is_empty());

    let too_many = Images {
        count: u32::MAX as usize + 1,
        rows: 0,
        cols: 1,
        pixels: Vec::new(),
    };
    let error = idx::write_images(&mut out, &too_many).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    assert!(out.is_empty());
}

#[test]
fn write_labels_refuses_labels_above_9_and_writes_nothing() {
    let labels = Labels {
        labels: vec![1, 2, 12],
    };
    let mut out = Vec::new();
    let error = idx::write_labels(&mut out, &labels).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    assert!(error.to_string().contains("label 2"), "{error}");
    assert!(out.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Mutations: never a panic
// ---------------------------------------------------------------------------------------------

const MUTANT: &str = "mutant.idx";

/// One parse run under `catch_unwind`: a panic fails the test, an error must be `Error::Idx`
/// naming the file, and a success must pass `is_consistent`.
fn outcome<T>(
    run: impl FnOnce() -> Result<T, Error> + std::panic::UnwindSafe,
    is_consistent: impl Fn(&T) -> bool,
    context: &str,
) -> Result<(), IdxProblem> {
    match catch_unwind(run).unwrap_or_else(|_| panic!("{context}: panicked")) {
        Ok(value) => {
            assert!(is_consistent(&value), "{context}: inconsistent result");
            Ok(())
        }
        Err(error) => Err(idx_problem(Err::<(), _>(error), MUTANT)),
    }
}

/// Parses `bytes` as `kind` from a slice and from a reader; returns both outcomes.
fn parse_without_panic(bytes: &[u8], kind: Kind, context: &str) -> [Result<(), IdxProblem>; 2] {
    let images_ok =
        |images: &Images| images.pixels.len() == images.count * images.rows * images.cols;
    let labels_ok = |labels: &Labels| labels.labels.iter().all(|&label| label <= 9);
    match kind {
        Kind::Images => [
            outcome(|| idx::parse_images(bytes, MUTANT), images_ok, context),
            outcome(|| idx::read_images(bytes, MUTANT), images_ok, context),
        ],
        Kind::Labels => [
            outcome(|| idx::parse_labels(bytes, MUTANT), labels_ok, context),
            outcome(|| idx::read_labels(bytes, MUTANT), labels_ok, context),
        ],
    }
}

fn assert_every_prefix_is_an_error(bytes: &[u8], kind: Kind) {
    for len in 0..bytes.len() {
        let context = format!("{kind} file cut to {len} of {} bytes", bytes.len());
        for outcome in parse_without_panic(&bytes[..len], kind, &context) {
            assert!(outcome.is_err(), "{context}: accepted");
        }
    }
}

type Mutation = (&'static str, fn(u8) -> u8);

const MUTATIONS: [Mutation; 4] = [
    ("xor 0xff", |b| b ^ 0xFF),
    ("+1", |b| b.wrapping_add(1)),
    ("-1", |b| b.wrapping_sub(1)),
    ("zero", |_| 0),
];

fn assert_mutations_never_panic(bytes: &[u8], kind: Kind, positions: usize) {
    for position in 0..positions {
        for (name, mutate) in MUTATIONS {
            let mut mutant = bytes.to_vec();
            mutant[position] = mutate(mutant[position]);
            let context = format!("{kind} file, byte {position} {name}");
            let outcomes = parse_without_panic(&mutant, kind, &context);
            // Parsing from a slice and from a reader must agree.
            assert_eq!(outcomes[0], outcomes[1], "{context}");
        }
    }
}

#[test]
fn every_proper_prefix_is_a_typed_error() {
    assert_every_prefix_is_an_error(&images_bytes(&sample_images(3, 2, 3)), Kind::Images);
    assert_every_prefix_is_an_error(&labels_bytes(&sample_labels(5)), Kind::Labels);
}

#[test]
fn changed_header_bytes_never_panic() {
    let images = images_bytes(&sample_images(3, 2, 3));
    assert_mutations_never_panic(&images, Kind::Images, 16);
    // Labels are cheap: change every byte, data included (out-of-range labels).
    let labels = labels_bytes(&sample_labels(5));
    assert_mutations_never_panic(&labels, Kind::Labels, labels.len());
}

/// A count change cannot yield a valid file: the data length no longer matches.
#[test]
fn changed_count_is_always_an_error() {
    let images = images_bytes(&sample_images(3, 2, 3));
    for position in 4..8 {
        let mut mutant = images.clone();
        mutant[position] ^= 0xFF;
        let problem = images_problem(&mutant);
        assert!(
            matches!(
                problem,
                IdxProblem::Truncated { .. } | IdxProblem::TrailingBytes { .. }
            ),
            "byte {position}: {problem:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The real files
// ---------------------------------------------------------------------------------------------

/// Checks known facts of MNIST when `scripts/fetch-mnist` has run (scripts/setup runs it,
/// so CI always has the data); without the files there is nothing to check.
#[test]
fn real_mnist_loads_when_present() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
    if !dir.join(idx::TRAIN_IMAGES).exists() {
        eprintln!("{} has no MNIST; run scripts/fetch-mnist", dir.display());
        return;
    }
    let (train, test) = idx::load_mnist(&dir).unwrap();
    assert_eq!((train.images.len(), test.images.len()), (60_000, 10_000));
    assert_eq!((train.images.rows, train.images.cols), (28, 28));
    assert_eq!((test.images.rows, test.images.cols), (28, 28));
    // The first digits of each set, as every MNIST tutorial shows them.
    assert_eq!(&train.labels.labels[..5], &[5, 0, 4, 1, 9]);
    assert_eq!(&test.labels.labels[..5], &[7, 2, 1, 0, 4]);
    for digit in 0..10u8 {
        let n = train.labels.labels.iter().filter(|&&l| l == digit).count();
        assert!((5_000..7_000).contains(&n), "digit {digit}: {n} examples");
    }
}
