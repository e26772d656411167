//! Gzipped IDX files: they load exactly like the raw ones; every broken stream (truncated,
//! corrupt, followed by garbage) is a typed error; and neither a lying header nor a gzip bomb
//! makes the reader allocate more than the data it actually gets, which a counting allocator
//! measures.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write;
use std::path::Path;

use common::*;
use flate2::write::GzEncoder;
use flate2::Compression;
use tapejit_mnist::{self as mnist, IdxProblem, Kind, Labels};

// ---------------------------------------------------------------------------------------------
// Counting what this thread allocates
// ---------------------------------------------------------------------------------------------

/// The system allocator, keeping per thread the bytes live and their peak. Each test runs on
/// its own thread, so concurrent tests do not disturb each other's counts.
struct CountingAllocator;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn record(change: isize) {
    // `try_with`: the allocator also runs while a thread's locals are being torn down.
    let _ = LIVE.try_with(|live| {
        live.set(live.get() + change);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(live.get())));
    });
}

// Safety: every call is forwarded unchanged to `System`; the counting touches only
// const-initialized thread locals without destructors, which never allocate.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = System.alloc(layout);
        if !ptr.is_null() {
            record(layout.size() as isize);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = System.alloc_zeroed(layout);
        if !ptr.is_null() {
            record(layout.size() as isize);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        record(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new_ptr = System.realloc(ptr, layout, new_size);
        if !new_ptr.is_null() {
            record(new_size as isize - layout.size() as isize);
        }
        new_ptr
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Runs `f` and returns its result and the most bytes it had allocated at any one time.
fn peak_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = LIVE.with(Cell::get);
    PEAK.with(|peak| peak.set(before));
    let result = f();
    let peak = PEAK.with(Cell::get);
    (result, (peak - before) as usize)
}

/// flate2's decoder state (its input buffer and the inflater's window and tables) and small
/// bookkeeping: what a gzipped file may cost beyond its data.
const DECODER_ALLOWANCE: usize = 256 << 10;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// A header for `dims`, unsigned bytes, no data.
fn header(dims: &[u32]) -> Vec<u8> {
    let mut bytes = vec![0, 0, 0x08, dims.len() as u8];
    for d in dims {
        bytes.extend_from_slice(&d.to_be_bytes());
    }
    bytes
}

/// `prefix` followed by `zeros` zero bytes, gzipped without holding the zeros in memory.
fn gzip_then_zeros(prefix: &[u8], zeros: usize) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(prefix).unwrap();
    let chunk = vec![0; 1 << 16];
    let mut left = zeros;
    while left > 0 {
        let n = left.min(chunk.len());
        encoder.write_all(&chunk[..n]).unwrap();
        left -= n;
    }
    encoder.finish().unwrap()
}

fn gz_images_problem(bytes: &[u8]) -> IdxProblem {
    idx_problem(mnist::parse_images(bytes, "images.gz"), "images.gz")
}

fn gz_labels_problem(bytes: &[u8]) -> IdxProblem {
    idx_problem(mnist::parse_labels(bytes, "labels.gz"), "labels.gz")
}

// ---------------------------------------------------------------------------------------------
// Gzipped files load like raw ones
// ---------------------------------------------------------------------------------------------

#[test]
fn gzipped_files_round_trip_through_parse_read_and_load() {
    let (images, labels) = (sample_images(5, 3, 4), sample_labels(5));
    let (images_gz, labels_gz) = (gzip(&images_bytes(&images)), gzip(&labels_bytes(&labels)));

    assert_eq!(mnist::parse_images(&images_gz, "mem").unwrap(), images);
    assert_eq!(mnist::read_images(&images_gz[..], "mem").unwrap(), images);
    assert_eq!(mnist::parse_labels(&labels_gz, "mem").unwrap(), labels);
    assert_eq!(mnist::read_labels(&labels_gz[..], "mem").unwrap(), labels);

    let images_file = TempFile::new("images.gz", &images_gz);
    let labels_file = TempFile::new("labels.gz", &labels_gz);
    let dataset = mnist::load_dataset(&images_file.0, &labels_file.0).unwrap();
    assert_eq!((dataset.images, dataset.labels), (images, labels));
}

/// `gunzip` decompresses every member of a file, so `cat a.gz b.gz` is one file; so do we.
#[test]
fn concatenated_gzip_members_are_one_file() {
    let bytes = images_bytes(&sample_images(4, 2, 3));
    let (first, second) = bytes.split_at(10);
    let two_members = [gzip(first), gzip(second)].concat();
    assert_eq!(
        mnist::parse_images(&two_members, "two").unwrap(),
        mnist::parse_images(&bytes, "raw").unwrap()
    );
}

#[test]
fn gzipped_files_are_checked_like_raw_ones() {
    let mut cut = images_bytes(&sample_images(3, 2, 2));
    cut.truncate(cut.len() - 5);
    assert_eq!(
        gz_images_problem(&gzip(&cut)),
        IdxProblem::Truncated {
            sizes: vec![3, 2, 2],
            header_len: 16,
            expected: 12,
            found: 7
        }
    );
    assert_eq!(
        gz_images_problem(&gzip(&header(&[1, 2, 2])[..10])),
        IdxProblem::TruncatedHeader {
            expected: 16,
            found: 10
        }
    );
    assert_eq!(
        gz_labels_problem(&gzip(&images_bytes(&sample_images(1, 1, 1)))),
        IdxProblem::WrongKind {
            expected: Kind::Labels,
            found: Kind::Images
        }
    );
    let mut labels = labels_bytes(&sample_labels(3));
    labels[8 + 2] = 11;
    assert_eq!(
        gz_labels_problem(&gzip(&labels)),
        IdxProblem::LabelOutOfRange {
            index: 2,
            offset: 10,
            value: 11
        }
    );
}

// ---------------------------------------------------------------------------------------------
// Broken streams are typed errors
// ---------------------------------------------------------------------------------------------

/// Whatever the cut, a proper prefix of a gzipped file never loads: the stream ends early
/// (gzip error), or its content is short (an IDX error).
#[test]
fn every_proper_prefix_of_a_gzipped_file_is_a_typed_error() {
    let images = gzip(&images_bytes(&sample_images(3, 2, 3)));
    for len in 2..images.len() {
        let problem = gz_images_problem(&images[..len]);
        assert!(
            matches!(
                problem,
                IdxProblem::Gzip { .. }
                    | IdxProblem::TruncatedHeader { .. }
                    | IdxProblem::Truncated { .. }
            ),
            "cut to {len} of {} bytes: {problem:?}",
            images.len()
        );
    }
    let labels = gzip(&labels_bytes(&sample_labels(5)));
    for len in 2..labels.len() {
        assert!(mnist::parse_labels(&labels[..len], "l").is_err(), "{len}");
    }
}

#[test]
fn a_wrong_checksum_is_a_gzip_error() {
    let mut bytes = gzip(&labels_bytes(&sample_labels(7)));
    let crc = bytes.len() - 8; // the trailer: CRC-32, then the length
    bytes[crc] ^= 0xFF;
    let problem = gz_labels_problem(&bytes);
    assert!(matches!(problem, IdxProblem::Gzip { .. }), "{problem:?}");
    let error = mnist::parse_labels(&bytes, "crc.gz").unwrap_err();
    assert_message(
        &error,
        "crc.gz",
        &["gzip-compressed", "cannot be decompressed"],
    );
}

#[test]
fn garbage_after_the_last_member_is_a_gzip_error() {
    let mut bytes = gzip(&labels_bytes(&sample_labels(7)));
    bytes.extend_from_slice(b"not gzip");
    let problem = gz_labels_problem(&bytes);
    assert!(matches!(problem, IdxProblem::Gzip { .. }), "{problem:?}");
}

#[test]
fn a_bare_gzip_header_is_a_gzip_error() {
    let bytes = [0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0, 0, 0];
    let problem = gz_labels_problem(&bytes);
    assert!(matches!(problem, IdxProblem::Gzip { .. }), "{problem:?}");
}

// ---------------------------------------------------------------------------------------------
// Nothing allocated beyond what the data justify
// ---------------------------------------------------------------------------------------------

/// A bomb: a header declaring 8 bytes of data, then 64 MiB of zeros in a few kilobytes.
/// Decompression stops at the first byte past the data.
#[test]
fn a_gzip_bomb_stops_at_the_declared_data() {
    let mut idx = header(&[2, 2, 2]);
    idx.extend_from_slice(&[7; 8]);
    let bomb = gzip_then_zeros(&idx, 64 << 20);
    assert!(bomb.len() < 256 << 10, "{} bytes", bomb.len());
    let (problem, peak) = peak_allocation(|| gz_images_problem(&bomb));
    assert_eq!(problem, IdxProblem::DecompressesPastData { offset: 24 });
    assert!(peak < DECODER_ALLOWANCE, "allocated {peak} bytes");
    let error = mnist::parse_images(&bomb, "bomb.gz").unwrap_err();
    assert_message(&error, "bomb.gz", &["offset 24", "decompresses to more"]);
}

/// A header declaring 0xFFFFFFFF images of 28×28 (3.4 TB) over 1 MiB of data: the buffer
/// grows with the data that arrive, not with the header's claim.
#[test]
#[cfg(target_pointer_width = "64")]
fn a_lying_header_allocates_only_for_the_data_present() {
    let data = 1 << 20;
    let file = gzip_then_zeros(&header(&[u32::MAX, 28, 28]), data);
    let (problem, peak) = peak_allocation(|| gz_images_problem(&file));
    assert_eq!(
        problem,
        IdxProblem::Truncated {
            sizes: vec![u32::MAX as usize, 28, 28],
            header_len: 16,
            expected: u32::MAX as usize * 28 * 28,
            found: data
        }
    );
    assert!(
        peak < 2 * data + DECODER_ALLOWANCE,
        "allocated {peak} bytes"
    );
}

/// A real-sized file: the compressed bytes, the pixels once, and the decoder.
#[test]
fn loading_a_gzipped_file_allocates_its_size_and_its_data_once() {
    let images = sample_images(2_000, 28, 28);
    let compressed = gzip(&images_bytes(&images));
    let file = TempFile::new("images-idx3-ubyte.gz", &compressed);
    let (loaded, peak) = peak_allocation(|| mnist::load_images(&file.0).unwrap());
    assert_eq!(loaded, images);
    let bound = compressed.len() + images.pixels.len() + DECODER_ALLOWANCE;
    assert!(peak < bound, "allocated {peak} bytes, bound {bound}");
    // And the count is real: the pixels themselves were seen.
    assert!(peak >= images.pixels.len(), "allocated {peak} bytes");
}

#[test]
fn loading_a_raw_file_allocates_its_size_once() {
    let labels = Labels {
        labels: (0..100_000).map(|i| (i % 10) as u8).collect(),
    };
    let bytes = labels_bytes(&labels);
    let file = TempFile::new("labels-idx1-ubyte", &bytes);
    let (loaded, peak) = peak_allocation(|| mnist::load_labels(&file.0).unwrap());
    assert_eq!(loaded, labels);
    assert!(peak < bytes.len() + 4096, "allocated {peak} bytes");
}

// ---------------------------------------------------------------------------------------------
// The real files
// ---------------------------------------------------------------------------------------------

/// The shared gzipped copy that `scripts/fetch-mnist` unpacks (`MNIST_SHARED_DIR`, else
/// `shared/data/mnist` next to the repository) must load to exactly the unpacked files.
/// Without both there is nothing to compare.
#[test]
fn real_gzipped_mnist_loads_to_the_unpacked_files_when_present() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let shared = match std::env::var_os("MNIST_SHARED_DIR") {
        Some(dir) => dir.into(),
        None => root.join("../shared/data/mnist"),
    };
    let unpacked = root.join("data/mnist");
    let gz = mnist::find(&shared, mnist::TRAIN_IMAGES);
    if !matches!(&gz, Ok(path) if path.extension().is_some_and(|e| e == "gz"))
        || !unpacked.join(mnist::TRAIN_IMAGES).exists()
    {
        eprintln!("no gzipped MNIST in {} or none unpacked", shared.display());
        return;
    }
    let (gz_train, gz_test) = mnist::load_mnist(&shared).unwrap();
    let (train, test) = mnist::load_mnist(&unpacked).unwrap();
    assert_eq!(gz_train, train);
    assert_eq!(gz_test, test);
    assert_eq!(train.len(), 60_000);
}
