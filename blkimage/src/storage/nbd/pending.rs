//! The requests of one connection waiting for their replies: what the
//! senders (`connection.rs`) register under a cookie and the reply reader
//! (`replies.rs`) answers, behind one lock. Both use this module; neither
//! imports the other's internals.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// A block status descriptor: its length and its context's flags.
pub type Status = (u32, u32);

/// The status chunks of one block status reply, one per negotiated
/// context (the server must send each exactly once).
#[derive(Debug, Default)]
pub struct StatusReply {
    /// base:allocation's descriptors.
    pub allocation: Option<Vec<Status>>,
    /// The dirty bitmap's descriptors.
    pub bitmap: Option<Vec<Status>>,
}

/// A request being answered, as the reply reader needs it.
pub(super) enum Op {
    Read {
        /// The caller's buffer, valid until the request is done or the
        /// connection is dead (the caller waits for one or the other).
        ptr: *mut u8,
        offset: u64,
        len: u32,
        /// Ranges covered by content chunks (start -> end).
        covered: BTreeMap<u64, u64>,
    },
    Status {
        result: StatusReply,
    },
    /// A write, write zeroes or flush: the reply says done or an error.
    Plain,
}

// SAFETY: the pointer is only written by the reader thread while its owner
// waits (see `Op::Read`).
unsafe impl Send for Op {}

pub(super) struct Pending {
    pub(super) op: Op,
    /// Bytes it counts for in the connection's bound on bytes in flight
    /// (its `MAX_IN_FLIGHT_BYTES`: the connection uses this module, not
    /// the other way round).
    pub(super) cost: u64,
    pub(super) done: bool,
    pub(super) error: Option<String>,
}

pub(super) struct State {
    pub(super) pending: HashMap<u64, Pending>,
    /// Why the connection is gone, once it is.
    pub(super) dead: Option<(io::ErrorKind, String)>,
    pub(super) last_activity: Instant,
    /// Requests sent and not done, and their bytes.
    pub(super) in_flight: usize,
    pub(super) in_flight_bytes: u64,
}

impl State {
    /// Mark a request done (once), releasing its place in flight.
    pub(super) fn complete(&mut self, cookie: u64) {
        if let Some(p) = self.pending.get_mut(&cookie)
            && !p.done
        {
            p.done = true;
            self.in_flight -= 1;
            self.in_flight_bytes -= p.cost;
        }
    }
}

pub(super) struct Shared {
    state: Mutex<State>,
    pub(super) cond: Condvar,
}

impl Shared {
    /// Nothing in flight, the connection alive.
    pub(super) fn new() -> Shared {
        Shared {
            state: Mutex::new(State {
                pending: HashMap::new(),
                dead: None,
                last_activity: Instant::now(),
                in_flight: 0,
                in_flight_bytes: 0,
            }),
            cond: Condvar::new(),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}
