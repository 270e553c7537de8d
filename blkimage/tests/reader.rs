//! Raw files and the reader: extents, bytes in order, errors.

use blkimage::{
    AlignedBuf, Extent, ExtentKind, Fill, Input, OpenOptions, RawFile, Sink, Source, read_image,
};
use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// Collects the bytes; gives buffers straight back.
#[derive(Default)]
struct Collect {
    bytes: Vec<u8>,
    zero_calls: u64,
    back: VecDeque<AlignedBuf>,
}

impl Sink for Collect {
    fn read(&mut self, len: usize, fill: Fill) -> io::Result<()> {
        let mut buf = AlignedBuf::new(len);
        fill(&mut buf.spare()[..len])?;
        buf.set_len(len);
        self.data(buf)
    }
    fn data(&mut self, buf: AlignedBuf) -> io::Result<()> {
        self.bytes.extend_from_slice(&buf);
        self.back.push_back(buf);
        Ok(())
    }
    fn zeros(&mut self, len: u64) -> io::Result<()> {
        self.zero_calls += 1;
        self.bytes.resize(self.bytes.len() + len as usize, 0);
        Ok(())
    }
    fn reclaim(&mut self) -> Option<AlignedBuf> {
        self.back.pop_front()
    }
    fn reclaim_wait(&mut self) -> Option<AlignedBuf> {
        self.back.pop_front()
    }
}

fn read_all(
    src: impl Source + 'static,
    read_size: usize,
) -> io::Result<(Collect, blkimage::Stats)> {
    let src: Arc<dyn Source> = Arc::new(src);
    let mut sink = Collect::default();
    let stats = read_image(
        src.clone(),
        &mut sink,
        read_size,
        &AtomicBool::new(false),
        &mut |_| {},
    )?;
    src.finish()?;
    Ok((sink, stats))
}

#[test]
fn holes_are_never_read_and_bytes_come_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = testkit::Recipe::parse("1m:r 2m:- 64k:t 1m:- 1000:r").unwrap();
    let path = dir.path().join("a.img");
    recipe.write_image(&path).unwrap();
    let mut want = recipe.bytes();
    want.resize(want.len().next_multiple_of(512), 0);
    for cache in [false, true] {
        for read_size in [4096, 64 << 10, 1 << 20] {
            let src = RawFile::open(&path, !cache).unwrap();
            assert_eq!(src.size(), want.len() as u64);
            let (sink, stats) = read_all(src, read_size).unwrap();
            assert!(sink.bytes == want, "cache {cache} rs {read_size}");
            assert_eq!(stats.hole, (3 << 20) + 24, "the holes and the 512 padding");
            assert_eq!(stats.data, (1 << 20) + (64 << 10) + 1000);
        }
    }
}

#[test]
fn extents_of_a_sparse_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.img");
    testkit::Recipe::parse("64k:A 128k:- 64k:B 100:C")
        .unwrap()
        .write_image(&path)
        .unwrap();
    let src = RawFile::open(&path, false).unwrap();
    let mut pos = 0;
    let mut got = Vec::new();
    while pos < src.size() {
        let e = src.extents(pos, src.size() - pos).unwrap()[0];
        got.push((e.offset, e.len, e.kind));
        pos = e.end();
    }
    use ExtentKind::*;
    let k = 1024;
    assert_eq!(
        got,
        [
            (0, 64 * k, Data),
            (64 * k, 128 * k, Hole),
            (192 * k, 64 * k + 100, Data),
            (256 * k + 100, 412, Hole),
        ]
    );
}

#[test]
fn a_file_that_shrinks_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.img");
    testkit::Recipe::parse("4m:r")
        .unwrap()
        .write_image(&path)
        .unwrap();
    let src = RawFile::open(&path, false).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let err = read_all(src, 1 << 20).err().expect("an error");
    assert!(err.to_string().contains("shr"), "{err}");
    // Shrinking inside what was a hole is caught at the end too.
    testkit::Recipe::parse("1m:r 3m:-")
        .unwrap()
        .write_image(&path)
        .unwrap();
    let src = RawFile::open(&path, false).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(2 << 20)
        .unwrap();
    let err = read_all(src, 1 << 20).err().expect("an error");
    assert!(err.to_string().contains("shrank"), "{err}");
}

/// A source whose reads fail past an offset.
struct Failing {
    size: u64,
    bad_from: u64,
}

impl Source for Failing {
    fn format(&self) -> &str {
        "test"
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        Ok(vec![Extent {
            offset,
            len,
            kind: ExtentKind::Data,
        }])
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if offset + buf.len() as u64 > self.bad_from {
            return Err(io::Error::from_raw_os_error(libc_eio()));
        }
        buf.fill(1);
        Ok(())
    }
}

fn libc_eio() -> i32 {
    5
}

#[test]
fn a_read_error_stops_the_run() {
    let src = Failing {
        size: 64 << 20,
        bad_from: 10 << 20,
    };
    let err = read_all(src, 1 << 20).err().expect("an error");
    assert_eq!(err.raw_os_error(), Some(5));
}

#[test]
fn open_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let err = blkimage::open(dir.path().to_str().unwrap(), &OpenOptions::default())
        .err()
        .unwrap();
    assert_eq!(err.raw_os_error(), Some(21), "EISDIR");
    assert!(matches!(
        blkimage::open("-", &OpenOptions::default()).unwrap(),
        Input::Stream(_)
    ));
    assert!(matches!(
        blkimage::open("/dev/null", &OpenOptions::default()).unwrap(),
        Input::Stream(_)
    ));
}
