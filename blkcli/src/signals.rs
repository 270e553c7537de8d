//! Stopping a command on Ctrl-C or SIGTERM the same way everywhere: the
//! first signal sets a flag the readers check between chunks, so the
//! command stops cleanly between reads or writes; if it has not stopped
//! within a grace period (a read that never returns: a silent server, a
//! FIFO), or a second signal comes, the process exits at once, with the
//! same message and status.
//!
//! Exiting at once is as safe as a kill -9, which every command survives
//! (blksync never has a state ahead of DST; a private qemu-nbd gets
//! SIGTERM from the kernel through its parent-death signal; its private
//! directory lives only while it starts, and the next run removes one a
//! kill left behind), and leaves no temporary or lock file behind: those
//! the skipped destructors would have removed are removed first
//! ([`blkmap::temps`]).

use signal_hook::consts::{SIGINT, SIGTERM};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// How long a run may take to stop after the first signal before the
/// process exits anyway: a reader checks the flag between chunks (1 MiB
/// reads, 8 MiB writes), which takes far less on a working device.
pub const GRACE: Duration = Duration::from_secs(2);

/// The flag SIGINT and SIGTERM set, and which of them came.
pub struct Signals {
    /// Set by the first signal; readers check it between chunks.
    pub cancel: Arc<AtomicBool>,
    signal: Arc<AtomicUsize>,
}

impl Signals {
    /// Handle SIGINT and SIGTERM from now on. `interrupted` is the message
    /// printed (on standard error) when the process exits by itself,
    /// "PROGRAM: interrupted" as the command prints it when it stops.
    pub fn install(interrupted: &str) -> Signals {
        let cancel = Arc::new(AtomicBool::new(false));
        let signal = Arc::new(AtomicUsize::new(0));
        let message = interrupted.to_string();
        let (c, s) = (cancel.clone(), signal.clone());
        // Without handlers the default action still ends the process;
        // the handlers are left out where the thread that would run them
        // has no room to start (under `ulimit -v`).
        let Ok(room) = blkhash::room_for_thread() else {
            return Signals { cancel, signal };
        };
        let mut iter = match signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) {
            Ok(i) => i,
            Err(_) => return Signals { cancel, signal },
        };
        // The thread is waited for until it runs: std maps its signal stack
        // as it starts, and aborts if it cannot. Left to start while this
        // thread allocated the run's buffers, it lost that race under a
        // limit (`ulimit -v 12000`, a loaded machine: "failed to allocate
        // an alternative stack", exit 134).
        let (ready, started) = std::sync::mpsc::sync_channel::<()>(1);
        let spawned = std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                let _ = ready.send(());
                for sig in iter.forever() {
                    if s.load(Ordering::Relaxed) != 0 {
                        exit_now(&message, s.load(Ordering::Relaxed));
                    }
                    s.store(sig as usize, Ordering::Relaxed);
                    c.store(true, Ordering::Relaxed);
                    let m = message.clone();
                    let _ = std::thread::Builder::new()
                        .name("signal-grace".into())
                        .spawn(move || {
                            std::thread::sleep(GRACE);
                            exit_now(&m, sig as usize);
                        });
                }
            });
        if spawned.is_ok() {
            let _ = started.recv();
        }
        drop(room);
        Signals { cancel, signal }
    }

    /// True once a signal came.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    /// The exit status a shell reports for a run killed by the signal
    /// that came: 130 for SIGINT, 143 for SIGTERM.
    pub fn exit_status(&self) -> u8 {
        status(self.signal.load(Ordering::Relaxed))
    }
}

fn status(sig: usize) -> u8 {
    (128 + sig).min(255) as u8
}

/// Exit at once, skipping the destructors that remove the run's
/// temporary and lock files: those are removed here instead.
fn exit_now(message: &str, sig: usize) -> ! {
    blkmap::temps::remove_all();
    crate::say!("{message}");
    std::process::exit(status(sig).into())
}
