//! What the `blkmap`, `blkdiff` and `blksync` commands share: their input
//! options, opening an input (an image blkimage reads, or a saved map) and
//! hashing it into a block map.

pub mod state;

use blkhash::{Algorithm, BlockEvent, MAX_THREADS, Options, Pipeline};
use blkimage::{AlignedBuf, Input, OpenOptions, Source};
use blkmap::{Map, MapBuilder};
use std::fs::File;
use std::io::{self, Read};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

pub use blkimage::units::{parse_block_size, reason};

/// How the commands hash their inputs, as each takes it on the command line.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct InputArgs {
    /// Digest, by its OpenSSL name, not null [default: a saved map's, else sha256].
    #[arg(short, long, value_name = "NAME", value_parser = parse_digest)]
    pub digest: Option<Algorithm>,

    /// Block size: a multiple of 512 from 512 to 64m (suffixes k, m)
    /// [default: a saved map's, else 64k].
    #[arg(long, value_name = "SIZE", value_parser = parse_block_size)]
    pub block_size: Option<usize>,

    /// Digest threads [default: the number of cores].
    #[arg(short, long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=MAX_THREADS as i64))]
    pub threads: Option<u16>,

    /// Image format: raw or qcow2 (or another QEMU reads) [default: probed].
    #[arg(short, long, value_name = "FORMAT", value_parser = parse_format)]
    pub format: Option<blkimage::Format>,

    /// Refuse images that refer to other files (qcow2 backing and data files).
    #[arg(long)]
    pub no_backing: bool,

    /// LUKS images: the file that holds the passphrase, its bytes as they
    /// are (as QEMU's `--object secret,file=FILE` reads them).
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<std::path::PathBuf>,

    /// Read images even while another process has them open for writing
    /// (QEMU's image locks ignored, as qemu-img's -U) [default: "in use"].
    #[arg(short = 'U', long)]
    pub force_share: bool,

    /// Use the page cache (default: direct I/O where possible).
    #[arg(long)]
    pub cache: bool,

    /// NBD: seconds a handshake step or a reply may take (trickled or
    /// silent), and a request may wait for its reply to begin, before the
    /// input or DST fails (also the connect timeout) [default: no limit].
    #[arg(long, value_name = "SECONDS", value_parser = blkimage::units::parse_timeout)]
    pub timeout: Option<std::time::Duration>,

    /// NBD over TLS (nbds://, nbds+unix://): the directory with ca-cert.pem
    /// (and client-cert.pem, client-key.pem), when the URL has no
    /// tls-certificates=DIR [default: the system's CAs].
    #[arg(long, value_name = "DIR")]
    pub tls_certificates: Option<std::path::PathBuf>,
}

impl InputArgs {
    /// The digest and block size: asked for, else `map`'s, else the defaults.
    pub fn params(&self, map: Option<&Map>) -> (Algorithm, usize) {
        let algorithm = self
            .digest
            .or(map.map(Map::algorithm))
            .unwrap_or(Algorithm::Sha256);
        let block_size = self
            .block_size
            .or(map.map(Map::block_size))
            .unwrap_or(blkhash::DEFAULT_BLOCK_SIZE);
        (algorithm, block_size)
    }

    /// Options to hash with `algorithm` and `block_size`.
    pub fn map_options(&self, algorithm: Algorithm, block_size: usize) -> MapOptions {
        MapOptions {
            algorithm,
            block_size,
            threads: self
                .threads
                .map_or_else(blkhash::default_threads, usize::from),
            open: OpenOptions {
                cache: self.cache,
                format: self.format,
                no_backing: self.no_backing,
                secret_file: self.secret_file.clone(),
                force_share: self.force_share,
                nbd: self.nbd_options(),
            },
            ..MapOptions::default()
        }
    }

    /// How to connect to NBD servers.
    pub fn nbd_options(&self) -> blkimage::nbd::NbdOptions {
        blkimage::nbd::NbdOptions {
            timeout: self.timeout,
            tls_certificates: self.tls_certificates.clone(),
            ..Default::default()
        }
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
    pub algorithm: Algorithm,
    pub block_size: usize,
    pub threads: usize,
    /// Bytes per read, before rounding up to whole blocks.
    pub read_size: usize,
    pub open: OpenOptions,
    /// Set by Ctrl-C or SIGTERM: hashing stops with an "interrupted" error.
    pub cancel: Arc<AtomicBool>,
}

impl Default for MapOptions {
    fn default() -> Self {
        MapOptions {
            algorithm: Algorithm::Sha256,
            block_size: blkhash::DEFAULT_BLOCK_SIZE,
            threads: blkhash::default_threads(),
            read_size: 1 << 20,
            open: OpenOptions::default(),
            cancel: Arc::default(),
        }
    }
}

/// A map of an input, and what the input was.
pub struct Mapped {
    pub map: Map,
    /// "raw", "qcow2", ... for images, "stream" for pipes, "map" for a saved map.
    pub format: String,
}

impl Mapped {
    pub fn is_saved_map(&self) -> bool {
        self.format == "map"
    }
}

/// Hash the input `name` (any input blksum reads) into a map.
pub fn map_image(name: impl AsRef<std::ffi::OsStr>, opts: &MapOptions) -> io::Result<Mapped> {
    let input = blkimage::open(name, &opts.open)?;
    map_input(input, opts)
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
        .threads(opts.threads);
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
    let (mut sink, builder) = hasher(opts)?;
    let read_size = opts.read_size.next_multiple_of(opts.block_size);
    match input {
        Input::Image(src) => {
            let src: Arc<dyn Source> = Arc::from(src);
            blkimage::read_image(src.clone(), &mut sink, read_size, cancel, &mut |_| {})?;
            let map = builder.finalize(sink)?;
            // Only now are all reads done: is the image still what we read?
            src.finish()?;
            Ok(Mapped {
                map,
                format: src.format().to_string(),
            })
        }
        Input::Stream(mut r) => {
            blkimage::read_stream(&mut r, &mut sink, read_size, cancel, &mut |_| {})?;
            Ok(Mapped {
                map: builder.finalize(sink)?,
                format: "stream".to_string(),
            })
        }
    }
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
        });
    }
    map_input(Input::Stream(Box::new(rest)), opts)
}

/// A digest name; `null` is refused (it computes no block digests).
pub fn parse_digest(s: &str) -> Result<Algorithm, String> {
    let a: Algorithm = s
        .parse()
        .map_err(|e: blkhash::UnknownAlgorithm| e.to_string())?;
    if a.output_len() == 0 {
        return Err(format!("digest {a} computes no block digests"));
    }
    Ok(a)
}

/// An image format name.
pub fn parse_format(s: &str) -> Result<blkimage::Format, String> {
    s.parse()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(parse_digest("BLAKE3"), Ok(Algorithm::Blake3));
        assert!(parse_digest("null").is_err());
    }
}
