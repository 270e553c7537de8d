//! blksync: bring a raw copy of an image up to date by writing only the
//! blocks that differ.

use blkhash::{Algorithm, MAX_THREADS};
use blkimage::{Input, Source};
use blkmap::{Block, Map};
use blktools::{MapOptions, parse_block_size, parse_digest, parse_format, reason};
use clap::Parser;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

/// Make DST (a raw file or block device) hold SRC's guest content, writing
/// only the blocks that differ, and print SRC's checksum.
///
/// SRC is any image blksum reads (not a pipe). DST's blocks are found from
/// its state map (--state, written by the last blksync or by blkmap) or by
/// hashing DST. A regular file DST is created if missing, resized to SRC's
/// size, and blocks that became zeros are punched out (holes). With
/// --state, the state is removed before DST is written and the new one
/// saved once DST is flushed: an interrupted run leaves no stale state.
#[derive(Parser, Debug)]
#[command(name = "blksync", version, about, max_term_width = 100)]
struct Args {
    /// The image to copy from.
    #[arg(value_name = "SRC")]
    src: String,

    /// The raw file or block device to bring up to date.
    #[arg(value_name = "DST")]
    dst: String,

    /// DST's block map: used instead of hashing DST if it exists, and
    /// replaced by SRC's map after the copy.
    #[arg(long, value_name = "MAP")]
    state: Option<String>,

    /// Digest [default: the state's, else sha256].
    #[arg(short, long, value_name = "NAME", value_parser = parse_digest)]
    digest: Option<Algorithm>,

    /// Block size [default: the state's, else 64k].
    #[arg(long, value_name = "SIZE", value_parser = parse_block_size)]
    block_size: Option<usize>,

    /// Digest threads [default: the number of cores].
    #[arg(short, long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=MAX_THREADS as i64))]
    threads: Option<u16>,

    /// SRC's format: raw or qcow2 [default: probed].
    #[arg(short, long, value_name = "FORMAT", value_parser = parse_format)]
    format: Option<blkimage::Format>,

    /// Refuse a SRC that refers to other files (qcow2 backing and data files).
    #[arg(long)]
    no_backing: bool,

    /// Read SRC through the page cache.
    #[arg(long)]
    cache: bool,

    /// Say what would be written; write nothing.
    #[arg(short = 'n', long)]
    dry_run: bool,

    /// After the copy, hash DST again and check it has SRC's checksum.
    #[arg(long)]
    verify: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("blksync: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Default)]
struct Counts {
    written: u64,
    zeroed: u64,
    ranges: u64,
}

fn err(name: &str, e: impl std::fmt::Display) -> String {
    format!("{name}: {e}")
}

fn ioerr(name: &str, e: &io::Error) -> String {
    err(name, reason(e))
}

fn run(args: &Args) -> Result<(), String> {
    // The state first: it says how to hash.
    let state = match &args.state {
        Some(p) if Path::new(p).exists() => {
            Some(Map::load(p).map_err(|e| err(p, format!("state refused: {e}")))?)
        }
        _ => None,
    };
    let algorithm = args
        .digest
        .or(state.as_ref().map(Map::algorithm))
        .unwrap_or(Algorithm::Sha256);
    let block_size = args
        .block_size
        .or(state.as_ref().map(Map::block_size))
        .unwrap_or(blkhash::DEFAULT_BLOCK_SIZE);
    let opts = MapOptions {
        algorithm,
        block_size,
        threads: args
            .threads
            .map_or_else(blkhash::default_threads, usize::from),
        open: blkimage::OpenOptions {
            cache: args.cache,
            format: args.format,
            no_backing: args.no_backing,
            ..Default::default()
        },
        ..MapOptions::default()
    };
    if let (Some(m), Some(p)) = (&state, &args.state)
        && (m.algorithm() != algorithm || m.block_size() != block_size)
    {
        return Err(err(
            p,
            format!(
                "state refused: a map of {} digests of {}-byte blocks, not {algorithm} of {block_size}-byte blocks",
                m.algorithm(),
                m.block_size()
            ),
        ));
    }

    // SRC: random access, kept open for the copy.
    let src: Arc<dyn Source> = match blkimage::open(&args.src, &opts.open) {
        Ok(Input::Image(s)) => Arc::from(s),
        Ok(Input::Stream(_)) => {
            return Err(err(&args.src, "a stream: blksync needs random access"));
        }
        Err(e) => return Err(ioerr(&args.src, &e)),
    };

    // DST: a raw file (created if missing) or a block device.
    let dst_path = Path::new(&args.dst);
    let is_block = match std::fs::metadata(dst_path) {
        Ok(m) if m.file_type().is_block_device() => true,
        Ok(m) if m.is_file() => false,
        Ok(_) => return Err(err(&args.dst, "not a regular file or block device")),
        Err(e) if e.kind() == io::ErrorKind::NotFound && !args.dry_run => {
            File::create_new(dst_path).map_err(|e| ioerr(&args.dst, &e))?;
            false
        }
        Err(e) => return Err(ioerr(&args.dst, &e)),
    };
    let dst_open = blkimage::OpenOptions {
        cache: true,
        format: Some(blkimage::Format::Raw),
        ..Default::default()
    };
    let dst_size = match blkimage::open(&args.dst, &dst_open) {
        Ok(Input::Image(s)) => s.size(),
        Ok(Input::Stream(_)) => return Err(err(&args.dst, "not a file")),
        Err(e) => return Err(ioerr(&args.dst, &e)),
    };
    if let (Some(m), Some(p)) = (&state, &args.state)
        && m.size() != dst_size
    {
        return Err(err(
            p,
            format!(
                "state refused: it is of a {}-byte image and {} is {dst_size} bytes: not its state \
                 (remove it to hash {} instead)",
                m.size(),
                args.dst,
                args.dst
            ),
        ));
    }

    // Both maps: SRC hashed; DST from its state, else hashed (both at once).
    let (src_map, dst_map) = std::thread::scope(|s| {
        let hs =
            s.spawn(|| blktools::map_input(Input::Image(Box::new(ArcSource(src.clone()))), &opts));
        let dst_map = match state {
            Some(m) => Ok(m),
            None => {
                let o = MapOptions {
                    open: dst_open.clone(),
                    ..opts.clone()
                };
                blktools::map_image(&args.dst, &o).map(|m| m.map)
            }
        };
        (hs.join().expect("hashing thread"), dst_map)
    });
    let src_map = src_map.map_err(|e| ioerr(&args.src, &e))?.map;
    let dst_map = dst_map.map_err(|e| ioerr(&args.dst, &e))?;
    let d = blkmap::diff(&dst_map, &src_map).map_err(|e| e.to_string())?;

    let size = src_map.size();
    if is_block && dst_size != size {
        return Err(err(
            &args.dst,
            format!("a block device of {dst_size} bytes, SRC is {size}: sizes must match"),
        ));
    }
    // What to write: the differing ranges, and SRC's data past DST's end
    // (a file grows with a hole, which reads as zeros).
    let mut todo = d.ranges.clone();
    if size > dst_size {
        let bs = block_size as u64;
        let first = dst_size / bs;
        for b in first..src_map.blocks() {
            if let Some(Block::Data(_)) = src_map.block(b) {
                let offset = (b * bs).max(dst_size);
                let end = ((b + 1) * bs).min(size);
                match todo.last_mut() {
                    Some(r) if r.end() >= offset => r.len = end - r.offset,
                    _ => todo.push(blkmap::Range {
                        offset,
                        len: end - offset,
                    }),
                }
            }
        }
    }
    if args.dry_run {
        for r in &todo {
            println!("{r}");
        }
        if size != dst_size {
            println!("resize {dst_size} -> {size}");
        }
        return Ok(());
    }

    // No state while DST is being written: a crash must not leave one that
    // describes neither the old content nor the new.
    if let Some(p) = &args.state {
        match std::fs::remove_file(p) {
            Ok(()) => sync_dir(Path::new(p)).map_err(|e| ioerr(p, &e))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(ioerr(p, &e)),
        }
    }
    let dst = OpenOptions::new()
        .write(true)
        .open(dst_path)
        .map_err(|e| ioerr(&args.dst, &e))?;
    if !is_block && size != dst_size {
        dst.set_len(size).map_err(|e| ioerr(&args.dst, &e))?;
    }
    let mut counts = Counts::default();
    copy(&*src, &src_map, &dst, &todo, is_block, &mut counts)
        .map_err(|e| format!("{} -> {}: {}", args.src, args.dst, reason(&e)))?;
    dst.sync_all().map_err(|e| ioerr(&args.dst, &e))?;
    src.finish().map_err(|e| ioerr(&args.src, &e))?;

    if args.verify {
        let o = MapOptions {
            open: dst_open.clone(),
            ..opts.clone()
        };
        let again = blktools::map_image(&args.dst, &o).map_err(|e| ioerr(&args.dst, &e))?;
        if again.map.checksum() != src_map.checksum() {
            return Err(err(
                &args.dst,
                "verification failed: checksum differs from SRC's",
            ));
        }
    }
    if let Some(p) = &args.state {
        src_map.save(p).map_err(|e| ioerr(p, &e))?;
    }
    eprintln!(
        "blksync: {} -> {}: {} bytes written, {} zeroed, in {} ranges, of {size}",
        args.src, args.dst, counts.written, counts.zeroed, counts.ranges
    );
    println!(
        "{}",
        blktools::checksum_line(&src_map.checksum_hex(), &args.src)
    );
    Ok(())
}

/// Copy `ranges` from `src` to `dst`: data blocks read and written, zero
/// blocks punched out (files) or written as zeros (devices).
fn copy(
    src: &dyn Source,
    map: &Map,
    dst: &File,
    ranges: &[blkmap::Range],
    is_block: bool,
    counts: &mut Counts,
) -> io::Result<()> {
    const CHUNK: u64 = 1 << 20;
    let bs = map.block_size() as u64;
    let mut buf = vec![0u8; CHUNK.max(bs) as usize];
    for r in ranges {
        counts.ranges += 1;
        let mut pos = r.offset;
        while pos < r.end() {
            // A stretch of blocks of one kind, at most a chunk.
            let zero = map.block(pos / bs) == Some(Block::Zero);
            let mut end = ((pos / bs + 1) * bs).min(r.end());
            while end < r.end()
                && end - pos < CHUNK
                && (map.block(end / bs) == Some(Block::Zero)) == zero
            {
                end = ((end / bs + 1) * bs).min(r.end());
            }
            let n = (end - pos) as usize;
            if zero {
                zero_range(dst, pos, n as u64, is_block, &mut buf)?;
                counts.zeroed += n as u64;
            } else {
                src.read_at(&mut buf[..n], pos)?;
                dst.write_all_at(&buf[..n], pos)?;
                counts.written += n as u64;
            }
            pos = end;
        }
    }
    Ok(())
}

fn zero_range(dst: &File, offset: u64, len: u64, is_block: bool, buf: &mut [u8]) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    if !is_block {
        // SAFETY: fallocate on an open descriptor; no memory is passed.
        let rc = unsafe {
            libc::fallocate(
                dst.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            return Ok(());
        }
    }
    let mut done = 0;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        buf[..n].fill(0);
        dst.write_all_at(&buf[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}

fn sync_dir(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

/// A shared source handed to the reader as a boxed one.
struct ArcSource(Arc<dyn Source>);

impl Source for ArcSource {
    fn format(&self) -> &str {
        self.0.format()
    }
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<blkimage::Extent>> {
        self.0.extents(offset, len)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn finish(&self) -> io::Result<()> {
        self.0.finish()
    }
}
