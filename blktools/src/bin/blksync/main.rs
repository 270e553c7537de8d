//! blksync: bring a raw copy of an image up to date by writing only the
//! blocks that differ.

mod copy;
mod target;
mod update;

use blkcli::guard;
use blkcli::manual::{ManualArgs, Page};
use blkhash::BlockEvent;
use blkimage::nbd::{Nbd, QemuTarget};
use blkimage::{Input, Source};
use blkmap::{Block, Map};
use blktools::{InputArgs, MapOptions, reason, state};
use clap::Parser;
use copy::{CopyTarget, CopyThrough, Counts, Progress, WriteThrough, Writer};
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use target::Target;

/// Make DST (a raw file, a block device or an NBD export) hold SRC's guest
/// content, writing only the blocks that differ.
///
/// SRC is any image blksum reads (not a pipe). DST's blocks come from its
/// state (--state MAP, saved by the last run) if it matches DST, else from
/// reading DST; a DST that does not exist or holds no data is not read at
/// all (nor is SRC hashed then, unless --state, --verify or --checksum
/// need its digests: the first copy is a plain copy). A regular file DST is created if missing and resized to SRC's size;
/// blocks that became zeros are punched out (holes). The state is removed
/// before DST is written and saved again only once DST is flushed: an
/// interrupted run never leaves a state that claims a block not written.
///
/// Exit status: 0 DST holds SRC's content, 1 trouble (nothing or part
/// written; rerun), 2 usage, 130/143 stopped by SIGINT/SIGTERM.
#[derive(Parser, Debug)]
#[command(name = "blksync", version, max_term_width = 100)]
struct Args {
    /// The image to copy from.
    #[arg(value_name = "SRC")]
    src_path: OsString,

    /// The raw file, block device, NBD URL (an export of SRC's size) or
    /// image of SRC's virtual size in another format (qcow2, vmdk...,
    /// written through a private qemu-nbd) to bring up to date.
    #[arg(value_name = "DST")]
    dst_path: OsString,

    /// SRC and DST as messages name them (file names need not be UTF-8).
    #[arg(skip)]
    src: String,
    #[arg(skip)]
    dst: String,

    /// DST's block map: used instead of reading DST if it exists and
    /// matches DST, and replaced by SRC's map after the copy (with a side
    /// record MAP.dst of DST's identity, size and times).
    #[arg(long, value_name = "MAP")]
    state: Option<PathBuf>,

    /// Ignore the state, whatever it holds (a warning says why it would
    /// have been refused): read DST and compare. The state is then saved
    /// anew.
    #[arg(long)]
    force_rescan: bool,

    /// DST's format: a DST that does not exist is created in it (raw: a
    /// sparse file; qcow2, or another format QEMU writes: `qemu-img
    /// create`), and an existing file must be of it [default: an existing
    /// DST's, else raw].
    #[arg(short = 'O', long, value_name = "FORMAT", value_parser = blktools::parse_format)]
    output_format: Option<blkimage::Format>,

    #[command(flatten)]
    input: InputArgs,

    /// Show progress on standard error: blocks compared, blocks written,
    /// bytes saved.
    #[arg(short, long)]
    progress: bool,

    /// Say what would be written; write nothing.
    #[arg(short = 'n', long)]
    dry_run: bool,

    /// After the copy, hash DST again and check it has SRC's checksum.
    #[arg(long)]
    verify: bool,

    /// Print SRC's checksum at the end, as blksum does (CHECKSUM  SRC).
    /// SRC is hashed while it is copied. (No -c: that is blksum's --check.)
    #[arg(long)]
    checksum: bool,

    /// When another run holds DST or the state, wait for it to end
    /// [default: fail at once, naming it].
    #[arg(long)]
    wait: bool,

    /// Handled before the rest is parsed (blkcli::manual::early).
    #[command(flatten)]
    _manual: ManualArgs,
}

const PAGE: Page = Page {
    exit_status: &[
        (
            "0",
            "DST holds SRC's content (and the state, if asked, describes it).",
        ),
        (
            "1",
            "Trouble: nothing or part of DST written, no state saved; run again.",
        ),
        ("2", "Usage error."),
        (
            "130, 143",
            "Stopped by SIGINT (Ctrl-C) or SIGTERM; no state claims a block not written.",
        ),
    ],
    examples: &[
        (
            "Keep a backup copy up to date, reading only SRC the next times:",
            "blksync vm.qcow2 /backup/vm.raw --state /backup/vm.map",
        ),
        (
            "The same into a qcow2 image, created on the first run:",
            "blksync -O qcow2 vm.raw /backup/vm.qcow2 --state /backup/vm.map",
        ),
        (
            "Into an NBD export, printing SRC's checksum:",
            "blksync --checksum disk.raw nbd://backup-host/disk",
        ),
        (
            "What would be written:",
            "blksync -n vm.qcow2 /backup/vm.raw",
        ),
    ],
};

impl Args {
    /// Whether the run needs SRC's block digests, even for a first copy.
    fn needs_src_map(&self) -> bool {
        self.state.is_some() || self.verify || self.checksum
    }
}

fn main() -> ExitCode {
    if let Some(code) = blkcli::manual::early::<Args>(&PAGE) {
        return code;
    }
    let mut args: Args = blktools::parse_args(|a: &Args| &a.input);
    args.src = args.src_path.to_string_lossy().into_owned();
    args.dst = args.dst_path.to_string_lossy().into_owned();
    // Ctrl-C and SIGTERM stop the run between chunks; a second one kills
    // at once (as in blksum). Either way the state is never ahead of DST.
    let signals = blkcli::signals::Signals::install(&format!(
        "blksync: {} -> {}: interrupted",
        args.src, args.dst
    ));
    match run(&args, &signals.cancel) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) if signals.cancelled() => {
            eprintln!("blksync: {} -> {}: interrupted", args.src, args.dst);
            ExitCode::from(signals.exit_status())
        }
        Err(e) => {
            eprintln!("blksync: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Missing,
    File,
    Device,
    Nbd,
}

impl Kind {
    /// A regular file (or one to create): resized to SRC's size.
    fn is_file(self) -> bool {
        matches!(self, Kind::Missing | Kind::File)
    }
}

fn err(name: impl std::fmt::Display, e: impl std::fmt::Display) -> String {
    format!("{name}: {e}")
}

fn ioerr(name: impl std::fmt::Display, e: &io::Error) -> String {
    err(name, reason(e))
}

/// DST as an input: its raw bytes, through the page cache (it is written
/// through it too).
fn dst_open_options() -> blkimage::OpenOptions {
    blkimage::OpenOptions {
        cache: true,
        format: Some(blkimage::Format::Raw),
        ..Default::default()
    }
}

fn run(args: &Args, cancel: &AtomicBool) -> Result<(), String> {
    let _state_lock = guard_outputs(args, cancel)?;
    let nbd = match args.dst_path.to_str().is_some_and(blkimage::nbd::is_url) {
        true => Some(open_nbd_dst(&args.dst, &args.input.nbd_options())?),
        false => None,
    };
    let dst_path = Path::new(&args.dst_path);
    let kind = match std::fs::metadata(dst_path) {
        _ if nbd.is_some() => Kind::Nbd,
        Ok(m) if m.file_type().is_block_device() => Kind::Device,
        Ok(m) if m.is_file() => Kind::File,
        Ok(_) => {
            return Err(err(
                &args.dst,
                "not a regular file or block device (DST must be a raw file or a block device)",
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Kind::Missing,
        Err(e) => return Err(ioerr(&args.dst, &e)),
    };

    // One run at a time writes DST: locked before it or its state is read.
    let wait = match args.wait {
        true => guard::Wait::Until(cancel),
        false => guard::Wait::No,
    };
    let mut _dst_lock = match kind {
        Kind::File | Kind::Device => {
            let f = File::open(dst_path).map_err(|e| ioerr(&args.dst, &e))?;
            Some(guard::lock(f, &args.dst, wait)?)
        }
        Kind::Missing | Kind::Nbd => None,
    };

    // The state first: it says how to hash (unless -d/--block-size do).
    let loaded = match &args.state {
        Some(p) if p.exists() => Some(Map::load(p).map_err(|e| e.to_string())),
        _ => None,
    };
    let (algorithm, block_size) =
        blktools::map_params(&args.input, loaded.as_ref().and_then(|r| r.as_ref().ok()));
    let opts = blktools::map_options(&args.input, algorithm, block_size);

    // SRC: random access, kept open for the copy.
    let src: Arc<dyn Source> = match blkimage::open(&args.src_path, &opts.open) {
        Ok(Input::Image(s)) => Arc::from(s),
        Ok(Input::Stream(_)) => {
            return Err(err(&args.src, "a stream: blksync needs random access"));
        }
        Err(e) => return Err(ioerr(&args.src, &e)),
    };
    let size = src.size();

    // A missing DST is created now, by one run only, and locked; it is
    // removed again if the run fails before the copy starts.
    let mut created = None;
    if kind == Kind::Missing && !args.dry_run {
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(dst_path)
            .map_err(|e| match e.kind() {
                io::ErrorKind::AlreadyExists => err(
                    &args.dst,
                    "created by another process while blksync started: rerun",
                ),
                _ => ioerr(&args.dst, &e),
            })?;
        created = Some(Created(dst_path.to_path_buf()));
        _dst_lock = Some(guard::lock(f, &args.dst, wait)?);
    }
    let kind = match (kind, args.output_format) {
        (Kind::Missing, Some(f)) if f != blkimage::Format::Raw && !args.dry_run => {
            create_image(&args.dst_path, &args.dst, f.name(), size)?;
            Kind::File
        }
        (k, _) => k,
    };
    // The file as it is before a server opens it: a served image's state
    // is checked against it.
    let file_meta = match kind {
        Kind::File => Some(std::fs::metadata(dst_path).map_err(|e| ioerr(&args.dst, &e))?),
        _ => None,
    };
    let image_format = match &file_meta {
        Some(meta) => image_dst_format(dst_path, args, &*src, meta)?,
        None => None,
    };
    let have = match (image_format, kind) {
        (Some(f), _) => Some(f),
        (None, Kind::File | Kind::Device) => Some("raw"),
        // An export is what its server makes of it; nothing exists yet.
        (None, Kind::Nbd | Kind::Missing) => None,
    };
    if let (Some(have), Some(want)) = (have, args.output_format)
        && have != want.name()
    {
        return Err(err(
            &args.dst,
            format!("a {have} image, not {} (-O {})", want.name(), want.name()),
        ));
    }
    let served = match image_format {
        Some(format) => Some(Served {
            format,
            target: QemuTarget::open(dst_path, format, &args.input.nbd_options())
                .map_err(|e| ioerr(&args.dst, &e))?,
        }),
        None => None,
    };
    let (kind, nbd) = match &served {
        Some(t) => (Kind::Nbd, Some(t.target.nbd())),
        None => (kind, nbd),
    };

    let dst_read = match kind {
        Kind::Missing | Kind::Nbd => None,
        _ => Some(File::open(dst_path).map_err(|e| ioerr(&args.dst, &e))?),
    };
    let dst_size = match (&dst_read, &nbd) {
        (_, Some(n)) => n.size(),
        (None, None) => 0,
        (Some(f), None) => (&*f)
            .seek(io::SeekFrom::End(0))
            .map_err(|e| ioerr(&args.dst, &e))?,
    };
    if !kind.is_file() && dst_size != size {
        let what = match (kind, &served) {
            (_, Some(t)) => format!("a {} image", t.format),
            (Kind::Nbd, None) => "an NBD export".to_string(),
            _ => "a block device".to_string(),
        };
        let hint = match &served {
            Some(_) => format!(" (qemu-img resize {} {size})", args.dst),
            None => String::new(),
        };
        return Err(err(
            &args.dst,
            format!("{what} of {dst_size} bytes, SRC is {size}: sizes must match{hint}"),
        ));
    }

    // Is the state DST's?
    let mut dst_map = None;
    if let (Some(p), Some(loaded)) = (&args.state, loaded) {
        let verdict = loaded.and_then(|m| {
            let dst = match (&dst_read, &nbd) {
                (Some(f), _) => Some(DstNow::File(f)),
                (None, Some(n)) => Some(DstNow::Nbd(n, served.as_ref().and(file_meta.as_ref()))),
                (None, None) => None,
            };
            check_state(&m, p, algorithm, block_size, dst, dst_size)?;
            Ok(m)
        });
        match (verdict, args.force_rescan) {
            (Ok(m), false) => dst_map = Some(m),
            (Ok(_), true) => {}
            (Err(why), false) => {
                return Err(err(
                    p.display(),
                    format!(
                        "state refused: {why} (--force-rescan ignores it: DST is then read and compared)"
                    ),
                ));
            }
            (Err(why), true) => eprintln!(
                "blksync: warning: {}: state ignored (--force-rescan): {why}",
                p.display()
            ),
        }
    }
    // A DST known to hold only zeros is not read.
    let known_empty = dst_map.is_none()
        && match (&dst_read, kind) {
            (_, Kind::Nbd) => {
                reads_as_zeros(nbd.as_ref().expect("NBD DST")).map_err(|e| ioerr(&args.dst, &e))?
            }
            (None, _) => true,
            (Some(f), Kind::File) => dst_size == 0 || holds_no_data(f),
            _ => false,
        };

    let counts = Arc::new(Counts::default());
    let progress = Progress::new(args.progress, size, block_size);
    // From here on DST is written: a failed run leaves it for the next.
    std::mem::forget(created);
    let result = sync(
        args,
        SyncCtx {
            src,
            opts: &opts,
            kind,
            nbd,
            dst_size,
            dst_map,
            known_empty,
            cancel,
            counts: &counts,
            progress: &progress,
        },
    );
    progress.finish();
    let src_map = result?;
    if args.dry_run {
        return Ok(());
    }
    // A served image's file changes until its server has closed it: its
    // side record is taken once the server is gone.
    if let (Some(t), Some(p), Some(m)) = (served, &args.state, &src_map) {
        drop(t);
        let meta = std::fs::metadata(dst_path).map_err(|e| ioerr(&args.dst, &e))?;
        state::save_side(p, Some(state::Side::of(m, &meta, meta.len())))
            .map_err(|e| ioerr(p.display(), &e))?;
    }
    let blocks = size.div_ceil(block_size as u64);
    let (written, zeroed) = (Counts::get(&counts.written), Counts::get(&counts.zeroed));
    eprintln!(
        "blksync: {} -> {}: {written} bytes written, {zeroed} zeroed, in {}, of {size}; \
         {} compared, {} bytes saved",
        args.src,
        args.dst,
        blkcli::plural(Counts::get(&counts.ranges), "range", "ranges"),
        blkcli::plural(blocks, "block", "blocks"),
        size - written - zeroed,
    );
    if let (true, Some(m)) = (args.checksum, &src_map) {
        let mut line = blkcli::lines::format_line_os(&m.checksum_hex(), &args.src_path, None);
        line.push(b'\n');
        let mut out = io::stdout().lock();
        out.write_all(&line)
            .and_then(|()| out.flush())
            .map_err(|e| err("standard output", e))?;
    }
    Ok(())
}

/// Check that the state, its side record and its lock file can be written
/// without destroying data (none is SRC or DST, each is a regular file of
/// its own kind or missing), that SRC is not DST, and lock the state for
/// the run.
fn guard_outputs(args: &Args, cancel: &AtomicBool) -> Result<Option<guard::Lock>, String> {
    let inputs = [
        guard::Input {
            name: &args.src_path,
            role: "SRC",
        },
        guard::Input {
            name: &args.dst_path,
            role: "DST",
        },
    ];
    if let (Ok(a), Ok(b)) = (
        std::fs::metadata(&args.src_path),
        std::fs::metadata(&args.dst_path),
    ) && (a.dev(), a.ino()) == (b.dev(), b.ino())
    {
        return Err(err(
            &args.dst,
            format!("is SRC ({}): nothing to copy", args.src),
        ));
    }
    let Some(p) = &args.state else {
        return Ok(None);
    };
    let (side, lock) = (state::side_path(p), state::lock_path(p));
    let outputs = [
        guard::Output {
            path: p,
            what: "a block map (the state)",
            own_kind: Some(blkmap::is_map),
        },
        guard::Output {
            path: &side,
            what: "the state's side record",
            own_kind: Some(state::is_side),
        },
        guard::Output {
            path: &lock,
            what: "the state's lock file",
            own_kind: None,
        },
    ];
    guard::check_outputs(&outputs, &inputs)?;
    // A dry run writes nothing: it creates no lock file, and locks one
    // that exists.
    if args.dry_run && !lock.exists() {
        return Ok(None);
    }
    let wait = match args.wait {
        true => guard::Wait::Until(cancel),
        false => guard::Wait::No,
    };
    let f = guard::open_lock_file(&lock)?;
    guard::lock(f, &p.display().to_string(), wait).map(Some)
}

/// A DST this run created, removed when dropped (the run failed before
/// writing it).
struct Created(PathBuf);

impl Drop for Created {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

struct SyncCtx<'a> {
    src: Arc<dyn Source>,
    opts: &'a MapOptions,
    kind: Kind,
    nbd: Option<Arc<Nbd>>,
    dst_size: u64,
    dst_map: Option<Map>,
    known_empty: bool,
    cancel: &'a AtomicBool,
    counts: &'a Arc<Counts>,
    progress: &'a Progress,
}

impl SyncCtx<'_> {
    /// What copying ranges from SRC to `dst` needs.
    fn writer<'a>(&'a self, args: &'a Args, dst: &'a Target) -> Writer<'a> {
        Writer {
            src: &*self.src,
            src_name: &args.src,
            dst,
            dst_name: &args.dst,
            counts: self.counts,
            progress: self.progress,
            cancel: self.cancel,
            check: (args.state.is_some() || args.checksum)
                .then_some((self.opts.algorithm, self.opts.block_size as u64)),
        }
    }
}

/// Bring DST up to date; SRC's map, unless the run did not need it.
fn sync(args: &Args, mut c: SyncCtx<'_>) -> Result<Option<Map>, String> {
    let size = c.src.size();
    let dst_path = Path::new(&args.dst_path);
    let open_dst = || match &c.nbd {
        Some(n) => Ok(Target::Nbd(n.clone())),
        None => OpenOptions::new()
            .write(true)
            .create(c.kind == Kind::Missing)
            .truncate(false)
            .open(dst_path)
            .map(Target::File)
            .map_err(|e| ioerr(&args.dst, &e)),
    };
    let remove_state = || match &args.state {
        Some(p) => state::remove(p).map_err(|e| ioerr(p.display(), &e)),
        None => Ok(()),
    };

    let (src_map, dst) = if c.known_empty && !args.dry_run {
        // Nothing to compare: every data block of SRC is written as soon
        // as it is read, on the worker that read it.
        remove_state()?;
        let dst = Arc::new(open_dst()?);
        dst.set_len(size).map_err(|e| ioerr(&args.dst, &e))?;
        let map = if args.needs_src_map() {
            let failed = Arc::new(Mutex::new(None));
            let through = Through {
                dst: dst.clone(),
                name: Arc::from(args.dst.as_str()),
                failed: failed.clone(),
                flush_later: args.state.is_some(),
            };
            let map = hash_src(&c, Some(through), |_| {}).map_err(|e| {
                failed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take()
                    .unwrap_or_else(|| ioerr(&args.src, &e))
            })?;
            Some(map)
        } else {
            copy_src(args, &c, dst.clone())?;
            None
        };
        (
            map,
            Arc::into_inner(dst).expect("workers are done with DST"),
        )
    } else if let Some(known) = c.dst_map.take_if(|_| !args.dry_run) {
        // DST's blocks are known from its state: the blocks that differ are
        // written while SRC is hashed, not after.
        let dst = open_dst()?;
        let resize = size != c.dst_size;
        if resize {
            remove_state()?;
            dst.set_len(size).map_err(|e| ioerr(&args.dst, &e))?;
        }
        let (mut differ, ops) = update::Differ::new(known, size);
        let w = c.writer(args, &dst);
        let watch = move |e: BlockEvent<'_>| differ.event(e);
        let (hashed, written) = std::thread::scope(|s| {
            // The hasher owns `watch`: once it is done, the writers' queue
            // closes and they end.
            let hasher = s.spawn(|| hash_src(&c, None, watch));
            let written = update::write_ops(ops, &w, update::writers(&dst), || match resize {
                true => Ok(()),
                false => remove_state(),
            });
            (hasher.join().expect("hashing thread"), written)
        });
        // DST's failure first: SRC's hashing goes on after it.
        written?;
        (Some(hashed.map_err(|e| ioerr(&args.src, &e))?), dst)
    } else {
        // Both maps: SRC hashed; DST's from its state, else zeros, else
        // hashed (at the same time as SRC).
        let known = c.dst_map.take();
        let c = &c;
        let (src_map, dst_map) = std::thread::scope(|s| {
            let hs = s.spawn(|| hash_src(c, None, |_| {}));
            let dst_map = match known {
                Some(m) => Ok(m),
                None if c.known_empty => zeros_map(c.opts, c.dst_size),
                None => map_dst(args, c, c.cancel),
            };
            (hs.join().expect("hashing thread"), dst_map)
        });
        let src_map = src_map.map_err(|e| ioerr(&args.src, &e))?;
        let dst_map = dst_map.map_err(|e| ioerr(&args.dst, &e))?;
        let todo = to_write(&src_map, &dst_map, c.dst_size)?;
        if args.dry_run {
            for r in &todo {
                println!("{r}");
            }
            if size != c.dst_size {
                println!("resize {} -> {size}", c.dst_size);
            }
            return Ok(Some(src_map));
        }
        if !todo.is_empty() || size != c.dst_size {
            remove_state()?;
        }
        let dst = open_dst()?;
        if c.kind.is_file() && size != c.dst_size {
            dst.set_len(size).map_err(|e| ioerr(&args.dst, &e))?;
        }
        let w = c.writer(args, &dst);
        copy::copy_ranges(&w, &src_map, &todo)?;
        (Some(src_map), dst)
    };

    // Flushed before a state describes it, even when nothing was written
    // (a run killed before may have left its writes in the page cache
    // only). Without a state there is nothing to keep true: like cp and
    // qemu-img convert, the writes are left to the page cache. An NBD
    // export is always flushed: once blksync is gone nobody would flush
    // the server's cache (qemu-nbd keeps qcow2 metadata there; killed,
    // it loses the writes).
    if args.state.is_some() || c.kind == Kind::Nbd {
        dst.sync().map_err(|e| ioerr(&args.dst, &e))?;
    }
    if let (true, Some(src_map)) = (args.verify, &src_map) {
        let never = AtomicBool::new(false);
        let again = map_dst(args, &c, &never).map_err(|e| ioerr(&args.dst, &e))?;
        if again.checksum() != src_map.checksum() {
            return Err(err(
                &args.dst,
                "verification failed: checksum differs from SRC's",
            ));
        }
    }
    if let (Some(p), Some(src_map)) = (&args.state, &src_map) {
        let file = match &dst {
            Target::File(f) => Some(f),
            Target::Nbd(_) => None,
        };
        state::save(p, src_map, file, size).map_err(|e| ioerr(p.display(), &e))?;
    }
    Ok(src_map)
}

/// Where SRC's chunks go besides the hasher, when DST is written on the fly.
struct Through {
    dst: Arc<Target>,
    name: Arc<str>,
    failed: Arc<Mutex<Option<String>>>,
    flush_later: bool,
}

/// Hash SRC into its map, counting what is compared; with `through`, each
/// chunk is also written to DST. `watch` sees every block event.
fn hash_src(
    c: &SyncCtx<'_>,
    through: Option<Through>,
    watch: impl FnMut(BlockEvent<'_>) + Send + 'static,
) -> io::Result<Map> {
    let (mut h, builder) = blktools::hasher_also(c.opts, watch)?;
    let read_size = c.opts.read_size.next_multiple_of(c.opts.block_size);
    let mut on_read = |n: u64| {
        c.counts.compared.fetch_add(n, Ordering::Relaxed);
        c.progress.update(c.counts);
    };
    match through {
        Some(t) => {
            let mut sink = WriteThrough {
                hasher: &mut h,
                dst: t.dst,
                dst_name: t.name,
                block_size: c.opts.block_size,
                counts: c.counts.clone(),
                failed: t.failed,
                pos: 0,
                flush_later: t.flush_later,
            };
            blkimage::read_image(c.src.clone(), &mut sink, read_size, c.cancel, &mut on_read)?;
        }
        None => {
            blkimage::read_image(c.src.clone(), &mut h, read_size, c.cancel, &mut on_read)?;
        }
    }
    let map = builder.finalize(h)?;
    // Only now are all reads done: is SRC still what we read?
    c.src.finish()?;
    Ok(map)
}

/// DST's map, read and hashed: its raw bytes through the page cache (it
/// is written through it too), or the export through the connection
/// blksync writes with (a server may take one client only).
fn map_dst(args: &Args, c: &SyncCtx<'_>, cancel: &AtomicBool) -> io::Result<Map> {
    let o = MapOptions {
        open: dst_open_options(),
        ..c.opts.clone()
    };
    let input = match &c.nbd {
        Some(n) => Input::Image(Box::new(SharedNbd(n.clone()))),
        None => blkimage::open(&args.dst_path, &o.open)?,
    };
    blktools::map_input_until(input, &o, cancel).map(|m| m.map)
}

/// The DST connection as an input to hash.
struct SharedNbd(Arc<Nbd>);

impl Source for SharedNbd {
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
}

/// Connect to an NBD DST, which must take writes.
fn open_nbd_dst(url: &str, opts: &blkimage::nbd::NbdOptions) -> Result<Arc<Nbd>, String> {
    let nbd = blkimage::nbd::open_url(url, opts).map_err(|e| ioerr(url, &e))?;
    if !nbd.is_writable() {
        return Err(err(url, "the export is read-only"));
    }
    Ok(Arc::new(nbd))
}

/// True if the whole export reads as zeros, by its block status (never
/// read: an export without block status is not known to be empty).
fn reads_as_zeros(n: &Nbd) -> io::Result<bool> {
    if !n.has_block_status() {
        return Ok(false);
    }
    let mut pos = 0;
    while pos < n.size() {
        for e in n.extents(pos, n.size() - pos)? {
            if !e.kind.is_zero() {
                return Ok(false);
            }
            pos = e.end();
        }
    }
    Ok(true)
}

/// Copy SRC's data to a DST of zeros, hashing nothing.
fn copy_src(args: &Args, c: &SyncCtx<'_>, dst: Arc<Target>) -> Result<(), String> {
    let mut sink = CopyThrough::new(CopyTarget {
        src_name: Arc::from(args.src.as_str()),
        dst,
        dst_name: Arc::from(args.dst.as_str()),
        block_size: c.opts.block_size,
        threads: c.opts.threads,
        counts: c.counts.clone(),
        flush_later: false,
    });
    let read_size = c.opts.read_size.next_multiple_of(c.opts.block_size);
    let mut on_read = |n: u64| {
        c.counts.compared.fetch_add(n, Ordering::Relaxed);
        c.progress.update(c.counts);
    };
    let read = blkimage::read_image(c.src.clone(), &mut sink, read_size, c.cancel, &mut on_read);
    // The workers' failure first: it names its input; then the read loop's.
    sink.finish()?;
    read.map_err(|e| ioerr(&args.src, &e))?;
    c.src.finish().map_err(|e| ioerr(&args.src, &e))
}

/// The map of `size` bytes of zeros.
fn zeros_map(opts: &MapOptions, size: u64) -> io::Result<Map> {
    let (mut h, builder) = blktools::hasher(opts)?;
    h.update_zeros(size);
    builder.finalize(h)
}

/// What to write: the differing ranges, and SRC's data past DST's end (a
/// file grows with a hole, which reads as zeros).
fn to_write(src_map: &Map, dst_map: &Map, dst_size: u64) -> Result<Vec<blkmap::Range>, String> {
    let d = blkmap::diff(dst_map, src_map).map_err(|e| e.to_string())?;
    let mut todo = d.ranges;
    let size = src_map.size();
    if size > dst_size {
        let bs = src_map.block_size() as u64;
        for b in dst_size / bs..src_map.blocks() {
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
    Ok(todo)
}

/// DST as it is now, to check a state against.
enum DstNow<'a> {
    File(&'a File),
    /// An export; for an image file blksync serves, the file as it was
    /// before the server opened it.
    Nbd(&'a Nbd, Option<&'a std::fs::Metadata>),
}

/// Why the state `m` (from `p`) is not DST's, if it is not. Cheap checks
/// only: parameters, size, the side record (same file, size and times;
/// none for NBD exports), and a few sampled blocks read from DST.
fn check_state(
    m: &Map,
    p: &Path,
    algorithm: blkhash::Algorithm,
    block_size: usize,
    dst: Option<DstNow<'_>>,
    dst_size: u64,
) -> Result<(), String> {
    if let Some(why) = blktools::map_mismatch(m, algorithm, block_size) {
        return Err(why);
    }
    let Some(dst) = dst else {
        return Err("DST does not exist: not its state".into());
    };
    if m.size() != dst_size {
        return Err(format!(
            "it is of a {}-byte image and DST is {dst_size} bytes: not its state",
            m.size()
        ));
    }
    let now = match &dst {
        DstNow::File(f) => {
            let meta = f.metadata().map_err(|e| reason(&e))?;
            Some(state::Side::of(m, &meta, dst_size))
        }
        DstNow::Nbd(_, Some(meta)) => Some(state::Side::of(m, meta, meta.len())),
        DstNow::Nbd(_, None) => None,
    };
    if let (Some(now), Some(side)) = (now, state::load_side(p, m)?)
        && let Some(why) = side.changed(&now)
    {
        return Err(format!("DST changed since the state was saved: {why}"));
    }
    let read_at = |buf: &mut [u8], offset: u64| match &dst {
        DstNow::File(f) => f.read_exact_at(buf, offset),
        DstNow::Nbd(n, _) => n.read_at(buf, offset),
    };
    match state::check_samples(&read_at, m) {
        Ok(None) => Ok(()),
        Ok(Some(i)) => Err(format!(
            "DST changed since the state was saved: its block {i} (offset {}) does not hold what the state says",
            i * m.block_size() as u64
        )),
        Err(e) => Err(format!("reading DST: {}", reason(&e))),
    }
}

/// True if the file has no data allocated at all (reads as zeros).
fn holds_no_data(f: &File) -> bool {
    // SAFETY: lseek on an open descriptor.
    let rc = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA) };
    rc < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO)
}

/// A DST file that is an image of another format, served writable by a
/// private qemu-nbd.
struct Served {
    format: &'static str,
    target: QemuTarget,
}

/// The format of a DST file that is an image of another format (qcow2,
/// vmdk...), to write through a private qemu-nbd, so that its guest
/// content becomes SRC's and its format stays (as `qemu-img convert -n`
/// writes into an image); `None` for a raw file. A raw file that starts as
/// SRC's guest content does (the copy of a disk that holds an image
/// itself) stays raw. A LUKS image is refused: its passphrase has no way
/// in here.
fn image_dst_format(
    path: &Path,
    args: &Args,
    src: &dyn Source,
    meta: &std::fs::Metadata,
) -> Result<Option<&'static str>, String> {
    let name = &args.dst;
    let size = meta.len();
    if size == 0 {
        return Ok(None);
    }
    let raw = blkimage::RawFile::open(path, false).map_err(|e| ioerr(name, &e))?;
    let f = File::open(path).map_err(|e| ioerr(name, &e))?;
    let format = if blkimage::qcow2::probe(&raw).map_err(|e| ioerr(name, &e))? {
        Some("qcow2")
    } else {
        blkimage::nbd::probe_format(&f, size).map_err(|e| ioerr(name, &e))?
    };
    let Some(format) = format else {
        return Ok(None);
    };
    let n = size.min(src.size()).min(512) as usize;
    let (mut a, mut b) = (vec![0u8; n], vec![0u8; n]);
    if raw.read_at(&mut a, 0).is_ok() && src.read_at(&mut b, 0).is_ok() && a == b {
        return Ok(None);
    }
    if format == "luks" {
        return Err(err(
            name,
            "a LUKS image: blksync cannot unlock it (serve it with qemu-nbd and its \
             passphrase, and give the export's URL as DST)",
        ));
    }
    // qemu-nbd follows an image's references to other files (an external
    // data file is written): --no-backing refuses them, as for SRC.
    if args.input.no_backing {
        if format != "qcow2" {
            return Err(err(
                name,
                format!(
                    "a {format} image may refer to other files, which qemu-nbd would write; \
                     with --no-backing only qcow2 DSTs are taken (their references are checked)"
                ),
            ));
        }
        let opts = blkimage::OpenOptions {
            cache: true,
            format: Some(blkimage::Format::Qcow2),
            no_backing: true,
            ..Default::default()
        };
        blkimage::open(path, &opts).map_err(|e| ioerr(name, &e))?;
    }
    Ok(Some(format))
}

/// Create DST, `size` bytes of zeros in `format`, with `qemu-img create`.
fn create_image(path: &OsStr, name: &str, format: &str, size: u64) -> Result<(), String> {
    let out = std::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", format])
        .arg(path)
        .arg(size.to_string())
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => err(
                name,
                format!("{format} images are created with qemu-img: install qemu-utils"),
            ),
            _ => err(name, format!("cannot run qemu-img: {e}")),
        })?;
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr);
        return Err(err(name, format!("qemu-img create failed: {}", why.trim())));
    }
    Ok(())
}
