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
    // Lent bytes are copied by the default `lend`: the lending path runs.
    fn takes_lends(&self) -> bool {
        true
    }
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
    read_with(Arc::new(src), read_size, Some(0), &AtomicBool::new(false))
}

/// Read `src` with `io_depth` reads in flight (see `read_image`).
fn read_with(
    src: Arc<dyn Source>,
    read_size: usize,
    io_depth: Option<usize>,
    cancel: &AtomicBool,
) -> io::Result<(Collect, blkimage::Stats)> {
    let mut sink = Collect::default();
    let stats = read_image(
        src.clone(),
        &mut sink,
        read_size,
        io_depth,
        cancel,
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

/// A file read from memory maps: the same bytes as with copies, in the
/// order the extents say, its chunks lent in place (the sink here copies
/// what is lent, as every sink but the hasher does), with reads on the
/// sink's threads and on reading threads; a file that shrank is an error.
#[test]
fn a_mapped_file_reads_the_same_and_a_shrunk_one_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = testkit::Recipe::parse("3m:r 2m:- 300k:t 1m:- 1000:r").unwrap();
    let path = dir.path().join("a.img");
    recipe.write_image(&path).unwrap();
    let mut want = recipe.bytes();
    want.resize(want.len().next_multiple_of(512), 0);
    let opts = OpenOptions {
        cache: true,
        map: blkimage::MapReads::Always,
        ..Default::default()
    };
    for depth in [0, 4] {
        for read_size in [64 << 10, 1 << 20, 4 << 20] {
            let src = RawFile::open_with(&path, &opts).unwrap();
            // Whole chunks of 256 KiB or more are lent, the rest copied.
            assert_eq!(src.lendable(0, 1 << 20), 1 << 20);
            assert_eq!(src.lendable(0, 4096), 0);
            let (sink, _) = read_with(
                Arc::new(src),
                read_size,
                Some(depth),
                &AtomicBool::new(false),
            )
            .unwrap();
            assert!(sink.bytes == want, "depth {depth} rs {read_size}");
        }
    }
    let src = RawFile::open_with(&path, &opts).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let err = read_with(Arc::new(src), 1 << 20, Some(0), &AtomicBool::new(false))
        .err()
        .expect("an error");
    assert!(err.to_string().contains("shrank"), "{err}");
}

/// With reads on the sink's threads (depth 0) and on 8 reading threads.
#[test]
fn a_file_that_shrinks_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.img");
    // The recipe, the length it is cut to, and what the error says.
    let cases = [("4m:r", 1 << 20, "shr"), ("1m:r 3m:-", 2 << 20, "shrank")];
    for depth in [0, 8] {
        // The second case: shrinking inside what was a hole is caught at
        // the end too.
        for (recipe, cut, says) in cases {
            testkit::Recipe::parse(recipe)
                .unwrap()
                .write_image(&path)
                .unwrap();
            let src = RawFile::open(&path, false).unwrap();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(cut)
                .unwrap();
            let err = read_with(Arc::new(src), 1 << 20, Some(depth), &AtomicBool::new(false))
                .err()
                .expect("an error");
            assert!(err.to_string().contains(says), "depth {depth}: {err}");
        }
    }
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

// ---------------------------------------------------------------------------
// Reads in flight on reading threads (io_depth): the promises of the
// reader hold with many reads at once.

/// A source of `size` bytes: data where `data(offset)` says, each 8-byte
/// word its offset; reads take a pseudo-random few milliseconds, so they
/// finish out of order; reads at or past `bad_from` fail with EIO; after
/// `cancel_after` reads, `cancel` is set (a Ctrl-C mid-run); until
/// `gather` reads were in flight at once, each read waits for the others.
struct Slow {
    size: u64,
    chunk: u64,
    bad_from: u64,
    reads: std::sync::atomic::AtomicU64,
    in_flight: std::sync::atomic::AtomicU64,
    most_in_flight: std::sync::atomic::AtomicU64,
    cancel_after: u64,
    cancel: Arc<AtomicBool>,
    gather: u64,
    gave_up: AtomicBool,
    /// Its own reads in flight (`default_io_depth`), and bytes of them.
    own_depth: usize,
    own_bytes: Option<usize>,
}

impl Slow {
    fn new(size: u64) -> Slow {
        Slow {
            size,
            chunk: 1 << 20,
            bad_from: u64::MAX,
            reads: Default::default(),
            in_flight: Default::default(),
            most_in_flight: Default::default(),
            cancel_after: u64::MAX,
            cancel: Arc::default(),
            gather: 0,
            gave_up: AtomicBool::new(false),
            own_depth: 0,
            own_bytes: None,
        }
    }
    /// Every other `chunk` is data, the rest holes.
    fn is_data(&self, offset: u64) -> bool {
        (offset / self.chunk).is_multiple_of(2)
    }
    fn expected(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.size as usize];
        for (i, w) in v.chunks_mut(8).enumerate() {
            let at = i as u64 * 8;
            if self.is_data(at) {
                w.copy_from_slice(&at.to_le_bytes()[..w.len()]);
            }
        }
        v
    }
}

impl Source for Slow {
    fn format(&self) -> &str {
        "test"
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn default_io_depth(&self, _read_size: usize) -> usize {
        self.own_depth
    }
    fn bytes_in_flight(&self) -> Option<usize> {
        self.own_bytes
    }
    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        let end = ((offset / self.chunk + 1) * self.chunk).min(offset + len);
        let kind = if self.is_data(offset) {
            ExtentKind::Data
        } else {
            ExtentKind::Hole
        };
        Ok(vec![Extent {
            offset,
            len: end - offset,
            kind,
        }])
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        assert!(self.is_data(offset), "a hole was read at {offset}");
        let n = self.reads.fetch_add(1, SeqCst) + 1;
        if n >= self.cancel_after {
            self.cancel.store(true, SeqCst);
        }
        let now = self.in_flight.fetch_add(1, SeqCst) + 1;
        self.most_in_flight.fetch_max(now, SeqCst);
        // Reads the reader has in flight together meet here, however the
        // threads are scheduled on a loaded machine; a reader that never
        // has `gather` at once is waited for 10 s, once.
        let start = std::time::Instant::now();
        while self.most_in_flight.load(SeqCst) < self.gather && !self.gave_up.load(SeqCst) {
            if start.elapsed() > std::time::Duration::from_secs(10) {
                self.gave_up.store(true, SeqCst);
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        // 0-3 ms, varying by offset: later reads often finish first.
        let ms = (offset.wrapping_mul(2654435761) >> 20) % 4;
        std::thread::sleep(std::time::Duration::from_millis(ms));
        self.in_flight.fetch_sub(1, SeqCst);
        if offset + buf.len() as u64 > self.bad_from {
            return Err(io::Error::from_raw_os_error(libc_eio()));
        }
        for (i, w) in buf.chunks_mut(8).enumerate() {
            let at = offset + i as u64 * 8;
            w.copy_from_slice(&at.to_le_bytes()[..w.len()]);
        }
        Ok(())
    }
}

#[test]
fn many_reads_in_flight_come_in_order_and_holes_are_never_read() {
    for depth in [1, 2, 8, 32] {
        let mut src = Slow::new(48 << 20);
        if depth >= 8 {
            src.gather = 4;
        }
        let src = Arc::new(src);
        let want = src.expected();
        // 256 KiB reads: four per data chunk.
        let (sink, stats) =
            read_with(src.clone(), 256 << 10, Some(depth), &AtomicBool::new(false)).unwrap();
        assert!(sink.bytes == want, "depth {depth}: bytes out of order");
        assert_eq!((stats.data, stats.hole), (24 << 20, 24 << 20));
        let most = src.most_in_flight.load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            most as usize <= depth,
            "depth {depth}: {most} reads at once"
        );
        if depth >= 8 {
            assert!(most >= 4, "depth {depth}: at most {most} reads at once");
        }
    }
}

/// A source's own depth bounded by bytes (a URL's: many reads, 16 MiB of
/// them): small reads keep more in flight than large ones, never more
/// bytes than the bound, and a depth asked for is a count again.
#[test]
fn reads_bounded_by_bytes_keep_more_small_reads_in_flight() {
    use std::sync::atomic::Ordering::SeqCst;
    for (read_size, most_at_least, most_at_most) in [(1 << 20, 2, 4), (64 << 10, 16, 64)] {
        let mut src = Slow::new(16 << 20);
        (src.own_depth, src.own_bytes) = (64, Some(4 << 20));
        src.gather = most_at_least;
        let src = Arc::new(src);
        let (sink, _) = read_with(src.clone(), read_size, None, &AtomicBool::new(false)).unwrap();
        assert!(sink.bytes == src.expected());
        let most = src.most_in_flight.load(SeqCst);
        assert!(
            (most_at_least..=most_at_most).contains(&most),
            "{read_size}-byte reads: {most} in flight at once"
        );
    }
    let mut src = Slow::new(16 << 20);
    (src.own_depth, src.own_bytes) = (64, Some(1 << 20));
    src.gather = 8;
    let src = Arc::new(src);
    read_with(src.clone(), 1 << 20, Some(8), &AtomicBool::new(false)).unwrap();
    assert_eq!(src.most_in_flight.load(SeqCst), 8);
}

#[test]
fn a_read_error_with_many_reads_in_flight_stops_the_run() {
    for bad_from in [0, 5 << 20, (40 << 20) + 4096] {
        let mut src = Slow::new(48 << 20);
        src.bad_from = bad_from;
        let err = read_with(Arc::new(src), 1 << 20, Some(16), &AtomicBool::new(false))
            .err()
            .expect("an error, no checksum");
        assert_eq!(err.raw_os_error(), Some(5), "{err}");
    }
}

#[test]
fn ctrl_c_stops_reads_in_flight() {
    let mut src = Slow::new(256 << 20);
    src.cancel_after = 10;
    let cancel = src.cancel.clone();
    let src = Arc::new(src);
    let err = read_with(src.clone(), 1 << 20, Some(16), &cancel)
        .err()
        .expect("interrupted");
    assert_eq!(err.kind(), io::ErrorKind::Interrupted, "{err}");
    // Stopped soon after: not the 128 data reads of the whole image.
    let reads = src.reads.load(std::sync::atomic::Ordering::SeqCst);
    assert!(reads < 10 + 2 * 16 + 1, "{reads} reads after Ctrl-C");
}

/// A local file read with direct I/O keeps 4 MiB of reads in flight by
/// default (the issue's 16 MiB of RSS): 4 of 1 MiB, more of smaller reads
/// up to 16, one of a read that large or larger.
#[test]
fn direct_io_depth_is_bounded_by_bytes() {
    assert_eq!(blkimage::direct_io_depth(1 << 20), 4);
    assert_eq!(blkimage::direct_io_depth(256 << 10), 16);
    assert_eq!(
        blkimage::direct_io_depth(64 << 10),
        blkimage::DEFAULT_IO_DEPTH
    );
    assert_eq!(blkimage::direct_io_depth(4 << 20), 1);
    assert_eq!(blkimage::direct_io_depth(64 << 20), 1);
}

/// Direct I/O on a real file system (not tmpfs, which has none): the
/// default reads with reading threads, and the bytes are the file's.
#[test]
fn direct_io_on_a_real_file_system_reads_with_the_default_depth() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let path = dir.path().join("d.img");
    testkit::Recipe::parse("3m:r 2m:- 1m:0 5m:r 100k:t")
        .unwrap()
        .write_image(&path)
        .unwrap();
    let src = RawFile::open(&path, true).unwrap();
    if !src.is_direct() {
        eprintln!("/var/tmp has no direct I/O: test skipped");
        return;
    }
    assert_eq!(
        blkimage::io_depth_for(&src, None, 1 << 20),
        blkimage::direct_io_depth(1 << 20)
    );
    let want = std::fs::read(&path).unwrap();
    let (sink, _) = read_with(Arc::new(src), 1 << 20, None, &AtomicBool::new(false)).unwrap();
    assert!(sink.bytes[..want.len()] == want[..]);
    assert!(sink.bytes[want.len()..].iter().all(|&b| b == 0));
}

/// A pipe given as a path (`/dev/fd/N`, as `<(cmd)` gives) gets a 1 MiB
/// buffer: with the default 64 KiB, moving bytes through it was 4× slower.
/// The writer has written and closed: opening a pipe reads its first
/// bytes (is it compressed?).
#[test]
fn a_pipe_gets_a_large_buffer() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let (reader, mut writer) = std::io::pipe().unwrap();
    writer.write_all(&[7u8; 4096]).unwrap();
    drop(writer);
    let fd = reader.as_raw_fd();
    // SAFETY: fcntl on a descriptor we hold.
    let size = || unsafe { libc::fcntl(fd, libc::F_GETPIPE_SZ) };
    assert_eq!(size(), 64 << 10);
    let input = blkimage::open(format!("/dev/fd/{fd}"), &OpenOptions::default()).unwrap();
    assert!(matches!(input, Input::Stream(_)));
    assert_eq!(size(), 1 << 20);
}
