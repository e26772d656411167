//! Saved params: a small binary format with a header and a checksum.
//!
//! Layout (all integers and floats little-endian):
//!
//! | bytes | content |
//! |---|---|
//! | 8 | magic `TJPARAMS` |
//! | 4 | format version, `u32` = 1 |
//! | 4 | `k`, number of architecture entries, `u32` |
//! | 4·k | the architecture, `u32` each (e.g. layer sizes 784, 50, 10) |
//! | 8 | `n`, number of params, `u64` |
//! | 8·n | the params, `f64` each, in param creation order |
//! | 8 | FNV-1a 64 checksum of every byte before it |
//!
//! An architecture with more than `u32::MAX` entries, or an entry above it, is refused on save
//! (`Checkpoint::to_bytes`) rather than truncated.
//!
//! The architecture is whatever the saver says describes the model; [`Checkpoint::load_for`]
//! refuses a file saved for another one.

use std::path::Path;

use byteorder::{ByteOrder, LittleEndian};

use crate::error::{Error, Result};

const MAGIC: &[u8; 8] = b"TJPARAMS";
const VERSION: u32 = 1;

/// A model's architecture and its params.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    pub architecture: Vec<usize>,
    pub params: Vec<f64>,
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

fn describe(architecture: &[usize]) -> String {
    let parts: Vec<String> = architecture.iter().map(|s| s.to_string()).collect();
    parts.join("-")
}

impl Checkpoint {
    /// The file's bytes. The format stores the architecture's length and entries as `u32`: a
    /// value above `u32::MAX` is refused rather than truncated (it would load back as another
    /// number).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        self.encode().map_err(|problem| Error::Checkpoint {
            file: "(in memory)".into(),
            problem,
        })
    }

    /// `to_bytes`, with the problem of an architecture the format cannot hold.
    fn encode(&self) -> std::result::Result<Vec<u8>, String> {
        let entries = u32::try_from(self.architecture.len()).map_err(|_| {
            format!(
                "{} architecture entries do not fit the format's u32 count",
                self.architecture.len()
            )
        })?;
        let mut out = Vec::with_capacity(32 + 4 * self.architecture.len() + 8 * self.params.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&entries.to_le_bytes());
        for (index, &a) in self.architecture.iter().enumerate() {
            let a = u32::try_from(a).map_err(|_| {
                format!("architecture entry {index} ({a}) does not fit the format's u32")
            })?;
            out.extend_from_slice(&a.to_le_bytes());
        }
        out.extend_from_slice(&(self.params.len() as u64).to_le_bytes());
        for &p in &self.params {
            out.extend_from_slice(&p.to_le_bytes());
        }
        let sum = fnv1a(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        Ok(out)
    }

    /// Parses a file's bytes; `file` names it in errors.
    pub fn from_bytes(bytes: &[u8], file: &str) -> Result<Checkpoint> {
        let bad = |problem: String| Error::Checkpoint {
            file: file.to_string(),
            problem,
        };
        if bytes.len() < 8 || &bytes[..8] != MAGIC {
            return Err(bad("not a tapejit params file (no TJPARAMS header)".into()));
        }
        if bytes.len() < 8 + 4 + 4 + 8 + 8 {
            return Err(bad(format!("truncated: {} bytes", bytes.len())));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 8);
        if fnv1a(body) != LittleEndian::read_u64(sum) {
            return Err(bad(
                "checksum mismatch: the file is corrupt or truncated".into()
            ));
        }
        let version = LittleEndian::read_u32(&body[8..]);
        if version != VERSION {
            return Err(bad(format!("format version {version}, expected {VERSION}")));
        }
        let k = LittleEndian::read_u32(&body[12..]) as usize;
        let arch_end = k
            .checked_mul(4)
            .and_then(|b| b.checked_add(16))
            .filter(|&end| end.checked_add(8).is_some_and(|e| e <= body.len()))
            .ok_or_else(|| {
                bad(format!(
                    "header declares {k} architecture entries, beyond the file"
                ))
            })?;
        let architecture = body[16..arch_end]
            .chunks_exact(4)
            .map(|c| LittleEndian::read_u32(c) as usize)
            .collect();
        let n = LittleEndian::read_u64(&body[arch_end..]);
        let params_bytes = &body[arch_end + 8..];
        if n.checked_mul(8) != Some(params_bytes.len() as u64) {
            return Err(bad(format!(
                "header declares {n} params but {} bytes of params follow",
                params_bytes.len()
            )));
        }
        let params = params_bytes
            .chunks_exact(8)
            .map(LittleEndian::read_f64)
            .collect();
        Ok(Checkpoint {
            architecture,
            params,
        })
    }

    /// Writes the file; an architecture the format cannot hold (see `to_bytes`) is refused
    /// before anything is written.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bad = |problem: String| Error::Checkpoint {
            file: path.display().to_string(),
            problem,
        };
        let bytes = self.encode().map_err(bad)?;
        std::fs::write(path, bytes).map_err(|e| bad(format!("cannot write: {e}")))
    }

    pub fn load(path: impl AsRef<Path>) -> Result<Checkpoint> {
        let path = path.as_ref();
        let file = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| Error::Checkpoint {
            file: file.clone(),
            problem: format!("cannot read: {e}"),
        })?;
        Checkpoint::from_bytes(&bytes, &file)
    }

    /// Loads params saved for `architecture`; a file saved for another one is an error that
    /// names both.
    pub fn load_for(path: impl AsRef<Path>, architecture: &[usize]) -> Result<Vec<f64>> {
        let path = path.as_ref();
        let c = Checkpoint::load(path)?;
        if c.architecture != architecture {
            return Err(Error::Checkpoint {
                file: path.display().to_string(),
                problem: format!(
                    "saved for architecture {}, but this model is {}",
                    describe(&c.architecture),
                    describe(architecture)
                ),
            });
        }
        Ok(c.params)
    }
}
