//! How typed keys become the bytes the engine stores: one injective
//! encoding shared by every binding (Python, Perl/C), so that two bindings
//! opening the same file agree on which key is which.
//!
//! The engine itself stores and compares opaque bytes; this module only
//! defines the *stored form* of the three key kinds bindings offer:
//!
//! | kind            | stored form                                   | example              |
//! |-----------------|-----------------------------------------------|----------------------|
//! | text (UTF-8)    | its UTF-8 bytes, unchanged                    | `"a"` → `61`         |
//! | bytes           | unchanged, unless the first byte is `0xFE` or `0xFF`: then `0xFE` + the bytes | `ff 31` → `fe ff 31` |
//! | integer         | `0xFF` then the canonical decimal digits (`-` sign, no leading zeros) | `-7` → `ff 2d 37` |
//!
//! Why this is injective (no two different keys share a stored form):
//! * the bytes `0xFE` and `0xFF` never occur in valid UTF-8, so a text key
//!   never starts with either;
//! * an integer's stored form is the only one that starts with `0xFF`, and
//!   decimal digits are canonical, so each integer has exactly one form;
//! * a bytes key starting with `0xFE`/`0xFF` is escaped with a `0xFE`
//!   prefix, so a stored form starting with `0xFE` is exactly such an
//!   escaped key (strip one byte to get it back), and every other stored
//!   form is an unescaped bytes or text key.
//!
//! Text and bytes with the same UTF-8 are deliberately the same key (as in
//! memcached and Redis). Every existing text key, and every bytes key not
//! starting with `0xFE`/`0xFF`, keeps the stored form it had before this
//! encoding was introduced.

use crate::error::{Error, Result};

/// First byte of every integer key's stored form. Never occurs in UTF-8.
pub const INT_KEY_MARKER: u8 = 0xFF;
/// Prefix added to a bytes key whose first byte is `0xFE` or `0xFF`.
/// Never occurs in UTF-8.
pub const BYTES_KEY_ESCAPE: u8 = 0xFE;

/// Whether a bytes key is stored exactly as given (no escape byte needed).
/// Bindings use this to avoid a copy on the common path.
#[inline]
pub fn bytes_key_is_stored_as_is(key: &[u8]) -> bool {
    !matches!(key.first(), Some(&BYTES_KEY_ESCAPE) | Some(&INT_KEY_MARKER))
}

/// Append the stored form of a bytes key to `out`.
#[inline]
pub fn encode_bytes_key(key: &[u8], out: &mut Vec<u8>) {
    if !bytes_key_is_stored_as_is(key) {
        out.push(BYTES_KEY_ESCAPE);
    }
    out.extend_from_slice(key);
}

/// Append the stored form of a text key (its UTF-8 bytes) to `out`.
#[inline]
pub fn encode_str_key(key: &str, out: &mut Vec<u8>) {
    // Valid UTF-8 never starts with 0xFE/0xFF: no escape is ever needed.
    out.extend_from_slice(key.as_bytes());
}

/// Append the stored form of a 64-bit integer key to `out`.
#[inline]
pub fn encode_int_key(key: i64, out: &mut Vec<u8>) {
    out.push(INT_KEY_MARKER);
    out.extend_from_slice(key.to_string().as_bytes());
}

/// Append the stored form of an integer of any size, given as its decimal
/// digits (optional `-`, no leading zeros, `0` for zero), to `out`.
/// Bindings with arbitrary-precision integers (Python) use this; anything
/// but a canonical decimal is refused, so the encoding stays injective.
pub fn encode_int_key_decimal(digits: &str, out: &mut Vec<u8>) -> Result<()> {
    if !is_canonical_decimal(digits.as_bytes()) {
        return Err(Error::InvalidArgument(format!(
            "{digits:?} is not a canonical decimal integer"
        )));
    }
    out.push(INT_KEY_MARKER);
    out.extend_from_slice(digits.as_bytes());
    Ok(())
}

/// A stored key, decoded back to its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodedKey<'a> {
    /// A bytes or text key (text is its UTF-8 bytes); escape removed.
    Bytes(&'a [u8]),
    /// An integer key, as its canonical decimal digits.
    Int(&'a str),
    /// Bytes that no encoder in this module produces (a `0xFF` form that is
    /// not a canonical decimal, or a lone escape byte), e.g. written by an
    /// older version or another program. Returned unchanged.
    Foreign(&'a [u8]),
}

/// Decode a stored form produced by this module.
pub fn decode_key(stored: &[u8]) -> DecodedKey<'_> {
    match stored.first() {
        Some(&INT_KEY_MARKER) => {
            let digits = &stored[1..];
            if is_canonical_decimal(digits) {
                // Canonical decimals are ASCII, hence UTF-8.
                DecodedKey::Int(std::str::from_utf8(digits).expect("ASCII digits"))
            } else {
                DecodedKey::Foreign(stored)
            }
        }
        Some(&BYTES_KEY_ESCAPE) => {
            let rest = &stored[1..];
            if bytes_key_is_stored_as_is(rest) {
                DecodedKey::Foreign(stored)
            } else {
                DecodedKey::Bytes(rest)
            }
        }
        _ => DecodedKey::Bytes(stored),
    }
}

/// `0`, or an optional `-` then a nonzero digit then digits.
fn is_canonical_decimal(d: &[u8]) -> bool {
    let body = d.strip_prefix(b"-").unwrap_or(d);
    if body.is_empty() || !body.iter().all(u8::is_ascii_digit) {
        return false;
    }
    if body[0] == b'0' {
        return d == b"0";
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(k: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        encode_bytes_key(k, &mut v);
        v
    }
    fn int(i: i64) -> Vec<u8> {
        let mut v = Vec::new();
        encode_int_key(i, &mut v);
        v
    }

    #[test]
    fn documented_forms() {
        assert_eq!(bytes(b"a"), b"a");
        let mut s = Vec::new();
        encode_str_key("é", &mut s);
        assert_eq!(s, "é".as_bytes());
        assert_eq!(int(-7), b"\xff-7");
        assert_eq!(int(0), b"\xff0");
        assert_eq!(bytes(b"\xff12345"), b"\xfe\xff12345");
        assert_eq!(bytes(b"\xfe"), b"\xfe\xfe");
        let mut big = Vec::new();
        encode_int_key_decimal("123456789012345678901234567890", &mut big).unwrap();
        assert_eq!(big, b"\xff123456789012345678901234567890");
    }

    #[test]
    fn int_and_bytes_namespaces_do_not_collide() {
        // The reproduced defect: b"\xff12345" was the key 12345.
        assert_ne!(bytes(b"\xff12345"), int(12345));
        assert_ne!(bytes(b"\xfe\xff1"), bytes(b"\xff1"));
    }

    #[test]
    fn non_canonical_decimals_are_refused() {
        for bad in ["", "-", "007", "-0", "+1", "1a", " 1"] {
            assert!(encode_int_key_decimal(bad, &mut Vec::new()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn decode_inverts_encode() {
        for k in [&b"plain"[..], b"\xff42", b"\xfe", b"\xfe\xfe", b"\x80"] {
            assert_eq!(decode_key(&bytes(k)), DecodedKey::Bytes(k));
        }
        assert_eq!(decode_key(&int(-42)), DecodedKey::Int("-42"));
        assert_eq!(decode_key(b"\xff007"), DecodedKey::Foreign(b"\xff007"));
        assert_eq!(decode_key(b"\xfeabc"), DecodedKey::Foreign(b"\xfeabc"));
    }

    #[test]
    fn encoding_is_injective_on_a_sample() {
        let mut seen = std::collections::HashMap::new();
        let mut keys: Vec<(String, Vec<u8>)> = Vec::new();
        for i in -300i64..300 {
            keys.push((format!("int {i}"), int(i)));
        }
        for a in [0u8, 1, b'1', b'-', 0x7f, 0x80, 0xfd, 0xfe, 0xff] {
            for b in [None, Some(0u8), Some(b'2'), Some(0xfe), Some(0xff)] {
                let mut k = vec![a];
                k.extend(b);
                keys.push((format!("bytes {k:?}"), bytes(&k)));
            }
        }
        for (name, stored) in keys {
            if let Some(other) = seen.insert(stored.clone(), name.clone()) {
                panic!("{name} and {other} share the stored form {stored:?}");
            }
        }
    }
}
