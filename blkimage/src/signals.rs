//! Stopping a command on Ctrl-C or SIGTERM the same way everywhere: the
//! first signal sets a flag the readers check between chunks (the command
//! stops cleanly, between reads or writes); a second one exits at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The flag SIGINT and SIGTERM set, and which of them came.
pub struct Signals {
    pub cancel: Arc<AtomicBool>,
    signal: Arc<AtomicUsize>,
}

impl Signals {
    /// Handle SIGINT and SIGTERM from now on.
    pub fn install() -> Signals {
        let cancel = Arc::new(AtomicBool::new(false));
        let signal = Arc::new(AtomicUsize::new(0));
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            let _ = signal_hook::flag::register_conditional_shutdown(sig, 1, cancel.clone());
            let _ = signal_hook::flag::register(sig, cancel.clone());
            let _ = signal_hook::flag::register_usize(sig, signal.clone(), sig as usize);
        }
        Signals { cancel, signal }
    }

    /// True once a signal came.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    /// The exit status a shell reports for a run killed by the signal
    /// that came: 130 for SIGINT, 143 for SIGTERM.
    pub fn exit_status(&self) -> u8 {
        (128 + self.signal.load(Ordering::Relaxed)).min(255) as u8
    }
}
