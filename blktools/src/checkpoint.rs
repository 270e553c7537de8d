//! Resumable hashing (`blksum --checkpoint FILE`): the block digests hashed
//! so far are saved every few seconds as a part of the image's map (from
//! byte 0), with a record of the image; a run started again with the same
//! FILE checks that record and a few sampled blocks, then hashes only the
//! rest. The checksum comes from merging the saved part with the rest.
//!
//! A save merges FILE (read as a stream) with the blocks hashed since the
//! last save into a new FILE, written atomically: a run killed at any
//! moment leaves the old FILE or the new one, and the blocks of a save in
//! flight are hashed again. Memory: the digests of the blocks hashed since
//! the last save, and about 1 MiB for the merge.

use crate::state::{Side, block_matches, spread};
use crate::{MapOptions, hasher};
use blkhash::Algorithm;
use blkimage::{Input, Source, Stats};
use blkmap::{Header, MapBuilder, MapError, MapReader, Named, Piece};
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufReader};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

/// Where and how often to save progress.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    /// The checkpoint file.
    pub path: PathBuf,
    /// Time between saves, at least (a save that takes long spaces the next
    /// ones, so that saving takes at most about a tenth of the run: the
    /// checkpoint is rewritten whole at each save).
    pub interval: Duration,
    /// On success, leave the image's whole map at `path` (blkmap and
    /// blkdiff read it; a run given it again finishes at once) instead of
    /// removing it.
    pub keep: bool,
}

/// The default time between saves.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);

/// What a resumable run found.
pub struct Resumed {
    /// The image checksum.
    pub checksum: Vec<u8>,
    /// The image's size.
    pub size: u64,
    /// What this run read (not what earlier runs did).
    pub stats: Stats,
    /// "raw", "qcow2", ...
    pub format: String,
    /// The bytes the checkpoint already covered when this run started.
    pub resumed_at: u64,
}

/// Hash the image `input` (opened from `name`) with `opts`, resuming from
/// and saving to `ck`. `progress` gets the bytes passed on, those the
/// checkpoint covered first.
pub fn hash(
    name: &OsStr,
    input: Input,
    opts: &MapOptions,
    ck: &Checkpoint,
    progress: &mut dyn FnMut(u64),
) -> io::Result<Resumed> {
    let src = crate::seekable(input, "--checkpoint")?;
    let size = src.size();
    let identity = identity(name, size)?;
    let shown = ck.path.display().to_string();
    let _ = blkmap::remove_stale_temps(&ck.path);
    let resumed_at = match std::fs::metadata(&ck.path) {
        Ok(_) => resume_point(&ck.path, &*src, opts, &identity)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
        Err(e) => return Err(io::Error::new(e.kind(), format!("{shown}: {e}"))),
    };
    progress(resumed_at);
    let mut saver = Saver {
        path: ck.path.clone(),
        identity: identity.to_text().into_bytes(),
        pending: Vec::new(),
    };
    let window = blkimage::Window::new(src.clone(), resumed_at, size - resumed_at)?;
    let (mut sink, builder) = hasher(opts)?;
    let read_size = opts.read_size.next_multiple_of(opts.block_size);
    let (stop, stopped) = mpsc::channel::<()>();
    let (read, finished) = std::thread::scope(|scope| {
        let (builder, saver) = (&builder, &mut saver);
        let periodic = scope.spawn(move || {
            let mut wait = ck.interval;
            loop {
                match stopped.recv_timeout(wait) {
                    Err(RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
                let t = Instant::now();
                // A save that fails is tried again with more at the next
                // one: its blocks stay pending.
                let _ = saver.save_new(builder, size, resumed_at);
                wait = ck.interval.max(t.elapsed() * 10);
            }
        });
        let read = blkimage::read_input(
            Input::Image(Box::new(window)),
            &mut sink,
            read_size,
            opts.io_depth,
            &opts.cancel,
            progress,
        );
        // Every block read is digested and seen by the builder, up to the
        // first failure, before the last save.
        let finished = sink.finalize();
        drop(stop);
        let _ = periodic.join();
        (read, finished)
    });
    let read = match read.and_then(|r| finished.map(|_| r)) {
        Ok(read) => read,
        Err(e) => {
            // What was hashed is kept for the next run.
            return Err(match saver.save(&builder, size, resumed_at, true) {
                Ok(_) => e,
                Err(s) => io::Error::new(
                    e.kind(),
                    format!("{e} (and {shown} could not be saved: {s})"),
                ),
            });
        }
    };
    read.finish()?;
    let header = if ck.keep {
        saver.save(&builder, size, resumed_at, false)?
    } else {
        let h = saver.merged(&builder, size, resumed_at)?;
        if ck.path.exists() {
            std::fs::remove_file(&ck.path)?;
        }
        h
    };
    let checksum = header
        .checksum
        .ok_or_else(|| io::Error::other(format!("{shown}: the blocks do not cover the image")))?;
    Ok(Resumed {
        checksum,
        size,
        stats: read.stats,
        format: read.format,
        resumed_at,
    })
}

/// Saves the checkpoint: FILE merged with what the builder took since.
struct Saver {
    path: PathBuf,
    identity: Vec<u8>,
    /// Parts taken from the builder and not yet in FILE (a save failed).
    pending: Vec<Vec<u8>>,
}

impl Saver {
    /// Move the blocks the builder saw since the last call to `pending`:
    /// whether there were any. With no FILE and nothing pending, the empty
    /// part is kept too (an empty image's merge needs one input).
    fn take(&mut self, builder: &MapBuilder, size: u64, offset: u64) -> io::Result<bool> {
        let part = builder.take_part(size, offset)?;
        let new = part.range().len > 0;
        if new || (self.pending.is_empty() && !self.path.exists()) {
            self.pending.push(part.to_bytes());
        }
        Ok(new)
    }

    /// FILE, if there is one, and the pending parts, as merge inputs.
    fn inputs(&self) -> io::Result<Vec<Named<'_>>> {
        let mut inputs: Vec<Named<'_>> = Vec::new();
        match File::open(&self.path) {
            Ok(f) => inputs.push((self.path.display().to_string(), Box::new(BufReader::new(f)))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        for p in &self.pending {
            inputs.push((
                "the blocks hashed by this run".into(),
                Box::new(io::Cursor::new(&p[..])),
            ));
        }
        Ok(inputs)
    }

    /// Save FILE if the builder has blocks it does not.
    fn save_new(&mut self, builder: &MapBuilder, size: u64, offset: u64) -> io::Result<()> {
        if self.take(builder, size, offset)? {
            self.write(true)?;
        }
        Ok(())
    }

    /// Save FILE (a part if `partial`, else the whole map).
    fn save(
        &mut self,
        builder: &MapBuilder,
        size: u64,
        offset: u64,
        partial: bool,
    ) -> io::Result<Header> {
        self.take(builder, size, offset)?;
        self.write(partial)
    }

    /// Merge FILE and the pending parts into a new FILE.
    fn write(&mut self, partial: bool) -> io::Result<Header> {
        let identity = Some(self.identity.clone());
        let h = blkmap::merge_to_file(self.inputs()?, &self.path, identity, partial)?;
        self.pending.clear();
        Ok(h)
    }

    /// The whole map's header (with the checksum), FILE left as it is.
    fn merged(&mut self, builder: &MapBuilder, size: u64, offset: u64) -> io::Result<Header> {
        self.take(builder, size, offset)?;
        Ok(blkmap::merge(self.inputs()?, None, None, false)?)
    }
}

/// The record of the image `name` of `size` bytes a checkpoint keeps.
fn identity(name: &OsStr, size: u64) -> io::Result<Side> {
    Ok(match name.to_str().filter(|n| blkimage::nbd::is_url(n)) {
        Some(_) => Side::of_export("checkpoint".into(), size),
        None => Side::of_file("checkpoint".into(), &std::fs::metadata(name)?, size),
    })
}

/// Check the checkpoint at `path` belongs to this image, digest and block
/// size: the bytes it covers from 0, or why not (an error that says how to
/// start over).
fn resume_point(path: &Path, src: &dyn Source, opts: &MapOptions, now: &Side) -> io::Result<u64> {
    let shown = path.display();
    let refuse = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{shown}: {why}; remove it to start over, or give another --checkpoint FILE"),
        )
    };
    let file = File::open(path).map_err(|e| io::Error::new(e.kind(), format!("{shown}: {e}")))?;
    let mut reader = match MapReader::new(BufReader::new(file)) {
        Ok(r) => r,
        Err(MapError::NotAMap) => return Err(refuse("not a checkpoint (not a block map)".into())),
        Err(e) => return Err(refuse(format!("not a usable checkpoint: {e}"))),
    };
    let h = reader.header().clone();
    let Some(recorded) = h.identity.as_deref() else {
        return Err(refuse(
            "a block map with no record of its image (blkmap's?), not a checkpoint".into(),
        ));
    };
    if (h.algorithm, h.block_size) != (opts.algorithm, opts.block_size) {
        return Err(refuse(format!(
            "a checkpoint of {} digests of {}-byte blocks, not {} of {}-byte blocks as asked",
            h.algorithm, h.block_size, opts.algorithm, opts.block_size
        )));
    }
    let then = std::str::from_utf8(recorded)
        .map_err(|_| ())
        .and_then(|t| Side::parse(t).map_err(|_| ()))
        .map_err(|_| refuse("a checkpoint whose record of its image is damaged".into()))?;
    if let Some(why) = then.changed_since(now, "the checkpoint") {
        return Err(refuse(format!(
            "not a checkpoint of this image as it is now: {why}"
        )));
    }
    if h.size != src.size() || h.range.offset != 0 {
        return Err(refuse(format!(
            "a checkpoint of bytes {}+{} of a {}-byte image, not of this {}-byte one from its start",
            h.range.offset,
            h.range.len,
            h.size,
            src.size()
        )));
    }
    let bad = check_samples(&mut reader, src).map_err(|e| match e {
        MapError::Io(e) if e.kind() != io::ErrorKind::InvalidData => e,
        other => refuse(format!("not a usable checkpoint: {other}")),
    })?;
    if let Some(i) = bad {
        return Err(refuse(format!(
            "block {i} of the image is not the block the checkpoint recorded: the image changed since"
        )));
    }
    Ok(h.range.len)
}

/// Read a few of the blocks the checkpoint covers and compare them with
/// its digests: the first that differs, if one does. Reads the whole
/// checkpoint, so its trailer is checked too.
fn check_samples<R: io::Read>(
    reader: &mut MapReader<R>,
    src: &dyn Source,
) -> Result<Option<u64>, MapError> {
    let h = reader.header().clone();
    let (alg, bs): (Algorithm, u64) = (h.algorithm, h.block_size as u64);
    let len = alg.output_len();
    let blocks = h.blocks();
    let mut wanted = spread(blocks, h.size).into_iter().peekable();
    let mut recorded: Vec<(u64, Option<Vec<u8>>)> = Vec::new();
    let mut at = 0u64;
    while let Some(piece) = reader.next_piece()? {
        let n = match piece {
            Piece::Zeros(n) => n,
            Piece::Data(d) => (d.len() / len) as u64,
        };
        while let Some(&i) = wanted.peek().filter(|&&i| i < at + n) {
            let digest = match piece {
                Piece::Zeros(_) => None,
                Piece::Data(d) => Some(d[(i - at) as usize * len..][..len].to_vec()),
            };
            recorded.push((i, digest));
            wanted.next();
        }
        at += n;
    }
    let mut buf = vec![0u8; bs as usize];
    for (i, digest) in recorded {
        let offset = i * bs;
        let n = bs.min(h.range.end() - offset) as usize;
        src.read_at(&mut buf[..n], offset)?;
        if !block_matches(alg, &buf[..n], digest.as_deref()) {
            return Ok(Some(i));
        }
    }
    Ok(None)
}
