//! What the `blkmap`, `blkdiff` and `blksync` commands share: their input
//! options, opening an input (an image blkimage reads, or a saved map) and
//! hashing it into a block map.

// Every public item says what it is (cargo doc is part of the API).
#![warn(missing_docs)]

pub mod checkpoint;
pub mod record;
pub mod state;
pub mod sync;

use blkhash::{Algorithm, BlockEvent, Options, Pipeline};
use blkimage::{AlignedBuf, Input, OpenOptions};
use blkmap::{Map, MapBuilder, Part};
use std::fs::File;
use std::io::{self, Read};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

pub use blkcli::args::{InputArgs, parse_format};
pub use blkcli::units::reason;

/// Parse the command line of a command that makes maps: as `A::parse`, and
/// a digest that computes no block digests (`null`) is a usage error, since
/// its map would say nothing.
pub fn parse_args<A: clap::Parser>(input: impl Fn(&A) -> &InputArgs) -> A {
    let args = A::parse();
    if let Some(a) = input(&args).digest.filter(|a| a.output_len() == 0) {
        A::command()
            .error(
                clap::error::ErrorKind::InvalidValue,
                format!("invalid value '{a}' for '--digest <NAME>': digest {a} computes no block digests"),
            )
            .exit();
    }
    args
}

/// The digest and block size: asked for, else `map`'s, else the defaults.
pub fn map_params(input: &InputArgs, map: Option<&Map>) -> (Algorithm, usize) {
    input.params(map.map(|m| (m.algorithm(), m.block_size())))
}

/// Options to hash with `algorithm` and `block_size`, and the rest as asked.
pub fn map_options(input: &InputArgs, algorithm: Algorithm, block_size: usize) -> MapOptions {
    MapOptions {
        algorithm,
        block_size,
        threads: input.threads(),
        read_size: input.read_size(),
        queue_depth: input.queue_depth(),
        io_depth: input.io_depth(),
        open: input.open_options(),
        ..MapOptions::default()
    }
}

/// Why `map` cannot be compared with images hashed with `algorithm` and
/// `block_size`, if it cannot.
pub fn map_mismatch(map: &Map, algorithm: Algorithm, block_size: usize) -> Option<String> {
    (map.algorithm() != algorithm || map.block_size() != block_size).then(|| {
        format!(
            "a map of {} digests of {}-byte blocks, not {algorithm} of {block_size}-byte blocks",
            map.algorithm(),
            map.block_size()
        )
    })
}

/// How to hash inputs into maps.
#[derive(Clone, Debug)]
pub struct MapOptions {
    /// The digest of the blocks and of the checksum.
    pub algorithm: Algorithm,
    /// Bytes per block.
    pub block_size: usize,
    /// Digest threads.
    pub threads: usize,
    /// Bytes per read, before rounding up to whole blocks.
    pub read_size: usize,
    /// Jobs queued ahead of the digest workers.
    pub queue_depth: usize,
    /// Reads in flight apart from the digest threads (None: the reader's default).
    pub io_depth: Option<usize>,
    /// How images are opened (format, cache, NBD options...).
    pub open: OpenOptions,
    /// Set by Ctrl-C or SIGTERM: hashing stops with an "interrupted" error.
    pub cancel: Arc<AtomicBool>,
    /// Where `map_image` and `map_stdin` show their progress (`-p`).
    pub progress: Option<Arc<blkcli::progress::Progress>>,
}

impl Default for MapOptions {
    fn default() -> Self {
        MapOptions {
            algorithm: Algorithm::Sha256,
            block_size: blkhash::DEFAULT_BLOCK_SIZE,
            threads: blkhash::default_threads(),
            read_size: blkcli::args::DEFAULT_READ_SIZE,
            queue_depth: blkcli::args::DEFAULT_QUEUE_DEPTH.into(),
            io_depth: None,
            open: OpenOptions::default(),
            cancel: Arc::default(),
            progress: None,
        }
    }
}

/// A map of an input, and what the input was.
pub struct Mapped {
    /// The block map.
    pub map: Map,
    /// "raw", "qcow2", ... for images, "stream" for pipes, "map" for a saved map.
    pub format: String,
    /// The file's size, if the guest size was rounded up from it (a raw
    /// file whose length is not a multiple of 512): for the command to say.
    pub rounded: Option<blkimage::Rounded>,
}

impl Mapped {
    /// True if the input was a saved map, not an image read now.
    pub fn is_saved_map(&self) -> bool {
        self.format == "map"
    }
}

/// Hash the input `name` (any input blksum reads) into a map.
pub fn map_image(name: impl AsRef<std::ffi::OsStr>, opts: &MapOptions) -> io::Result<Mapped> {
    let name = name.as_ref();
    let input = blkimage::open(name, &opts.open)?;
    map_shown(input, opts, &opts.cancel, &name.to_string_lossy())
}

/// A hasher for `opts` with a map builder observing it.
pub fn hasher(opts: &MapOptions) -> io::Result<(Pipeline<AlignedBuf>, MapBuilder)> {
    hasher_also(opts, |_| {})
}

/// A hasher for `opts` with a map builder observing it, and `also` seeing
/// every block event first, in block order.
pub fn hasher_also(
    opts: &MapOptions,
    mut also: impl FnMut(BlockEvent<'_>) + Send + 'static,
) -> io::Result<(Pipeline<AlignedBuf>, MapBuilder)> {
    let hopts = Options::new()
        .algorithm(opts.algorithm)
        .block_size(opts.block_size)
        .threads(opts.threads)
        .queue_depth(opts.queue_depth);
    let mut h = Pipeline::new(hopts).map_err(io::Error::other)?;
    let builder = MapBuilder::new(opts.algorithm, opts.block_size)?;
    let mut build = builder.observer();
    h.set_observer(move |e| {
        also(e);
        build(e);
    });
    Ok((h, builder))
}

/// Hash an opened input into a map.
pub fn map_input(input: Input, opts: &MapOptions) -> io::Result<Mapped> {
    map_input_until(input, opts, &opts.cancel)
}

/// Hash an opened input into a map; stop with an error once `cancel` is set.
pub fn map_input_until(input: Input, opts: &MapOptions, cancel: &AtomicBool) -> io::Result<Mapped> {
    map_shown(input, opts, cancel, "")
}

/// [`map_input_until`], showing progress under `name` when `opts` asks.
fn map_shown(
    input: Input,
    opts: &MapOptions,
    cancel: &AtomicBool,
    name: &str,
) -> io::Result<Mapped> {
    let (sink, builder, read, shown) = hash_shown(input, opts, cancel, name)?;
    let map = builder.finalize(sink)?;
    // Only now are all reads done: is the image still what we read?
    read.finish()?;
    if let Some(mut shown) = shown {
        shown.finish();
    }
    Ok(Mapped {
        map,
        format: read.format,
        rounded: read.rounded,
    })
}

/// What [`hash_shown`] leaves to finish: the hasher, the map builder, the
/// input read, and its progress (finished once all is checked).
type Hashed<'a> = (
    Pipeline<AlignedBuf>,
    MapBuilder,
    blkimage::InputRead,
    Option<blkcli::progress::InputProgress<'a>>,
);

/// Read `input` into a hasher with a map builder, showing progress under
/// `name` when `opts` asks; the caller finalizes them, then the input, then
/// the progress.
fn hash_shown<'a>(
    input: Input,
    opts: &'a MapOptions,
    cancel: &AtomicBool,
    name: &str,
) -> io::Result<Hashed<'a>> {
    let (mut sink, builder) = hasher(opts)?;
    let read_size = opts.read_size.next_multiple_of(opts.block_size);
    let size = input.size();
    let mut shown = opts
        .progress
        .as_ref()
        .filter(|_| !name.is_empty())
        .map(|p| p.start(name, size));
    let mut progress = |n| {
        if let Some(s) = &mut shown {
            s.inc(n)
        }
    };
    let read = blkimage::read_input(
        input,
        &mut sink,
        read_size,
        opts.io_depth,
        cancel,
        &mut progress,
    )?;
    Ok((sink, builder, read, shown))
}

/// The image of `input` as a source that can be read in ranges; a stream
/// cannot: `what` says what was asked of it.
pub fn seekable(input: Input, what: &str) -> io::Result<Arc<dyn blkimage::Source>> {
    match input {
        Input::Image(src) => Ok(Arc::from(src)),
        Input::Stream(_) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} needs an image that can seek, not a pipe or standard input"),
        )),
    }
}

/// Hash the bytes `range` of `src` into a part of its map (see
/// [`blkmap::merge`]), showing progress under `name` when `opts` asks. The
/// range starts at a block boundary and ends at one or at the image's end.
///
/// ```no_run
/// use blkmap::Range;
/// let opts = blktools::MapOptions::default();
/// let input = blkimage::open("disk.qcow2", &opts.open).unwrap();
/// let src = blktools::seekable(input, "a range").unwrap();
/// let half = (src.size() / 2).next_multiple_of(opts.block_size as u64).min(src.size());
/// let first = blktools::map_range(src.clone(), Range { offset: 0, len: half }, &opts, "").unwrap();
/// let rest = Range { offset: half, len: src.size() - half };
/// let second = blktools::map_range(src, rest, &opts, "").unwrap();
/// first.save("disk.0.part").unwrap();
/// second.save("disk.1.part").unwrap();
/// let map = blkmap::merge_files(&["disk.1.part", "disk.0.part"], Some("disk.map".as_ref())).unwrap();
/// println!("{}", blkhash::to_hex(map.checksum.as_deref().unwrap()));
/// ```
pub fn map_range(
    src: Arc<dyn blkimage::Source>,
    range: blkmap::Range,
    opts: &MapOptions,
    name: &str,
) -> io::Result<Part> {
    let size = src.size();
    blkmap::check_range(size, opts.block_size, range)?;
    let window = blkimage::Window::new(src, range.offset, range.len)?;
    let input = Input::Image(Box::new(window));
    let (sink, builder, read, shown) = hash_shown(input, opts, &opts.cancel, name)?;
    let part = builder.finalize_part(sink, size, range.offset)?;
    read.finish()?;
    if let Some(mut shown) = shown {
        shown.finish();
    }
    Ok(part)
}

/// A saved map, if `name` is a regular file that starts with the map
/// magic; `None` if it is something else (an image, a device, a URL).
pub fn try_load_map(name: impl AsRef<std::path::Path>) -> io::Result<Option<Map>> {
    let name = name.as_ref();
    let Ok(meta) = std::fs::metadata(name) else {
        return Ok(None);
    };
    if !meta.is_file() {
        return Ok(None);
    }
    let mut prefix = Vec::with_capacity(8);
    File::open(name)?.take(8).read_to_end(&mut prefix)?;
    if !blkmap::is_map(&prefix) {
        return Ok(None);
    }
    Ok(Some(Map::load(name)?))
}

/// Standard input: a saved map if it starts with the map magic, else a
/// stream hashed with `opts`.
pub fn map_stdin(opts: &MapOptions, detect_map: bool) -> io::Result<Mapped> {
    let mut stdin = io::stdin();
    let mut prefix = Vec::with_capacity(8);
    (&mut stdin).take(8).read_to_end(&mut prefix)?;
    let rest = io::Cursor::new(prefix.clone()).chain(stdin);
    if detect_map && blkmap::is_map(&prefix) {
        return Ok(Mapped {
            map: Map::read(io::BufReader::with_capacity(1 << 20, rest))?,
            format: "map".to_string(),
            rounded: None,
        });
    }
    map_shown(Input::Stream(Box::new(rest)), opts, &opts.cancel, "-")
}
