//! Hashing jobs on disk images: the library layer every front end (the
//! commands, the Python package) calls. One checked [`Job`] describes how
//! to open, read and hash; one read path ([`hash`], [`map`], [`map_range`])
//! runs it; the operations on top of it are here too: resumable runs
//! ([`checkpoint`]), the saved state of a copy ([`state`]), the delta copy
//! ([`sync`]), and the guards that keep an output from destroying data
//! ([`guard`]).
//!
//! Nothing here parses a command line or prints: the command layer
//! (`blkcli`) turns flags into a [`JobSpec`], and adds the flags to the
//! messages where one helps.
//!
//! ```no_run
//! let job = blkjob::JobSpec::default().build().unwrap();
//! let input = job.open("disk.qcow2").unwrap();
//! let hashed = blkjob::hash(input, &job, &mut |_| {}).unwrap();
//! println!("{}  disk.qcow2", hashed.checksum.to_hex());
//! ```

// Every public item says what it is (cargo doc is part of the API).
#![warn(missing_docs)]

pub mod checkpoint;
pub mod guard;
pub mod incremental;
mod index;
mod job;
pub mod record;
mod span;
pub mod state;
pub mod sync;

pub use index::{
    IndexOnly, hash_named, hash_pbs_chunks, index_checksum, index_key, index_keyed, pbs_checkable,
};
pub use job::{
    DEFAULT_QUEUE_DEPTH, DEFAULT_READ_SIZE, Job, JobError, JobSpec, MAX_IO_DEPTH, MAX_QUEUE_DEPTH,
    MAX_READ_SIZE, MIN_READ_SIZE, check_block_size, check_read_size, exact_size, open_dirty,
};
pub use span::Span;

use blkhash::{BlockEvent, Checksum, Pipeline};
use blkimage::{AlignedBuf, Decompressed, Input, InputRead, Rounded, Stats};
use blkmap::{Map, MapBuilder, Part};
use std::fs::File;
use std::io::{self, Read};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// What hashing one input found.
#[derive(Debug)]
pub struct Hashed {
    /// The checksum.
    pub checksum: Checksum,
    /// "raw", "qcow2", another QEMU format name, or "stream" for a pipe.
    pub format: String,
    /// Guest-visible bytes of the input.
    pub size: u64,
    /// Bytes per block.
    pub block_size: usize,
    /// What this run read: data, zero and unallocated bytes.
    pub stats: Stats,
    /// The file's size, if the guest size was rounded up from it (a raw
    /// file whose length is not a multiple of 512): for the caller to say.
    pub rounded: Option<Rounded>,
    /// How a compressed image was decompressed into a temporary file, if
    /// it was: for the caller to say.
    pub decompressed: Option<Decompressed>,
    /// Bytes a checkpoint covered when the run started (0 without one).
    pub resumed_at: u64,
}

/// The checksum of `input` (opened with [`Job::open`]); `progress` gets
/// the bytes read as they are passed on.
pub fn hash(input: Input, job: &Job, progress: &mut dyn FnMut(u64)) -> io::Result<Hashed> {
    let sink = Pipeline::new(job.hasher_options())?;
    let (checksum, read) = read_all(input, sink, job, job.cancel(), progress, Pipeline::finalize)?;
    Ok(Hashed {
        checksum,
        format: read.format,
        size: read.stats.total(),
        block_size: job.block_size(),
        stats: read.stats,
        rounded: read.rounded,
        decompressed: read.decompressed,
        resumed_at: 0,
    })
}

/// Read all of `input` into `sink` as `job` asks, until `stop` is set;
/// then finalize the hasher with `finalize` (always: every block read is
/// digested and seen by the hasher's observers up to the first failure, as
/// a checkpoint needs to save them), then check the input. The one read
/// path of every operation here.
pub(crate) fn read_all<T>(
    input: Input,
    mut sink: Pipeline<AlignedBuf>,
    job: &Job,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(u64),
    finalize: impl FnOnce(Pipeline<AlignedBuf>) -> io::Result<T>,
) -> io::Result<(T, InputRead)> {
    let read = blkimage::read_input(
        input,
        &mut sink,
        job.read_size(),
        job.io_depth(),
        stop,
        progress,
    );
    let value = finalize(sink);
    let mut read = read?;
    let value = value?;
    // Only now are all reads done: is the image still what we read?
    read.finish()?;
    read.stats.mapped = read.mapped_bytes();
    Ok((value, read))
}

/// Why `map` cannot be compared with images hashed with `algorithm` and
/// `block_size`, if it cannot.
pub fn map_mismatch(map: &Map, algorithm: blkhash::Algorithm, block_size: usize) -> Option<String> {
    header_mismatch(&map.header(), algorithm, block_size)
}

/// [`map_mismatch`] of a map's (or part's) header.
pub fn header_mismatch(
    h: &blkmap::Header,
    algorithm: blkhash::Algorithm,
    block_size: usize,
) -> Option<String> {
    (h.algorithm != algorithm || h.block_size != block_size).then(|| {
        format!(
            "a map of {} digests of {}-byte blocks, not {algorithm} of {block_size}-byte blocks",
            h.algorithm, h.block_size
        )
    })
}

/// A map of an input, and what the input was.
pub struct Mapped {
    /// The block map.
    pub map: Map,
    /// "raw", "qcow2", ... for images, "stream" for pipes, "map" for a saved map.
    pub format: String,
    /// The file's size, if the guest size was rounded up from it (a raw
    /// file whose length is not a multiple of 512): for the caller to say.
    pub rounded: Option<Rounded>,
    /// How a compressed image was decompressed into a temporary file, if
    /// it was: for the caller to say.
    pub decompressed: Option<Decompressed>,
    /// What was read: data, zero and unallocated bytes (all zero for a
    /// saved map).
    pub stats: Stats,
}

/// A hasher for `job` with a map builder observing it.
pub fn hasher(job: &Job) -> io::Result<(Pipeline<AlignedBuf>, MapBuilder)> {
    hasher_also(job, |_| {})
}

/// A hasher for `job` with a map builder observing it, and `also` seeing
/// every block event first, in block order.
pub fn hasher_also(
    job: &Job,
    mut also: impl FnMut(BlockEvent<'_>) + Send + 'static,
) -> io::Result<(Pipeline<AlignedBuf>, MapBuilder)> {
    let mut h = Pipeline::new(job.hasher_options())?;
    let builder = MapBuilder::new(job.algorithm(), job.block_size())?.block_key(job.digest_key());
    let mut build = builder.observer();
    h.set_observer(move |e| {
        also(e);
        build(e);
    });
    Ok((h, builder))
}

/// Hash `input` into a map, stopping with an error once `cancel` is set
/// (the job's own flag, or another); `progress` gets the bytes read.
pub fn map(
    input: Input,
    job: &Job,
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(u64),
) -> io::Result<Mapped> {
    let (sink, builder) = hasher(job)?;
    let (map, read) = read_all(input, sink, job, cancel, progress, |sink| {
        builder.finalize(sink)
    })?;
    Ok(Mapped {
        map,
        format: read.format,
        rounded: read.rounded,
        decompressed: read.decompressed,
        stats: read.stats,
    })
}

/// [`map`] of the image `input` opened from `name`, the map recording what
/// the image read ([`record::Record`]: its files, or its export) as its
/// identity, taken before anything is read, for whatever later trusts the
/// map instead of reading again (an incremental update checks it). A
/// stream records nothing.
///
/// (The name is no longer read: the record asks the source where its
/// bytes came from. The parameter stays for the callers.)
pub fn map_image(
    _name: &std::ffi::OsStr,
    input: Input,
    job: &Job,
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(u64),
) -> io::Result<Mapped> {
    let identity = match &input {
        Input::Image(src) => record::Record::of(&**src)?.identity(),
        Input::Stream(_) => None,
    };
    let mut mapped = map(input, job, cancel, progress)?;
    mapped.map = mapped.map.with_identity(identity)?;
    Ok(mapped)
}

/// The image of `input` as a source that can be read in ranges; a stream
/// cannot: `what` says what was asked of it.
pub fn seekable(input: Input, what: &str) -> io::Result<Arc<dyn blkimage::Source>> {
    match input {
        Input::Image(src) => Ok(Arc::from(src)),
        Input::Stream(_) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{what} needs an image that can seek, not a pipe, standard input or a \
                 compressed raw image"
            ),
        )),
    }
}

/// Hash the bytes `range` of `src` (opened from `name`) into a part of its
/// map (see [`blkmap::merge`]), the part recording what the image read as
/// [`map_image`] does (parts of one unchanged image record the same, and
/// their merge keeps it); `progress` gets the bytes read. The range starts
/// at a block boundary and ends at one or at the image's end.
///
/// ```no_run
/// use blkmap::Range;
/// let job = blkjob::Job::default();
/// let src = blkjob::seekable(job.open("disk.qcow2").unwrap(), "a range").unwrap();
/// let bs = job.block_size() as u64;
/// let half = (src.size() / 2).next_multiple_of(bs).min(src.size());
/// let name = "disk.qcow2".as_ref();
/// let first = blkjob::map_range(name, src.clone(), Range { offset: 0, len: half }, &job, &mut |_| {}).unwrap();
/// let rest = Range { offset: half, len: src.size() - half };
/// let second = blkjob::map_range(name, src, rest, &job, &mut |_| {}).unwrap();
/// first.save("disk.0.part").unwrap();
/// second.save("disk.1.part").unwrap();
/// let map = blkmap::merge_files(&["disk.1.part", "disk.0.part"], Some("disk.map".as_ref())).unwrap();
/// println!("{}", map.checksum.unwrap());
/// ```
///
/// (The name is no longer read: the record asks the source where its
/// bytes came from. The parameter stays for the callers.)
pub fn map_range(
    _name: &std::ffi::OsStr,
    src: Arc<dyn blkimage::Source>,
    range: blkmap::Range,
    job: &Job,
    progress: &mut dyn FnMut(u64),
) -> io::Result<Part> {
    let size = src.size();
    blkmap::check_range(size, job.block_size(), range)?;
    let identity = record::Record::of(&*src)?.identity();
    let window = blkimage::Window::new(src, range.offset, range.len)?;
    let (sink, builder) = hasher(job)?;
    let input = Input::Image(Box::new(window));
    let (mut part, _) = read_all(input, sink, job, job.cancel(), progress, |sink| {
        builder.finalize_part(sink, size, range.offset)
    })?;
    if let Some(identity) = identity {
        part.set_identity(identity)?;
    }
    Ok(part)
}

/// A map or part written to its file as it was built, and what the input
/// was: what the `*_to` functions give.
#[derive(Debug)]
pub struct Written {
    /// The header written (the checksum of a whole map) and the data blocks.
    pub summary: blkmap::Summary,
    /// "raw", "qcow2", ... for images, "stream" for pipes.
    pub format: String,
    /// The file's size, if the guest size was rounded up from it.
    pub rounded: Option<Rounded>,
    /// How a compressed image was decompressed into a temporary file, if
    /// it was: for the caller to say.
    pub decompressed: Option<Decompressed>,
    /// What was read: data, zero and unallocated bytes.
    pub stats: Stats,
}

/// Where a map is written, and what must not be written over: the
/// file `path`, refused if it is one of `inputs` ([`blkmap::guard`]).
#[derive(Clone, Copy)]
pub struct Out<'a> {
    /// The map's path (written atomically).
    pub path: &'a std::path::Path,
    /// The inputs it must not replace (the image, by its names).
    pub inputs: &'a [blkmap::guard::Input<'a>],
}

/// [`map_image`] written to `out` as it is built (stdin's map if `name` is
/// "-" and `input` a stream): memory stays bounded by buffers whatever the
/// image's size, and nothing is kept of the map but its header.
///
/// ```no_run
/// let job = blkjob::Job::default();
/// let input = job.open("disk.qcow2").unwrap();
/// let out = blkjob::Out { path: "disk.map".as_ref(), inputs: &[] };
/// let name = "disk.qcow2".as_ref();
/// let done = blkjob::map_image_to(name, input, &job, job.cancel(), &mut |_| {}, out).unwrap();
/// println!("{}", done.summary.header.checksum.unwrap());
/// ```
pub fn map_image_to(
    _name: &std::ffi::OsStr,
    input: Input,
    job: &Job,
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(u64),
    out: Out<'_>,
) -> io::Result<Written> {
    let identity = match &input {
        Input::Image(src) => record::Record::of(&**src)?.identity(),
        Input::Stream(_) => None,
    };
    let builder = |file: File| {
        MapBuilder::writing(
            job.algorithm(),
            job.block_size(),
            Box::new(file),
            false,
            identity,
        )
        .map(|b| b.block_key(job.digest_key()))
    };
    blkmap::save_with(out.path, out.inputs, |file| {
        write_map(input, job, cancel, progress, builder(file)?)
    })
}

/// Hash all of `input` into `builder` (a map being written).
fn write_map(
    input: Input,
    job: &Job,
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(u64),
    builder: MapBuilder,
) -> io::Result<Written> {
    let (sink, builder) = hasher_into(job, builder)?;
    let (summary, read) = read_all(input, sink, job, cancel, progress, |sink| {
        builder.finalize_written(sink)
    })?;
    Ok(Written {
        summary,
        format: read.format,
        rounded: read.rounded,
        decompressed: read.decompressed,
        stats: read.stats,
    })
}

/// [`map`] written to an unnamed temporary file as it is built, and
/// opened where it lies: memory stays bounded by buffers whatever the
/// image's size (what blkdiff compares with a saved map, side by side).
pub fn map_to_temp(
    input: Input,
    job: &Job,
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(u64),
) -> io::Result<(blkmap::MapFile, Written)> {
    let file = temp_file("the image's map")?;
    let out = Box::new(file.try_clone()?);
    let builder = MapBuilder::writing(job.algorithm(), job.block_size(), out, false, None)?
        .block_key(job.digest_key());
    let written = write_map(input, job, cancel, progress, builder)?;
    Ok((blkmap::MapFile::from_file(file)?, written))
}

/// An unnamed temporary file (in `TMPDIR`) for `what`, its error saying
/// so: it is not the input's.
pub(crate) fn temp_file(what: &str) -> io::Result<File> {
    tempfile::tempfile().map_err(|e| {
        let dir = std::env::temp_dir();
        let msg = format!(
            "cannot create a temporary file for {what} in {}: {}",
            dir.display(),
            reason(&e)
        );
        blkimage::with_context(e, msg)
    })
}

/// A hasher for `job` observed by `builder`.
fn hasher_into(job: &Job, builder: MapBuilder) -> io::Result<(Pipeline<AlignedBuf>, MapBuilder)> {
    let mut h = Pipeline::new(job.hasher_options())?;
    h.set_observer(builder.observer());
    Ok((h, builder))
}

/// [`map_range`] written to `out` as it is built.
pub fn map_range_to(
    _name: &std::ffi::OsStr,
    src: Arc<dyn blkimage::Source>,
    range: blkmap::Range,
    job: &Job,
    progress: &mut dyn FnMut(u64),
    out: Out<'_>,
) -> io::Result<blkmap::Summary> {
    let size = src.size();
    blkmap::check_range(size, job.block_size(), range)?;
    let identity = record::Record::of(&*src)?.identity();
    let window = blkimage::Window::new(src, range.offset, range.len)?;
    let input = Input::Image(Box::new(window));
    blkmap::save_with(out.path, out.inputs, |file| {
        let builder = MapBuilder::writing(
            job.algorithm(),
            job.block_size(),
            Box::new(file),
            true,
            identity,
        )?
        .block_key(job.digest_key());
        let (sink, builder) = hasher_into(job, builder)?;
        let (part, _) = read_all(input, sink, job, job.cancel(), progress, |sink| {
            builder.finalize_written_part(sink, size, range.offset)
        })?;
        Ok(part)
    })
}

/// A saved map opened where it lies ([`blkmap::MapFile`]), if `name` is
/// a regular file that starts with the map magic: its header and runs
/// read, its digests left in the file, for a reader that streams it (a
/// diff) or looks up a few blocks (an update), and "map". A Proxmox Backup
/// Server fixed index (`.fidx`) is opened as the map of the disk it backed
/// up ([`open_index`]), and "fidx". `None` if it is something else (an
/// image, a device, a URL).
pub fn try_open_map(
    name: impl AsRef<std::path::Path>,
    open: &blkimage::OpenOptions,
) -> io::Result<Option<(blkmap::MapFile, &'static str)>> {
    let name = name.as_ref();
    match prefix_of(name)? {
        Some(p) if blkmap::is_fidx(&p) => Ok(Some((open_index(name, open)?, "fidx"))),
        Some(p) if blkmap::is_map(&p) => Ok(Some((blkmap::MapFile::open(name)?, "map"))),
        _ => Ok(None),
    }
}

/// The Proxmox Backup Server fixed index `name` as the map of the disk it
/// backed up (sha256, blocks of its chunk size): streamed into an unnamed
/// temporary file (32 bytes a chunk, 16 MiB for a 2 TiB disk in 4 MiB
/// chunks) and opened there, its `index_csum` checked on the way; never
/// held in memory. An encrypted backup's digests are keyed: the key of
/// `open.keyfile` is checked against the manifest first ([`index_key`]),
/// and the images compared with it are hashed with it.
pub fn open_index(
    name: &std::path::Path,
    open: &blkimage::OpenOptions,
) -> io::Result<blkmap::MapFile> {
    index_key(name, open)?;
    let reader = blkmap::open_fidx(name)?;
    let out = temp_file("the index's map")?;
    Ok(blkmap::fidx_map_file(reader, out)?)
}

/// The first 8 bytes of `name` if it is a regular file (never a FIFO or a
/// device, which reading would consume or block on).
fn prefix_of(name: &std::path::Path) -> io::Result<Option<Vec<u8>>> {
    let Ok(meta) = std::fs::metadata(name) else {
        return Ok(None);
    };
    if !meta.is_file() {
        return Ok(None);
    }
    let mut prefix = Vec::with_capacity(8);
    File::open(name)?.take(8).read_to_end(&mut prefix)?;
    Ok(Some(prefix))
}

/// Standard input's map, in an unnamed temporary file and read there
/// where it lies ([`map_stdin`]): memory stays bounded whatever its size.
pub enum StdinMap {
    /// A saved map ("map") or a PBS fixed index ("fidx") piped in, and
    /// which: the map's bytes copied, the index made a map on the way.
    Saved(blkmap::MapFile, &'static str),
    /// A stream hashed by the job, as [`map_to_temp`] writes it (boxed:
    /// what was read is far larger than the other variant).
    Written(blkmap::MapFile, Box<Written>),
}

/// Standard input not taken as a map: the stream, its first bytes put back.
pub type StdinStream = Box<dyn Read + Send>;

/// Standard input as a saved map or a PBS fixed index (probed by its
/// first bytes, the index made a map on the way), in an unnamed temporary
/// file; or, if it is neither, the stream to hash (its first bytes put
/// back). A caller that takes the digest and block size from the saved
/// maps reads standard input so first: an index piped in says its chunk
/// size as one named does.
///
/// An index piped in has no manifest beside it to check a key against:
/// the key of `open.keyfile`, if named, is taken as its backup's.
pub fn stdin_saved(
    open: &blkimage::OpenOptions,
) -> io::Result<Result<(blkmap::MapFile, &'static str), StdinStream>> {
    let mut stdin = io::stdin();
    let mut prefix = Vec::with_capacity(8);
    (&mut stdin).take(8).read_to_end(&mut prefix)?;
    let mut rest = io::Cursor::new(prefix.clone()).chain(stdin);
    if blkmap::is_fidx(&prefix) {
        if let Some(path) = &open.keyfile {
            blkimage::pbs::load_key(path, open)?;
        }
        let reader = blkmap::FidxReader::new(io::BufReader::with_capacity(1 << 20, rest))?;
        let out = temp_file("the index's map")?;
        return Ok(Ok((blkmap::fidx_map_file(reader, out)?, "fidx")));
    }
    if blkmap::is_map(&prefix) {
        let mut file = temp_file("the map read from standard input")?;
        io::copy(&mut rest, &mut file)?;
        return Ok(Ok((blkmap::MapFile::from_file(file)?, "map")));
    }
    Ok(Err(Box::new(rest)))
}

/// Standard input's map: if `detect_map`, a saved map or a PBS fixed
/// index as it is (probed by its first bytes, [`stdin_saved`]), else the
/// stream hashed by `job`; written to an unnamed temporary file either
/// way, never held in memory.
pub fn map_stdin(
    job: &Job,
    detect_map: bool,
    progress: &mut dyn FnMut(u64),
) -> io::Result<StdinMap> {
    let stream: Box<dyn Read + Send> = match detect_map {
        true => match stdin_saved(job.open_options())? {
            Ok((map, format)) => return Ok(StdinMap::Saved(map, format)),
            Err(stream) => stream,
        },
        false => Box::new(io::stdin()),
    };
    let (map, written) = map_to_temp(Input::Stream(stream), job, job.cancel(), progress)?;
    Ok(StdinMap::Written(map, Box::new(written)))
}

/// An I/O error's reason as the front ends print it: without Rust's
/// " (os error N)" suffix. The command layer adds its flags where one
/// helps; the library names none.
///
/// ```
/// let e = std::io::Error::from_raw_os_error(2);
/// assert_eq!(blkjob::reason(&e), "No such file or directory");
/// ```
pub fn reason(e: &io::Error) -> String {
    let s = e.to_string();
    match s.rsplit_once(" (os error ") {
        Some((msg, _)) => msg.to_string(),
        None => s,
    }
}
