//! Writing raw IDX files, for tests and tools that generate data. The writers refuse, before
//! writing a byte, anything the readers would refuse.

use std::io::{self, Write};

use byteorder::{BigEndian, WriteBytesExt};

use crate::data::{Images, Labels};
use crate::format::{check_label_range, Kind, UNSIGNED_BYTE};

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
/// what [`crate::parse_images`] would reject: sizes beyond `u32` or a pixel count that does
/// not match `count * rows * cols`.
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
/// what [`crate::parse_labels`] would reject: more than `u32::MAX` labels or a label above 9.
pub fn write_labels(mut w: impl Write, labels: &Labels) -> io::Result<()> {
    if let Err(problem) = check_label_range(&labels.labels, Kind::Labels.header_len()) {
        return Err(invalid_input(problem.to_string()));
    }
    write_header(&mut w, &[(labels.len(), "label count")])?;
    w.write_all(&labels.labels)
}
