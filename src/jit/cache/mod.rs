//! The persistent compile cache: each module's object file kept on disk under a key of
//! everything its machine code depends on, so that a second process compiling the same
//! structure links the objects without running LLVM (planning still runs: the plan is what
//! the program's buffers are laid out by).
//!
//! **Where.** [`Cache`] on the builder, else `TAPEJIT_CACHE`, else the user's cache directory
//! ([`Cache::user_dir`]). A directory that cannot be made, or that others may write to, is
//! not used: the compile goes on as without a cache, and [`crate::JitStats::cache_dir`] is
//! `None`. Neither is a program compiled with `keep_ir` cached: its IR is the point, and as
//! large as the module. The size bound is [`crate::JitBuilder::cache_size`], else
//! `TAPEJIT_CACHE_SIZE` (bytes, or with a `K`, `M`, `G` or `T` suffix: binary units), else
//! [`DEFAULT_SIZE`].
//!
//! **The key** is a BLAKE3 digest of: this format's version; the build fingerprint (below);
//! LLVM's version; every builder option that changes code (`JitBuilder::write_key`); the
//! tape as compiled from, before its params are laid out ([`Tape::write_structure`]: ops with
//! every bit of their constants, operands, gradient flags, params and inputs, outputs, loss,
//! copies; not the params' values, which code never holds). Loop recovery, the param layout
//! and the plan are functions of those (given the host); the compiler adds the target
//! triple, the host CPU's name and features, and the module's role. A compile that is handed
//! a schedule of its own (`compile_schedule`, for tests) has no key and is not cached.
//!
//! **The build fingerprint** says which tapejit made an object, so that a rebuilt library
//! whose emitter changed never loads what the old one wrote, even at the same version. It is
//! the file that holds this code as the process mapped it: found in `/proc/self/maps` by the
//! address of a function of ours (the executable for a Rust program, the extension module
//! for Python, which `current_exe` would miss), with its device, inode, size and modification
//! and status-change times. Any rebuild or reinstall changes these (a status-change time
//! cannot be set back, unlike a modification time a wheel may carry); one `stat` per process
//! costs nothing, where hashing tens of megabytes of code would cost 10-50 ms. A file
//! replaced since it was mapped (`(deleted)` there) gives no fingerprint, nor does a system
//! without `/proc/self/maps` (macOS, Windows: there the cache is never used).
//!
//! **An entry** is `<key in hex>.tjc`: a header (magic, format version, the key, the body's
//! length and its BLAKE3 checksum), then the body (the module's sizes for
//! [`crate::JitStats`], then the object file). An entry whose header or checksum does not
//! match (corrupt, truncated, another key's, another format's) is never loaded: the module
//! compiles and its entry is written anew. Writers write a temporary file in the directory
//! and rename it into place, so concurrent processes read whole entries only. A hit sets the
//! entry's modification time; after a compile stored entries, those least recently used go
//! until the directory holds at most the bound (as this process counts it: [`Source::evict`]).
//! The directory holds machine code this process will run: checksums catch accidents, not
//! attacks, so it is made private (`0700`) and one that others may write to is refused.

use std::ffi::OsString;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use crate::tape::Tape;

mod entry;
mod fingerprint;

pub use entry::Sizes;

/// Where compiled modules are kept between processes ([`crate::JitBuilder::cache`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Cache {
    /// `TAPEJIT_CACHE` decides: a directory (made if missing); `off`, `0` or empty for no
    /// cache. Unset, the user's cache directory ([`Cache::user_dir`]).
    #[default]
    Default,
    /// No cache: every module compiles.
    Off,
    /// This directory (made if missing), whatever `TAPEJIT_CACHE` says.
    Dir(PathBuf),
}

/// The default bound on the cache directory's size: 1 GiB.
pub const DEFAULT_SIZE: u64 = 1 << 30;

const SUFFIX: &str = ".tjc";
const TEMP_SUFFIX: &str = ".tmp";
/// A temporary file older than this was left by a writer that died.
const STALE_TEMP: Duration = Duration::from_secs(600);
/// How long a process trusts its count of a directory's bytes (what it found there plus what
/// it stored since) before it lists the directory again.
const RESCAN: Duration = Duration::from_secs(60);

pub type Digest = [u8; 32];

impl Cache {
    /// The user's cache directory for tapejit: `$XDG_CACHE_HOME/tapejit`, else
    /// `$HOME/.cache/tapejit`; `~/Library/Caches/tapejit` on macOS; `%LOCALAPPDATA%\tapejit`
    /// on Windows. `None` if the environment names none.
    pub fn user_dir() -> Option<PathBuf> {
        let var = std::env::var_os;
        if cfg!(windows) {
            return absolute(var("LOCALAPPDATA")).map(|d| d.join("tapejit"));
        }
        user_dir_from(
            var("XDG_CACHE_HOME"),
            var("HOME"),
            cfg!(target_os = "macos"),
        )
    }

    /// The directory this setting names, if any (`TAPEJIT_CACHE` read now).
    fn dir(&self) -> Option<PathBuf> {
        match self {
            Cache::Off => None,
            Cache::Dir(dir) => Some(dir.clone()),
            Cache::Default => match std::env::var_os("TAPEJIT_CACHE") {
                Some(v) if v.is_empty() || v == "0" || v.eq_ignore_ascii_case("off") => None,
                Some(v) => Some(PathBuf::from(v)),
                None => Cache::user_dir(),
            },
        }
    }
}

fn absolute(dir: Option<OsString>) -> Option<PathBuf> {
    dir.map(PathBuf::from).filter(|d| d.is_absolute())
}

/// [`Cache::user_dir`] on a Unix from its environment (XDG's rule: a relative
/// `XDG_CACHE_HOME` is ignored).
fn user_dir_from(xdg: Option<OsString>, home: Option<OsString>, macos: bool) -> Option<PathBuf> {
    let home = absolute(home);
    let base = match macos {
        true => home.map(|h| h.join("Library/Caches")),
        false => absolute(xdg).or_else(|| home.map(|h| h.join(".cache"))),
    };
    base.map(|b| b.join("tapejit"))
}

/// A size in bytes: a number, optionally followed by `K`, `M`, `G` or `T` (binary units; an
/// `iB` or `B` after them is allowed).
fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let number: u64 = text[..digits].parse().ok()?;
    let unit = text[digits..].trim().to_ascii_uppercase();
    let shift = match unit.trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return None,
    };
    number.checked_mul(1 << shift)
}

/// The key's material, hashed as it is written; each piece after its length.
pub struct KeyWriter(blake3::Hasher);

impl KeyWriter {
    pub fn bytes(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.update(&(bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
        self
    }

    pub fn str(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }
}

/// One compile's cache: its directory, the bound on its size, and the digest of what every
/// module of the compile is made from but the host and the module (module docs).
#[derive(Debug)]
pub struct Source {
    dir: PathBuf,
    max_bytes: u64,
    digest: Digest,
    /// Bytes of the entries stored since the last [`Source::evict`].
    stored: AtomicU64,
}

/// What this process knows of the directories it stored in: each one's entries' bytes as
/// last listed plus what it stored since, and when it listed them. Listing every entry after
/// every store would cost a cold compile a few milliseconds per thousand entries.
static USAGE: Mutex<Vec<(PathBuf, u64, Instant)>> = Mutex::new(Vec::new());

impl Source {
    /// The cache of a compile of `tape` under `cache` (and `TAPEJIT_CACHE`), bounded by
    /// `max_bytes` (else `TAPEJIT_CACHE_SIZE`, else [`DEFAULT_SIZE`]), with the options
    /// `options` writes into the key; `None` where there is none or it cannot be used.
    pub fn new(
        cache: &Cache,
        max_bytes: Option<u64>,
        tape: &Tape,
        options: impl FnOnce(&mut KeyWriter),
    ) -> Option<Source> {
        let dir = cache.dir()?;
        let fingerprint = fingerprint::get()?;
        if !usable(&dir) {
            return None;
        }
        let mut key = KeyWriter(blake3::Hasher::new());
        key.str("tapejit compile cache")
            .bytes(&entry::FORMAT.to_le_bytes());
        key.bytes(fingerprint);
        let (major, minor, patch) = inkwell::support::get_llvm_version();
        key.str(&format!("LLVM {major}.{minor}.{patch}"));
        options(&mut key);
        tape.write_structure(&mut |bytes| {
            key.0.update(bytes);
        });
        let max_bytes = max_bytes
            .or_else(|| parse_size(&std::env::var("TAPEJIT_CACHE_SIZE").ok()?))
            .unwrap_or(DEFAULT_SIZE);
        Some(Source {
            dir,
            max_bytes,
            digest: *key.0.finalize().as_bytes(),
            stored: AtomicU64::new(0),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A module's key: this compile's digest and `parts` (the host, the module's role).
    pub fn key(&self, parts: &[&str]) -> Digest {
        let mut key = KeyWriter(blake3::Hasher::new());
        key.bytes(&self.digest);
        for part in parts {
            key.str(part);
        }
        *key.0.finalize().as_bytes()
    }

    fn path(&self, key: &Digest) -> PathBuf {
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        self.dir.join(hex + SUFFIX)
    }

    /// Whether `key` has an entry (whole or not: [`Source::load`] checks).
    pub fn contains(&self, key: &Digest) -> bool {
        self.path(key).exists()
    }

    /// The object and sizes of `key`'s entry, if it has a whole one (and marks it used).
    pub fn load(&self, key: &Digest) -> Option<(Vec<u8>, Sizes)> {
        let path = self.path(key);
        let (mut file, writable) = match fs::File::options().read(true).write(true).open(&path) {
            Ok(file) => (file, true),
            Err(_) => (fs::File::open(&path).ok()?, false),
        };
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).ok()?;
        let entry = entry::read(bytes, key)?;
        if writable {
            // (Least recently used goes first: a hit counts as a use.)
            let _ = file.set_modified(SystemTime::now());
        }
        Some(entry)
    }

    /// Writes `key`'s entry, whole or not at all; a failure only costs the next process
    /// a compile.
    pub fn store(&self, key: &Digest, object: &[u8], sizes: Sizes) {
        static WRITES: AtomicU64 = AtomicU64::new(0);
        let path = self.path(key);
        let mut temp = path.clone().into_os_string();
        let n = WRITES.fetch_add(1, Ordering::Relaxed);
        temp.push(format!(".{}-{n}{TEMP_SUFFIX}", std::process::id()));
        let bytes = entry::write(key, object, sizes);
        let written = fs::File::create(&temp)
            .and_then(|mut file| file.write_all(&bytes))
            .and_then(|()| fs::rename(&temp, &path));
        match written {
            Ok(()) => _ = self.stored.fetch_add(bytes.len() as u64, Ordering::Relaxed),
            Err(_) => _ = fs::remove_file(&temp),
        }
    }

    /// Keeps the directory within the bound after stores: where this process's count of its
    /// bytes says it may not be, or the count is older than [`RESCAN`], lists it and evicts.
    /// (Other processes' stores of the last minute may go uncounted until then.)
    pub fn evict(&self) {
        let stored = self.stored.swap(0, Ordering::Relaxed);
        let mut usage = USAGE.lock().unwrap_or_else(|e| e.into_inner());
        let known = usage.iter_mut().find(|(dir, ..)| *dir == self.dir);
        match known {
            Some((_, bytes, listed))
                if *bytes + stored <= self.max_bytes && listed.elapsed() < RESCAN =>
            {
                *bytes += stored;
            }
            Some((_, bytes, listed)) => (*bytes, *listed) = (self.list_and_evict(), Instant::now()),
            None => usage.push((self.dir.clone(), self.list_and_evict(), Instant::now())),
        }
    }

    /// Removes the entries least recently used until the directory's entries take at most
    /// the bound, and temporary files a writer that died left; the bytes left.
    fn list_and_evict(&self) -> u64 {
        let Ok(listing) = fs::read_dir(&self.dir) else {
            return 0;
        };
        let now = SystemTime::now();
        let mut entries = Vec::new();
        for item in listing.flatten() {
            let name = item.file_name();
            let name = name.to_string_lossy();
            let Ok(meta) = item.metadata() else { continue };
            let modified = meta.modified().unwrap_or(now);
            if name.ends_with(TEMP_SUFFIX) && name.contains(SUFFIX) {
                if now
                    .duration_since(modified)
                    .is_ok_and(|age| age > STALE_TEMP)
                {
                    let _ = fs::remove_file(item.path());
                }
            } else if name.ends_with(SUFFIX) && meta.is_file() {
                entries.push((modified, meta.len(), item.path()));
            }
        }
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        entries.sort();
        for (_, len, path) in entries {
            if total <= self.max_bytes {
                break;
            }
            // (Another process may have removed it first: then it is gone all the same.)
            let _ = fs::remove_file(path);
            total -= len;
        }
        total
    }
}

/// Whether `dir` exists or was made (private) and no one else may write to it.
fn usable(dir: &Path) -> bool {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    if builder.create(dir).is_err() {
        return false;
    }
    let Ok(meta) = fs::metadata(dir) else {
        return false;
    };
    #[cfg(unix)]
    let others_write = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o002 != 0;
    #[cfg(not(unix))]
    let others_write = false;
    meta.is_dir() && !others_write
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_dir_follows_xdg_then_home() {
        let os = |s: &str| Some(OsString::from(s));
        let dir = |xdg, home| user_dir_from(xdg, home, false);
        assert_eq!(dir(os("/x/c"), os("/h")), Some("/x/c/tapejit".into()));
        assert_eq!(dir(os("rel"), os("/h")), Some("/h/.cache/tapejit".into()));
        assert_eq!(dir(None, os("/h")), Some("/h/.cache/tapejit".into()));
        assert_eq!(dir(None, None), None);
        let mac = user_dir_from(os("/x/c"), os("/h"), true);
        assert_eq!(mac, Some("/h/Library/Caches/tapejit".into()));
    }

    #[test]
    fn sizes_parse_in_binary_units() {
        assert_eq!(parse_size("1234"), Some(1234));
        assert_eq!(parse_size("64K"), Some(64 << 10));
        assert_eq!(parse_size("512 MiB"), Some(512 << 20));
        assert_eq!(parse_size("2g"), Some(2 << 30));
        assert_eq!(parse_size("1GB"), Some(1 << 30));
        for bad in ["", "M", "1.5G", "12 apples", "99999999999T"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }
}
