//! The build fingerprint (the cache's module docs): the file holding this code, as the
//! process mapped it, found in `/proc/self/maps`; none on systems without it.

use std::sync::OnceLock;

/// This build's fingerprint, found once per process; `None` where it has none.
pub fn get() -> Option<&'static [u8]> {
    static FINGERPRINT: OnceLock<Option<Vec<u8>>> = OnceLock::new();
    FINGERPRINT.get_or_init(fingerprint).as_deref()
}

#[cfg(target_os = "linux")]
fn fingerprint() -> Option<Vec<u8>> {
    use std::fs;
    use std::os::unix::fs::MetadataExt;
    let here = fingerprint as fn() -> Option<Vec<u8>> as usize;
    let maps = fs::read_to_string("/proc/self/maps").ok()?;
    let (device, inode, path) = maps.lines().find_map(|line| {
        let (range, device, inode, path) = maps_line(line)?;
        let (start, end) = range.split_once('-')?;
        let start = usize::from_str_radix(start, 16).ok()?;
        let end = usize::from_str_radix(end, 16).ok()?;
        (start..end)
            .contains(&here)
            .then_some((device, inode, path))
    })?;
    if !path.starts_with('/') || path.ends_with(" (deleted)") {
        return None;
    }
    let meta = fs::metadata(path).ok()?;
    let text = format!(
        "tapejit {} {device} {inode} {} {} {} {}.{} {}.{}",
        env!("CARGO_PKG_VERSION"),
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec(),
    );
    Some(text.into_bytes())
}

#[cfg(not(target_os = "linux"))]
fn fingerprint() -> Option<Vec<u8>> {
    None
}

/// A line of `/proc/self/maps` as (address range, device, inode, path).
#[cfg(target_os = "linux")]
fn maps_line(line: &str) -> Option<(&str, &str, &str, &str)> {
    let mut rest = line;
    let mut field = || {
        let t = rest.trim_start();
        let end = t.find(' ').unwrap_or(t.len());
        rest = &t[end..];
        Some(&t[..end]).filter(|f| !f.is_empty())
    };
    let (range, _perms, _offset, device, inode) =
        (field()?, field()?, field()?, field()?, field()?);
    Some((range, device, inode, rest.trim_start()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_build_has_a_fingerprint_on_linux() {
        let fingerprint = get().map(|f| String::from_utf8_lossy(f).into_owned());
        assert_eq!(
            fingerprint.is_some(),
            cfg!(target_os = "linux"),
            "{fingerprint:?}"
        );
    }
}
