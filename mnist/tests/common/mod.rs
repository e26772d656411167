//! Shared helpers of the tests: sample data, its IDX bytes, temporary files and directories,
//! and assertions on errors.

// Every test crate includes this module but uses only part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use tapejit_mnist::{self as idx, Error, IdxProblem, Images, Labels};

/// Images whose pixels are a pattern that differs per image, row and column.
pub fn sample_images(count: usize, rows: usize, cols: usize) -> Images {
    let pixels = (0..count * rows * cols)
        .map(|i| (i * 7 + i / (rows * cols)) as u8)
        .collect();
    Images {
        count,
        rows,
        cols,
        pixels,
    }
}

pub fn sample_labels(count: usize) -> Labels {
    Labels {
        labels: (0..count).map(|i| (i * 3 % 10) as u8).collect(),
    }
}

pub fn images_bytes(images: &Images) -> Vec<u8> {
    let mut bytes = Vec::new();
    idx::write_images(&mut bytes, images).unwrap();
    bytes
}

pub fn labels_bytes(labels: &Labels) -> Vec<u8> {
    let mut bytes = Vec::new();
    idx::write_labels(&mut bytes, labels).unwrap();
    bytes
}

/// A file under the system temp dir, unique per process and call, removed on drop.
pub struct TempFile(pub PathBuf);

impl TempFile {
    pub fn new(name: &str, bytes: &[u8]) -> TempFile {
        let path = unique_temp_path(name);
        std::fs::write(&path, bytes).unwrap();
        TempFile(path)
    }

    pub fn display(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A directory under the system temp dir, removed with its contents on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let path = unique_temp_path(name);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    pub fn write(&self, name: &str, bytes: &[u8]) {
        std::fs::write(self.0.join(name), bytes).unwrap();
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn unique_temp_path(name: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("tapejit-idx-{}-{n}-{name}", std::process::id()))
}

/// The problem inside an `Error::Idx` for `file`; anything else fails the test.
pub fn idx_problem(result: Result<impl std::fmt::Debug, Error>, file: &str) -> IdxProblem {
    match result {
        Err(Error::Idx {
            file: named,
            problem,
        }) => {
            assert_eq!(named, file, "the error names another file");
            problem
        }
        other => panic!("expected an IDX error for {file}, got {other:?}"),
    }
}

/// Asserts the message of `error` names the file and mentions every fragment.
pub fn assert_message(error: &Error, file: &str, fragments: &[&str]) {
    let message = error.to_string();
    assert!(message.starts_with(&format!("{file}: ")), "{message:?}");
    for fragment in fragments {
        assert!(
            message.contains(fragment),
            "message {message:?} does not mention {fragment:?}"
        );
    }
}
