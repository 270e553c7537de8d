//! What the reader tests share: opening an input, and reading a source the
//! two ways a reader can (by its extents, in parallel; by plain reads).
#![allow(dead_code)] // each test file uses a part

use blkimage::{ExtentKind, Input, OpenOptions, Source};
use std::ffi::OsStr;
use std::io;

/// Open `name` (a path or a URL) as an image source.
pub fn open_with(name: impl AsRef<OsStr>, opts: &OpenOptions) -> io::Result<Box<dyn Source>> {
    match blkimage::open(name, opts)? {
        Input::Image(s) => Ok(s),
        Input::Stream(_) => panic!("a stream"),
    }
}

/// As the reader does: walk the extents, read the data ones in chunks, in
/// parallel threads; zeros for the rest.
pub fn read_by_extents(src: &dyn Source, chunk: u64) -> Vec<u8> {
    let mut out = vec![0u8; src.size() as usize];
    let mut reads = Vec::new();
    let mut pos = 0;
    while pos < src.size() {
        let exts = src.extents(pos, src.size() - pos).unwrap();
        assert!(!exts.is_empty());
        let mut p = pos;
        for e in &exts {
            assert_eq!(e.offset, p);
            assert!(e.len > 0);
            p = e.end();
        }
        assert!(p <= src.size());
        let e = exts[0];
        if e.kind == ExtentKind::Data {
            let mut o = e.offset;
            while o < e.end() {
                let n = chunk.min(e.end() - o);
                reads.push((o, n));
                o += n;
            }
        }
        pos = e.end();
    }
    let slices: Vec<(u64, &mut [u8])> = {
        let mut v = Vec::new();
        let mut rest: &mut [u8] = &mut out;
        let mut at = 0u64;
        for &(o, n) in &reads {
            let (_, tail) = rest.split_at_mut((o - at) as usize);
            let (mine, tail) = tail.split_at_mut(n as usize);
            v.push((o, mine));
            rest = tail;
            at = o + n;
        }
        v
    };
    std::thread::scope(|s| {
        let per = slices.len().div_ceil(4).max(1);
        let mut slices = slices;
        while !slices.is_empty() {
            let batch: Vec<_> = slices.drain(..per.min(slices.len())).collect();
            s.spawn(move || {
                for (o, buf) in batch {
                    src.read_at(buf, o).unwrap();
                }
            });
        }
    });
    out
}

/// read_at over everything, extents ignored, in odd-sized chunks.
pub fn read_plain(src: &dyn Source, chunk: usize) -> Vec<u8> {
    let mut out = vec![0u8; src.size() as usize];
    for (i, c) in out.chunks_mut(chunk).enumerate() {
        src.read_at(c, (i * chunk) as u64).unwrap();
    }
    out
}

/// The extents of `src`, start to end, one call each.
pub fn kinds(src: &dyn Source) -> Vec<(u64, u64, ExtentKind)> {
    let mut v = Vec::new();
    let mut pos = 0;
    while pos < src.size() {
        let e = src.extents(pos, src.size() - pos).unwrap()[0];
        v.push((e.offset, e.len, e.kind));
        pos = e.end();
    }
    v
}

/// As the reader does with a source that lends: walk the extents, and for
/// each data chunk of `chunk` bytes take the prefix the source lends in
/// place ([`Source::read_in_place`]) and read the rest with copies. The
/// bytes, and how many of them were lent.
pub fn read_lending(src: &dyn Source, chunk: u64) -> (Vec<u8>, u64) {
    let mut out = vec![0u8; src.size() as usize];
    let mut lent_bytes = 0;
    let mut pos = 0;
    while pos < src.size() {
        let e = src.extents(pos, src.size() - pos).unwrap()[0];
        let mut o = e.offset;
        while e.kind == ExtentKind::Data && o < e.end() {
            let n = chunk.min(e.end() - o) as usize;
            let at = o as usize;
            match src.lendable(o, n).min(n) {
                0 => src.read_at(&mut out[at..at + n], o).unwrap(),
                lent => {
                    let mut seen = 0;
                    src.read_in_place(o, lent, &mut |b| {
                        out[at..at + b.len()].copy_from_slice(b);
                        seen = b.len();
                    })
                    .unwrap();
                    assert_eq!(seen, lent);
                    lent_bytes += lent as u64;
                    o += lent as u64;
                    continue;
                }
            }
            o += n as u64;
        }
        pos = e.end();
    }
    (out, lent_bytes)
}
