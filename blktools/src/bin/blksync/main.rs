//! blksync: bring a copy of an image up to date by writing only the
//! blocks that differ.

// Messages go through blkcli::say!, which never panics on a closed
// standard error (`cmd 2>&1 | head -1`).
#![deny(clippy::print_stderr)]

use blkcli::args::InputArgs;
use blkcli::manual::{ManualArgs, Page};
use blkcli::output;
use blkjob::sync::{Error, Plan, Report, Request};
use clap::Parser;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

/// Make DST (a raw file, a block device, an NBD export, or a qcow2 or
/// other QEMU image) hold SRC's guest content, writing only what differs.
///
/// SRC is any image blksum reads (not a pipe). DST is a raw file, a block
/// device of SRC's size, a writable NBD export of SRC's size, or an image
/// file of SRC's virtual size in qcow2 or another format QEMU writes
/// (vmdk, vdi, vhdx, ...), written through a private qemu-nbd so that it
/// keeps its format. DST's blocks come from its
/// state (--state MAP, saved by the last run) if it matches DST, else from
/// reading DST; a DST that does not exist or holds no data is not read at
/// all (nor is SRC hashed then, unless --state, --verify or --checksum
/// /// need its digests: the first copy is a plain copy). A missing DST is
/// created (raw, or -O's format), a raw file resized to SRC's size; blocks
/// that became zeros are punched out (holes) or, in an image, deallocated. The state is removed
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
    /// written through a private qemu-nbd) to bring up to date (not an
    /// HTTP(S) URL: those are read, never written).
    #[arg(value_name = "DST")]
    dst_path: OsString,

    /// DST's block map: used instead of reading DST if it exists and
    /// matches DST, and replaced by SRC's map after the copy (with a side
    /// record MAP.dst of DST's identity, size and times). MAP may be a
    /// Proxmox Backup Server fixed index (.fidx, probed by its magic) of
    /// the backup DST was restored from: read, never written (the state
    /// after the copy goes to --save-state).
    #[arg(long, value_name = "MAP")]
    state: Option<PathBuf>,

    /// Where the state after the copy goes when --state is a PBS fixed
    /// index (which blksync never writes): a map that must not exist yet;
    /// later runs take it as --state.
    #[arg(long, value_name = "MAP", requires = "state")]
    save_state: Option<PathBuf>,

    /// Ignore the state, whatever it holds (a warning says why it would
    /// have been refused): read DST and compare. The state is then saved
    /// anew.
    #[arg(long)]
    force_rescan: bool,

    /// An incremental copy: SRC's dirty bitmap NAME (a qcow2 SRC's
    /// persistent bitmap, or an NBD export's qemu:dirty-bitmap:NAME) says
    /// which blocks changed since the state was saved; with a state that
    /// describes DST, only those are read, compared and copied (and 16
    /// others read to check the state is SRC's earlier map). A bitmap QEMU
    /// marks in use or disabled is refused. Without a usable state (the
    /// first copy), SRC is read whole, as without it.
    #[arg(long, value_name = "NAME", requires = "state")]
    dirty_bitmap: Option<String>,

    /// DST's format: a DST that does not exist is created in it (raw: a
    /// sparse file; qcow2, or another format QEMU writes: `qemu-img
    /// create`), and an existing file must be of it [default: an existing
    /// DST's, else raw].
    #[arg(short = 'O', long, value_name = "FORMAT", value_parser = blkcli::args::parse_output_format)]
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

/// The command, with `-h` a summary: the options a user reaches for first.
fn command() -> clap::Command {
    use blkcli::help::*;
    let shown = [
        (
            "state",
            "DST's map: read it instead of DST, save SRC's after",
        ),
        (
            "dirty_bitmap",
            "Read only what SRC's dirty bitmap marks (--state)",
        ),
        (
            "output_format",
            "DST's format when it is created [default: raw]",
        ),
        ("checksum", "Print SRC's checksum, as blksum does"),
        ("verify", "Hash DST after the copy and check it"),
        ("dry_run", "Say what would be written; write nothing"),
        ("progress", "Show progress on standard error"),
        ("force_rescan", "Ignore the state: read DST and compare"),
        ("wait", "Wait for another run that holds DST or the state"),
        FORMAT,
        NO_BACKING,
        FORCE_SHARE,
        CACHE,
    ];
    summarize(<Args as clap::CommandFactory>::command(), &shown)
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

fn main() -> ExitCode {
    blkhash::one_heap_under_a_limit();
    if let Some(code) = blkcli::manual::early::<Args>(&PAGE) {
        return code;
    }
    let args: Args = blkcli::args::parse_map_args(command(), |a: &Args| &a.input);
    let (src, dst) = (
        blkcli::shown_lossy(&args.src_path),
        blkcli::shown_lossy(&args.dst_path),
    );
    let req = Request {
        src: args.src_path.clone(),
        dst: args.dst_path.clone(),
        state: args.state.clone(),
        save_state: args.save_state.clone(),
        force_rescan: args.force_rescan,
        output_format: args.output_format,
        job: args.input.spec(),
        dry_run: args.dry_run,
        verify: args.verify,
        checksum: args.checksum,
        wait: args.wait,
        dirty_bitmap: args.dirty_bitmap.clone(),
    };
    // Ctrl-C and SIGTERM stop the run between chunks; a second one kills
    // at once (as in blksum). Either way the state is never ahead of DST.
    let signals =
        blkcli::signals::Signals::install(&format!("blksync: {src} -> {dst}: interrupted"));
    let mut warn = |w: &str| blkcli::say!("blksync: warning: {w}");
    let bar = blkcli::progress::SyncBar::new(args.progress);
    // `Err(None)`: standard output failed, already said.
    let printed = blkjob::sync::run(&req, &signals.cancel, &mut warn, &bar)
        .map_err(|e| Some(message(&e)))
        .and_then(|report| print(&args, &src, &dst, &report).map_err(|_| None));
    match printed {
        Ok(()) => ExitCode::SUCCESS,
        Err(None) => ExitCode::FAILURE,
        Err(_) if signals.cancelled() => {
            blkcli::say!("blksync: {src} -> {dst}: interrupted");
            ExitCode::from(signals.exit_status())
        }
        Err(Some(e)) => {
            blkcli::say!("blksync: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The error as blksync says it: the library's message, with the option
/// that helps where there is one.
fn message(e: &Error) -> String {
    match e {
        Error::Io { name, source }
            if blkimage::caused_by::<blkjob::incremental::ReadWhole>(source) =>
        {
            format!(
                "{name}: {} (blksync without --dirty-bitmap reads SRC whole and compares it \
                 with the state; then clear the bitmap)",
                blkcli::units::reason(source)
            )
        }
        Error::Io { name, source } => format!("{name}: {}", blkcli::units::reason(source)),
        Error::StateRefused { .. } => {
            format!("{e} (--force-rescan ignores it: DST is then read and compared)")
        }
        Error::Busy(_) => format!("{e} (--wait waits for it)"),
        e => e.to_string(),
    }
}

/// After a run from a PBS fixed index: what was checked of DST against
/// it, and the state it leaves (a map and its side record) for the next.
fn index_said(args: &Args, r: &Report) {
    let (Some((read, of)), Some(index)) = (r.index_samples, &args.state) else {
        return;
    };
    blkcli::say!(
        "blksync: {}: taken as DST's state: {read} of its {} read from DST and found as it \
         says; the others were taken on its word (DST must not have been written since the \
         restore)",
        index.display(),
        blkcli::plural(of, "chunk", "chunks"),
    );
    if let Some(map) = &args.save_state {
        let side = blkjob::state::side_path(map);
        blkcli::say!(
            "blksync: state saved: {} (SRC's map: give it as --state next time) and {} (DST's \
             identity, size and times, which the next run checks)",
            map.display(),
            side.display()
        );
    }
}

/// What the run did: a dry run's ranges on standard output; else the
/// summary on standard error, and SRC's checksum line if asked.
fn print(args: &Args, src: &str, dst: &str, r: &Report) -> Result<(), output::Failed> {
    if let Some(dry) = &r.would_write {
        return output::print("blksync", |out| {
            for range in &dry.ranges {
                writeln!(out, "{range}")?;
            }
            if let Some((from, to)) = dry.resize {
                writeln!(out, "resize {from} -> {to}")?;
            }
            Ok(())
        });
    }
    // Before the summary, which stays the last line.
    index_said(args, r);
    let blocks = blkcli::plural(r.size.div_ceil(r.block_size as u64), "block", "blocks");
    // A first copy compares nothing: DST held no data.
    let how = match r.plan {
        Plan::FirstCopy { .. } => format!("a first copy, {blocks} read, none compared"),
        _ => match r.dirty_blocks {
            Some(n) => format!("{n} of {blocks} read and compared (the dirty bitmap's)"),
            None => format!("{blocks} compared"),
        },
    };
    blkcli::say!(
        "blksync: {src} -> {dst}: {} bytes written, {} zeroed, in {}, of {}; {how}, {} bytes saved",
        r.written,
        r.zeroed,
        blkcli::plural(r.ranges, "range", "ranges"),
        r.size,
        r.size - r.written - r.zeroed,
    );
    let header = r.src_map.as_ref();
    if let (true, Some(h), Some(c)) = (
        args.checksum,
        header,
        header.and_then(|h| h.checksum.as_ref()),
    ) {
        let (hex, style) = (c.to_hex(), output::LineStyle::default());
        let out = output::Stdout::new("blksync");
        let params = (blkhash::Construction::Blkhash, h.algorithm, h.block_size);
        out.checksum(style, &hex, &args.src_path, params)?;
    }
    Ok(())
}
