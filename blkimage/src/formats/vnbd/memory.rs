//! Buffers and lists of the stream readers grown fallibly: running out of
//! memory (`ulimit -v`) is an error naming what could not be had, never
//! the abort of `Vec`'s own growth.

use std::io;

/// `buf` made `len` bytes long, or the error naming `what` it holds. Only
/// the bytes past its old length are zeroed: a buffer reused for bytes
/// written over is not.
pub fn grow(buf: &mut Vec<u8>, len: usize, what: &str) -> io::Result<()> {
    let more = len.saturating_sub(buf.len());
    if more > 0 {
        let room = blkhash::room(more);
        if room.is_none() || buf.try_reserve_exact(more).is_err() {
            return Err(blkhash::out_of_memory(len, what));
        }
    }
    buf.resize(len, 0);
    Ok(())
}

/// `x` pushed on `v`, whose room doubles when it is full, or the error
/// naming `what` `v` holds.
pub fn push<T>(v: &mut Vec<T>, x: T, what: &str) -> io::Result<()> {
    reserve(v, 1, what)?;
    v.push(x);
    Ok(())
}

/// Room in `v` for `n` more items (at least double its room when it is
/// full), or the error naming `what` `v` holds.
pub fn reserve<T>(v: &mut Vec<T>, n: usize, what: &str) -> io::Result<()> {
    if v.capacity() - v.len() >= n {
        return Ok(());
    }
    let more = n.max(v.capacity()).max(16);
    let bytes = more.saturating_add(v.len()).saturating_mul(size_of::<T>());
    let room = blkhash::room(bytes);
    if room.is_none() || v.try_reserve(more).is_err() {
        return Err(blkhash::out_of_memory(bytes, what));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_much_is_an_error_not_an_abort() {
        let mut b = Vec::new();
        grow(&mut b, 10, "x").unwrap();
        assert_eq!(b, [0; 10]);
        let e = grow(&mut b, usize::MAX / 2, "a test buffer").unwrap_err();
        assert!(e.to_string().ends_with("bytes for a test buffer"), "{e}");
        let mut v: Vec<u64> = Vec::new();
        push(&mut v, 1, "x").unwrap();
        let e = reserve(&mut v, usize::MAX / 16, "a test list").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::OutOfMemory);
        assert_eq!(v, [1]);
    }
}
