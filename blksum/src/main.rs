//! blksum: wires inputs to the blkhash construction and prints checksums.
//! No format or protocol logic lives here: that is blkimage's.

// Messages go through blkcli::say!, which never panics on a closed
// standard error (`cmd 2>&1 | head -1`).
#![deny(clippy::print_stderr)]

mod cli;
mod hashing;
mod report;

use blkcli::output::{Form, LineStyle, Stdout, Suspended};
use blkcli::progress::Progress;
use blkjob::Hashed as Report;
use blksum::check;
use hashing::Hashing;
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io::{self, BufReader};
use std::process::ExitCode;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Why a run stopped early.
enum Stop {
    /// Ctrl-C or SIGTERM.
    Signal,
    /// Standard output is gone (a closed pipe): nothing more to say.
    Output,
}

fn main() -> ExitCode {
    blkhash::one_heap_under_a_limit();
    let args: cli::Args = blkcli::help::parse(cli::command());
    if args.list_digests {
        return blkcli::output::print_code("blksum", |out| {
            blkhash::Algorithm::listed().try_for_each(|a| writeln!(out, "{a}"))
        });
    }
    if let Some(code) = args.manual.print::<cli::Args>(&cli::PAGE) {
        return code;
    }

    // Ctrl-C and SIGTERM stop the run between reads; a run that does not
    // stop within the grace period, or a second signal, exits at once.
    let signals = blkcli::signals::Signals::install("blksum: interrupted");

    let files = if args.files.is_empty() {
        vec![OsString::from("-")]
    } else {
        args.files.clone()
    };
    // With --check the FILEs are lists: the images are not known ahead.
    let inputs = (!args.check).then_some(files.len());
    let progress = match Progress::new("blksum", args.progress.progress, inputs) {
        Ok(p) => p,
        Err(msg) => {
            blkcli::say!("blksum: {msg}");
            return ExitCode::from(2);
        }
    };
    let checkpoint = match checkpoint(&args, &files) {
        Ok(c) => c,
        Err(msg) => {
            blkcli::say!("blksum: {msg}");
            return ExitCode::from(2);
        }
    };
    // Checked once here (a usage error exits); each input's job is this
    // one with its own digest and block size.
    let job = args.input.job(None).with_cancel(signals.cancel.clone());
    let hashing = Hashing {
        job,
        progress,
        checkpoint,
    };
    let result = if args.check {
        check_lists(&args, &hashing, &files)
    } else {
        hash_inputs(&args, &hashing, &files)
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(Stop::Signal) => {
            // As a shell reports a run killed by the signal.
            ExitCode::from(signals.exit_status())
        }
        Err(Stop::Output) => ExitCode::FAILURE,
    }
}

/// The checkpoint asked for, once checked: one input that can seek, and a
/// FILE that replaces nothing but a map.
fn checkpoint(
    args: &cli::Args,
    files: &[OsString],
) -> Result<Option<blkjob::checkpoint::Checkpoint>, String> {
    let Some(path) = &args.checkpoint else {
        return Ok(None);
    };
    if files.len() != 1 {
        return Err(format!(
            "--checkpoint takes one image, not {} (give each its own checkpoint, one run each)",
            files.len()
        ));
    }
    if files[0] == "-" {
        return Err(
            "--checkpoint takes one image that can seek, not standard input (a pipe cannot be resumed)"
                .into(),
        );
    }
    let out = blkcli::guard::Output {
        path,
        what: "a checkpoint",
        own_kind: Some(blkmap::is_map),
    };
    let input = blkcli::guard::Input {
        name: &files[0],
        role: "the image",
    };
    blkcli::guard::check_outputs(&[out], &[input])?;
    Ok(Some(blkjob::checkpoint::Checkpoint {
        path: path.clone(),
        interval: args
            .checkpoint_interval
            .unwrap_or(blkjob::checkpoint::DEFAULT_INTERVAL),
        keep: args.keep_checkpoint,
        warn: |msg| blkcli::say!("blksum: {msg}"),
    }))
}

/// Hash every input, `--jobs` at a time, printing results in argument order.
/// Ok(true) if every input was hashed.
fn hash_inputs(args: &cli::Args, hashing: &Hashing, files: &[OsString]) -> Result<bool, Stop> {
    let job = &hashing.job;
    let params = (job.construction(), job.algorithm(), job.block_size());
    let mut results = Results {
        args,
        hashing,
        out: Stdout::new("blksum").with_progress(&hashing.progress),
        form: Form::from_flags(args.json, args.output.as_deref()),
        json: Vec::new(),
        all_ok: true,
    };
    in_order(
        files,
        args.jobs.into(),
        |name| hashing.checksum(name, params),
        &mut |name, result| results.emit(name, result),
    )?;
    results.finish()
}

/// What a run printed so far: each input's result as it comes, in
/// argument order, and at the end the JSON document.
struct Results<'a> {
    args: &'a cli::Args,
    hashing: &'a Hashing,
    out: Stdout<'a>,
    form: Form,
    /// Each input's object, with --json.
    json: Vec<serde_json::Value>,
    /// Whether every input was hashed so far.
    all_ok: bool,
}

impl Results<'_> {
    /// One input's result: its checksum line (or its object, with
    /// --json), or its error.
    fn emit(&mut self, name: &OsStr, result: io::Result<Report>) -> Result<(), Stop> {
        let shown = blkcli::shown(name);
        let name: &OsStr = &shown;
        let lossy = name.to_string_lossy();
        if self.form == Form::Json {
            self.json.push(report::input(name, &result));
        }
        if let Ok(Report {
            rounded: Some(r), ..
        }) = &result
        {
            self.say(format_args!("{lossy}: {r}"));
        }
        if let Ok(Report {
            decompressed: Some(d),
            ..
        }) = &result
        {
            self.say(format_args!("{lossy}: {d}"));
        }
        match result {
            Ok(r) if self.form == Form::Lines => {
                self.say_resumed(&lossy, &r);
                let style = LineStyle {
                    tag: self.args.tag,
                    zero: self.args.zero,
                };
                let job = &self.hashing.job;
                let params = (job.construction(), job.algorithm(), job.block_size());
                (self.out)
                    .checksum(style, &r.checksum.to_hex(), name, params)
                    .map_err(|_| Stop::Output)
            }
            Ok(_) => Ok(()),
            Err(_) if self.hashing.cancelled() => {
                self.say(format_args!("{lossy}: interrupted"));
                Err(Stop::Signal)
            }
            Err(e) => {
                self.all_ok = false;
                self.say(format_args!("{lossy}: {}", blkcli::units::reason(&e)));
                Ok(())
            }
        }
    }

    /// A run resumed from its checkpoint says where.
    fn say_resumed(&self, name: &str, r: &Report) {
        if r.resumed_at == 0 {
            return;
        }
        let ck = (self.args.checkpoint.as_deref()).unwrap_or(std::path::Path::new(""));
        self.say(format_args!(
            "{name}: resumed at byte {} of {} from {}",
            r.resumed_at,
            r.size,
            ck.display()
        ));
    }

    /// A message on standard error, the progress bars cleared meanwhile.
    fn say(&self, msg: std::fmt::Arguments) {
        self.hashing
            .progress
            .suspend(|| blkcli::say!("blksum: {msg}"));
    }

    /// The JSON document, with --json; Ok(true) if every input was hashed.
    fn finish(self) -> Result<bool, Stop> {
        if self.form == Form::Json {
            let doc = report::document(self.json);
            self.out.json(&doc).map_err(|_| Stop::Output)?;
        }
        Ok(self.all_ok)
    }
}

/// Run `work` on every item with up to `jobs` threads, and hand each result
/// to `emit` in item order, as soon as all before it are emitted.
fn in_order<T: Send>(
    items: &[OsString],
    jobs: usize,
    work: impl Fn(&OsStr) -> T + Sync,
    emit: &mut dyn FnMut(&OsStr, T) -> Result<(), Stop>,
) -> Result<(), Stop> {
    let one_by_one = |emit: &mut dyn FnMut(&OsStr, T) -> Result<(), Stop>| {
        for name in items {
            emit(name, work(name))?;
        }
        Ok(())
    };
    if jobs <= 1 {
        return one_by_one(emit);
    }
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        let mut started = 0;
        for _ in 0..jobs.min(items.len()) {
            let tx = tx.clone();
            let (next, stop, work) = (&next, &stop, &work);
            let spawned = std::thread::Builder::new().spawn_scoped(s, move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= items.len() || stop.load(Ordering::Relaxed) {
                        return;
                    }
                    if tx.send((i, work(&items[i]))).is_err() {
                        return;
                    }
                }
            });
            // At the system's limit on threads, the threads started take
            // every input; with none, this thread does.
            if spawned.is_err() {
                break;
            }
            started += 1;
        }
        drop(tx);
        if started == 0 {
            return one_by_one(emit);
        }
        let mut waiting = BTreeMap::new();
        let mut first = 0;
        for (i, result) in rx {
            waiting.insert(i, result);
            while let Some(result) = waiting.remove(&first) {
                if let Err(e) = emit(&items[first], result) {
                    stop.store(true, Ordering::Relaxed);
                    return Err(e);
                }
                first += 1;
            }
        }
        Ok(())
    })
}

/// `--check`: verify every checksum file. Ok(true) if all verified.
fn check_lists(args: &cli::Args, hashing: &Hashing, lists: &[OsString]) -> Result<bool, Stop> {
    let (algorithm, block_size) = (hashing.job.algorithm(), hashing.job.block_size());
    let opts = check::CheckOptions {
        construction: hashing.job.construction(),
        algorithm,
        block_size,
        quiet: args.quiet,
        status: args.status,
        warn: args.warn,
        strict: args.strict,
        ignore_missing: args.ignore_missing,
    };
    let mut all_ok = true;
    for list_os in lists {
        let list = &*list_os.to_string_lossy();
        let input: Box<dyn io::Read> = if list_os == "-" {
            Box::new(io::stdin())
        } else {
            match std::fs::File::open(list_os) {
                Ok(f) => Box::new(f),
                Err(e) => {
                    blkcli::say!("blksum: {list}: {}", blkcli::units::reason(&e));
                    all_ok = false;
                    continue;
                }
            }
        };
        // The size note is no failure: --quiet (failures only) and
        // --status (nothing) leave it out.
        let mut compute = |name: &OsStr, tag| {
            hashing.checksum(name, tag).map(|r| {
                if !args.quiet && !args.status {
                    let lossy = blkcli::shown_lossy(name);
                    let notes = (r.rounded.map(|n| n.to_string()).into_iter())
                        .chain(r.decompressed.as_ref().map(|d| d.to_string()));
                    for n in notes {
                        hashing
                            .progress
                            .suspend(|| blkcli::say!("blksum: {lossy}: {n}"));
                    }
                }
                r.checksum
            })
        };
        let result = check::check_file(
            list,
            &mut BufReader::new(input),
            &opts,
            &mut compute,
            &mut Suspended(&hashing.progress, io::stdout()),
            &mut Suspended(&hashing.progress, blkcli::output::Stderr),
        );
        match result {
            Ok(ok) => all_ok &= ok,
            Err(_) if hashing.cancelled() => {
                blkcli::say!("blksum: {list}: interrupted");
                return Err(Stop::Signal);
            }
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Err(stdout_failed(&e)),
            Err(e) => {
                blkcli::say!("blksum: {list}: {}", blkcli::units::reason(&e));
                all_ok = false;
            }
        }
    }
    Ok(all_ok)
}

/// Standard output failed: said (unless the reader went away), and the
/// run stops.
fn stdout_failed(e: &io::Error) -> Stop {
    blkcli::output::failed("blksum", e);
    Stop::Output
}
