//! Compressed clusters: raw deflate (zlib) or zstd, inflated into exactly
//! one cluster.
//!
//! As QEMU: the compressed bytes are known only to the sector, so input may
//! be left over once the cluster is full. Stricter than QEMU: a stream that
//! would produce more than one cluster is an error, as is one that ends (or
//! runs out of input) before the cluster is full.

use super::header::Compression;
use super::invalid;
use flate2::{Decompress, FlushDecompress, Status};
use std::cell::RefCell;
use std::io;
use zstd::stream::raw::{DParameter, Decoder, InBuffer, Operation, OutBuffer};

/// zstd frames may ask for a window of at most 2^23 bytes (8 MiB): clusters
/// are at most 2 MiB, and a hostile frame must not make us allocate more.
const ZSTD_WINDOW_LOG_MAX: u32 = 23;

thread_local! {
    static INFLATE: RefCell<Option<Decompress>> = const { RefCell::new(None) };
    static ZSTD: RefCell<Option<Decoder<'static>>> = const { RefCell::new(None) };
}

/// Decompress `input` into all of `out` (one cluster).
pub fn decompress(kind: Compression, input: &[u8], out: &mut [u8]) -> io::Result<()> {
    match kind {
        Compression::Zlib => INFLATE.with(|cell| {
            let mut cell = cell.borrow_mut();
            let d = cell.get_or_insert_with(|| Decompress::new(false));
            d.reset(false);
            inflate(d, input, out)
        }),
        Compression::Zstd => ZSTD.with(|cell| {
            let mut cell = cell.borrow_mut();
            let d = match cell.as_mut() {
                Some(d) => {
                    d.reinit()?;
                    d
                }
                None => {
                    let mut d = Decoder::new()?;
                    d.set_parameter(DParameter::WindowLogMax(ZSTD_WINDOW_LOG_MAX))?;
                    cell.insert(d)
                }
            };
            unzstd(d, input, out)
        }),
    }
}

fn ends_early(filled: usize, want: usize) -> io::Error {
    invalid(format!(
        "compressed cluster ends early ({filled} of {want} bytes)"
    ))
}

fn too_long() -> io::Error {
    invalid("compressed cluster inflates past one cluster".into())
}

fn inflate(d: &mut Decompress, input: &[u8], out: &mut [u8]) -> io::Result<()> {
    let bad = |e: flate2::DecompressError| invalid(format!("bad compressed cluster: {e}"));
    let mut ended = false;
    loop {
        let (i, o) = (d.total_in() as usize, d.total_out() as usize);
        if o == out.len() {
            break;
        }
        let st = d
            .decompress(&input[i..], &mut out[o..], FlushDecompress::None)
            .map_err(bad)?;
        if st == Status::StreamEnd {
            ended = true;
            break;
        }
        if d.total_in() as usize == i && d.total_out() as usize == o {
            break; // no progress: input exhausted
        }
    }
    let filled = d.total_out() as usize;
    if filled < out.len() {
        return Err(ends_early(filled, out.len()));
    }
    if !ended {
        // Full: the stream must not have more to give.
        let i = d.total_in() as usize;
        let mut extra = [0u8; 1];
        d.decompress(&input[i..], &mut extra, FlushDecompress::None)
            .map_err(bad)?;
        if d.total_out() as usize > filled {
            return Err(too_long());
        }
    }
    Ok(())
}

fn unzstd(d: &mut Decoder<'static>, input: &[u8], out: &mut [u8]) -> io::Result<()> {
    let bad = |e: io::Error| invalid(format!("bad compressed cluster: {e}"));
    let want = out.len();
    let mut inb = InBuffer::around(input);
    let mut filled = 0;
    let mut ended = false;
    while filled < want {
        let before_in = inb.pos;
        let mut outb = OutBuffer::around(&mut out[filled..]);
        let hint = d.run(&mut inb, &mut outb).map_err(bad)?;
        let produced = outb.pos();
        filled += produced;
        if hint == 0 {
            ended = true; // the frame is complete
            break;
        }
        if produced == 0 && inb.pos == before_in {
            break; // no progress: input exhausted
        }
    }
    if filled < want {
        return Err(ends_early(filled, want));
    }
    if !ended {
        let mut extra = [0u8; 1];
        let mut outb = OutBuffer::around(&mut extra[..]);
        d.run(&mut inb, &mut outb).map_err(bad)?;
        if outb.pos() > 0 {
            return Err(too_long());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::{Compress, Compression as Level, FlushCompress};

    fn deflate(data: &[u8]) -> Vec<u8> {
        let mut c = Compress::new(Level::default(), false);
        let mut out = Vec::with_capacity(data.len() + 1024);
        c.compress_vec(data, &mut out, FlushCompress::Finish)
            .unwrap();
        out
    }

    fn sample(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[test]
    fn zlib_exact_cluster() {
        let data = sample(65536);
        let mut z = deflate(&data);
        z.extend_from_slice(&[0xAA; 300]); // sector padding / next cluster's bytes
        let mut out = vec![0u8; 65536];
        decompress(Compression::Zlib, &z, &mut out).unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn zlib_too_long_and_short() {
        let data = sample(65536 + 10);
        let z = deflate(&data);
        let mut out = vec![0u8; 65536];
        let e = decompress(Compression::Zlib, &z, &mut out).unwrap_err();
        assert!(e.to_string().contains("past one cluster"), "{e}");
        let z = deflate(&sample(1000));
        let e = decompress(Compression::Zlib, &z, &mut out).unwrap_err();
        assert!(e.to_string().contains("ends early"), "{e}");
        let z = deflate(&sample(65536));
        let e = decompress(Compression::Zlib, &z[..z.len() / 2], &mut out).unwrap_err();
        assert!(e.to_string().contains("ends early"), "{e}");
        let e = decompress(Compression::Zlib, &[0xff; 100], &mut out).unwrap_err();
        assert!(e.to_string().contains("bad compressed"), "{e}");
    }

    #[test]
    fn zstd_cases() {
        let data = sample(65536);
        let mut z = zstd::bulk::compress(&data, 3).unwrap();
        z.extend_from_slice(&[0u8; 100]);
        let mut out = vec![0u8; 65536];
        decompress(Compression::Zstd, &z, &mut out).unwrap();
        assert_eq!(out, data);
        // Reused decoder.
        decompress(Compression::Zstd, &z, &mut out).unwrap();
        let z = zstd::bulk::compress(&sample(70000), 3).unwrap();
        let e = decompress(Compression::Zstd, &z, &mut out).unwrap_err();
        assert!(e.to_string().contains("past one cluster"), "{e}");
        let z = zstd::bulk::compress(&sample(100), 3).unwrap();
        let e = decompress(Compression::Zstd, &z, &mut out).unwrap_err();
        assert!(e.to_string().contains("ends early"), "{e}");
        let e = decompress(Compression::Zstd, &[0x55; 64], &mut out).unwrap_err();
        assert!(e.to_string().contains("bad compressed"), "{e}");
    }
}
