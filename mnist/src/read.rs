//! Reading IDX files from bytes, readers and paths, raw or gzipped (told apart by their first
//! two bytes, not by their names).
//!
//! A raw file's declared sizes are checked against the bytes present before anything is
//! allocated for the data, so a corrupt header cannot request gigabytes; a gzipped file is
//! decompressed only as far as its header declares (see `gzip.rs`).

use std::io::Read;
use std::path::Path;

use crate::data::{Dataset, Images, Labels};
use crate::error::{IdxProblem, Result};
use crate::format::{check_data_len, check_header, check_label_range, Header, Kind};
use crate::gzip;

/// A file's checked header and its data, or what is wrong with the file.
type Split = std::result::Result<(Header, Vec<u8>), IdxProblem>;

/// A raw file's checked header: the data must be exactly what it declares.
fn check_raw(bytes: &[u8], kind: Kind) -> std::result::Result<Header, IdxProblem> {
    let header = check_header(bytes, kind)?;
    check_data_len(&header, bytes.len() - header.header_len)?;
    Ok(header)
}

/// The checked header and a copy of the data of a whole file's `bytes`, raw or gzipped.
fn split_borrowed(bytes: &[u8], kind: Kind) -> Split {
    if gzip::is_gzip(bytes) {
        return gzip::decompress(bytes, kind);
    }
    let header = check_raw(bytes, kind)?;
    let data = bytes[header.header_len..].to_vec();
    Ok((header, data))
}

/// Like [`split_borrowed`], but a raw file's buffer is kept and its header dropped in place:
/// MNIST's training images are 47 MB, and this avoids a second copy.
fn split_owned(mut bytes: Vec<u8>, kind: Kind) -> Split {
    if gzip::is_gzip(&bytes) {
        return gzip::decompress(&bytes, kind);
    }
    let header = check_raw(&bytes, kind)?;
    bytes.drain(..header.header_len);
    Ok((header, bytes))
}

fn images_from(split: Split, file: &str) -> Result<Images> {
    let (header, pixels) = split.map_err(|p| p.in_file(file))?;
    // An images header holds exactly 3 sizes: `check_header` refused any other count.
    Ok(Images {
        count: header.sizes[0],
        rows: header.sizes[1],
        cols: header.sizes[2],
        pixels,
    })
}

fn labels_from(split: Split, file: &str) -> Result<Labels> {
    let (header, labels) = split.map_err(|p| p.in_file(file))?;
    check_label_range(&labels, header.header_len).map_err(|p| p.in_file(file))?;
    Ok(Labels { labels })
}

/// Parses the bytes of an IDX images file, raw or gzipped; `file` names it in errors.
pub fn parse_images(bytes: &[u8], file: &str) -> Result<Images> {
    images_from(split_borrowed(bytes, Kind::Images), file)
}

/// Parses the bytes of an IDX labels file, raw or gzipped; `file` names it in errors.
pub fn parse_labels(bytes: &[u8], file: &str) -> Result<Labels> {
    labels_from(split_borrowed(bytes, Kind::Labels), file)
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

/// Reads an IDX images file, raw or gzipped, to its end from `reader`; `file` names it in
/// errors.
pub fn read_images(reader: impl Read, file: &str) -> Result<Images> {
    images_from(split_owned(read_all(reader, file)?, Kind::Images), file)
}

/// Reads an IDX labels file, raw or gzipped, to its end from `reader`; `file` names it in
/// errors.
pub fn read_labels(reader: impl Read, file: &str) -> Result<Labels> {
    labels_from(split_owned(read_all(reader, file)?, Kind::Labels), file)
}

/// Loads an IDX images file, raw or gzipped; errors name it by `path.display()`.
pub fn load_images(path: impl AsRef<Path>) -> Result<Images> {
    let path = path.as_ref();
    let file = path.display().to_string();
    images_from(split_owned(read_path(path)?, Kind::Images), &file)
}

/// Loads an IDX labels file, raw or gzipped; errors name it by `path.display()`.
pub fn load_labels(path: impl AsRef<Path>) -> Result<Labels> {
    let path = path.as_ref();
    let file = path.display().to_string();
    labels_from(split_owned(read_path(path)?, Kind::Labels), &file)
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
