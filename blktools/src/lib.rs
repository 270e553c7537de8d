//! What the `blkmap` and `blkdiff` commands share: opening an input (an
//! image blkimage reads, or a saved map), hashing it into a block map, and
//! parsing sizes.

use blkhash::{Algorithm, Hasher, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE, Options};
use blkimage::{AlignedBuf, Input, OpenOptions, Source};
use blkmap::{Map, MapBuilder};
use std::fs::File;
use std::io::{self, Read};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// How to hash inputs into maps.
#[derive(Clone, Debug)]
pub struct MapOptions {
    pub algorithm: Algorithm,
    pub block_size: usize,
    pub threads: usize,
    /// Bytes per read, before rounding up to whole blocks.
    pub read_size: usize,
    pub open: OpenOptions,
}

impl Default for MapOptions {
    fn default() -> Self {
        MapOptions {
            algorithm: Algorithm::Sha256,
            block_size: blkhash::DEFAULT_BLOCK_SIZE,
            threads: blkhash::default_threads(),
            read_size: 1 << 20,
            open: OpenOptions::default(),
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
pub fn map_image(name: &str, opts: &MapOptions) -> io::Result<Mapped> {
    let input = blkimage::open(name, &opts.open)?;
    map_input(input, opts)
}

fn hasher(opts: &MapOptions) -> io::Result<(Hasher<AlignedBuf>, MapBuilder)> {
    let hopts = Options::new()
        .algorithm(opts.algorithm)
        .block_size(opts.block_size)
        .threads(opts.threads);
    let mut h = Hasher::with_buffers(hopts).map_err(io::Error::other)?;
    let builder = MapBuilder::attach(&mut h)?;
    Ok((h, builder))
}

/// Hash an opened input into a map.
pub fn map_input(input: Input, opts: &MapOptions) -> io::Result<Mapped> {
    let (mut sink, builder) = hasher(opts)?;
    let read_size = opts.read_size.next_multiple_of(opts.block_size);
    let cancel = AtomicBool::new(false);
    match input {
        Input::Image(src) => {
            let src: Arc<dyn Source> = Arc::from(src);
            blkimage::read_image(src.clone(), &mut sink, read_size, &cancel, &mut |_| {})?;
            let map = builder.finalize(sink)?;
            // Only now are all reads done: is the image still what we read?
            src.finish()?;
            Ok(Mapped {
                map,
                format: src.format().to_string(),
            })
        }
        Input::Stream(mut r) => {
            blkimage::read_stream(&mut r, &mut sink, read_size, &cancel, &mut |_| {})?;
            Ok(Mapped {
                map: builder.finalize(sink)?,
                format: "stream".to_string(),
            })
        }
    }
}

/// A saved map, if `name` is a regular file that starts with the map
/// magic; `None` if it is something else (an image, a device, a URL).
pub fn try_load_map(name: &str) -> io::Result<Option<Map>> {
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

/// A size with an optional suffix k, m or g (powers of 1024), as blksum
/// takes it.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let num: u64 = num.parse().map_err(|_| format!("invalid size '{s}'"))?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        _ => return Err(format!("invalid size suffix in '{s}' (use k, m or g)")),
    };
    num.checked_mul(1 << shift)
        .ok_or_else(|| format!("size '{s}' too large"))
}

/// A block size: a multiple of 512 from 512 to 64m.
pub fn parse_block_size(s: &str) -> Result<usize, String> {
    let n = parse_size(s)?;
    if n % 512 != 0 || !(MIN_BLOCK_SIZE as u64..=MAX_BLOCK_SIZE as u64).contains(&n) {
        return Err(format!(
            "block size must be a multiple of 512 from 512 to 64m, not {n}"
        ));
    }
    Ok(n as usize)
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

/// A name as sha256sum prints it: a name holding a backslash, newline or
/// carriage return is escaped, and the line then starts with a backslash.
pub fn checksum_line(checksum: &str, name: &str) -> String {
    if name.contains(['\\', '\n', '\r']) {
        let escaped = name
            .replace('\\', "\\\\")
            .replace('\n', "\\n")
            .replace('\r', "\\r");
        format!("\\{checksum}  {escaped}")
    } else {
        format!("{checksum}  {name}")
    }
}

/// An error's message without Rust's "(os error N)" noise.
pub fn reason(e: &io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_names() {
        assert_eq!(parse_size("64k"), Ok(65536));
        assert_eq!(parse_block_size("4KiB"), Ok(4096));
        assert!(parse_block_size("1000").is_err());
        assert!(parse_block_size("128m").is_err());
        assert!(parse_size("99999999999g").is_err());
        assert_eq!(parse_digest("BLAKE3"), Ok(Algorithm::Blake3));
        assert!(parse_digest("null").is_err());
        assert_eq!(checksum_line("ab", "x"), "ab  x");
        assert_eq!(checksum_line("ab", "a\\b\nc"), "\\ab  a\\\\b\\nc");
    }
}
