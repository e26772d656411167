//! An entry of the cache: a header (magic, format version, key, the body's length and its
//! BLAKE3 checksum), then the body (the module's sizes, then its object file). [`read`]
//! returns the object only from a whole entry of the key asked for.

use super::Digest;

const MAGIC: &[u8; 8] = b"TJCACHE\0";
/// The entry format's version, also part of every key.
pub const FORMAT: u32 = 1;
/// Magic, format, key, body length, checksum.
const HEADER: usize = 8 + 4 + 32 + 8 + 32;

/// The module sizes an entry keeps for [`crate::JitStats`], so that a hit reports them too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sizes {
    pub functions: u64,
    pub ir_instructions: u64,
    pub code_bytes: u64,
}

/// `key`'s entry for `object`.
pub fn write(key: &Digest, object: &[u8], sizes: Sizes) -> Vec<u8> {
    let mut body = Vec::with_capacity(24 + object.len());
    for x in [sizes.functions, sizes.ir_instructions, sizes.code_bytes] {
        body.extend_from_slice(&x.to_le_bytes());
    }
    body.extend_from_slice(object);
    let mut out = Vec::with_capacity(HEADER + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(blake3::hash(&body).as_bytes());
    out.extend_from_slice(&body);
    out
}

/// The object and sizes of `bytes`, if they are a whole entry of `key`.
pub fn read(mut bytes: Vec<u8>, key: &Digest) -> Option<(Vec<u8>, Sizes)> {
    let header = bytes.get(..HEADER)?;
    let (magic, rest) = header.split_at(8);
    let (format, rest) = rest.split_at(4);
    let (stored_key, rest) = rest.split_at(32);
    let (length, checksum) = rest.split_at(8);
    let body = &bytes[HEADER..];
    let whole = magic == MAGIC
        && format == FORMAT.to_le_bytes()
        && stored_key == key
        && length == (body.len() as u64).to_le_bytes()
        && body.len() >= 24
        && checksum == blake3::hash(body).as_bytes();
    if !whole {
        return None;
    }
    let number = |k: usize| u64::from_le_bytes(body[8 * k..8 * k + 8].try_into().unwrap());
    let sizes = Sizes {
        functions: number(0),
        ir_instructions: number(1),
        code_bytes: number(2),
    };
    bytes.drain(..HEADER + 24);
    Some((bytes, sizes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_back_and_refuse_damage() {
        let key = [7; 32];
        let sizes = Sizes {
            functions: 3,
            ir_instructions: 40,
            code_bytes: 500,
        };
        let whole = write(&key, b"object bytes", sizes);
        assert_eq!(
            read(whole.clone(), &key),
            Some((b"object bytes".to_vec(), sizes))
        );
        assert_eq!(read(whole.clone(), &[8; 32]), None, "another key's");
        for cut in [0, HEADER - 1, HEADER, whole.len() - 1] {
            assert_eq!(read(whole[..cut].to_vec(), &key), None, "cut at {cut}");
        }
        for at in [0, 8, HEADER - 1, HEADER, whole.len() - 1] {
            let mut flipped = whole.clone();
            flipped[at] ^= 1;
            assert_eq!(read(flipped, &key), None, "byte {at} flipped");
        }
    }
}
