//! `delay-relay LISTEN_PORT TARGET_PORT DELAY_MS`: a TCP relay from
//! 127.0.0.1:LISTEN_PORT to 127.0.0.1:TARGET_PORT that holds every chunk
//! the server sends for DELAY_MS before passing it on (requests pass at
//! once): each reply arrives DELAY_MS late, as across a network with that
//! round trip, and bandwidth is not limited. The bench's HTTP case uses it
//! as the remote NBD case uses nbdkit's delay filter, which has no HTTP
//! counterpart. Written in Rust, not in the bench's Python: a relay in
//! asyncio moved about 100 MB/s on a busy 2-core machine, slower than the
//! clients it was to delay. Runs until killed.

use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, listen, target, ms] = args.as_slice() else {
        eprintln!("usage: delay-relay LISTEN_PORT TARGET_PORT DELAY_MS");
        std::process::exit(2);
    };
    let target: u16 = target.parse().expect("a port");
    let delay = Duration::from_secs_f64(ms.parse::<f64>().expect("milliseconds") / 1000.0);
    let listener = TcpListener::bind(("127.0.0.1", listen.parse::<u16>().expect("a port")))
        .expect("the port is free");
    for client in listener.incoming().flatten() {
        std::thread::spawn(move || {
            if let Ok(server) = TcpStream::connect(("127.0.0.1", target)) {
                relay(client, server, delay);
            }
        });
    }
}

/// Bytes a chunk of a reply holds at most: the size of the pipe it waits
/// in (the most an unprivileged process may set).
const PIPE_SIZE: libc::c_int = 1 << 20;

/// Requests straight to the server; replies held `delay` each. Replies
/// move through pipes with splice(2), never through the relay's memory:
/// read into buffers and written out, they cost the relay more CPU than
/// the client it delays (1.5 CPU s for 1 GiB, half of it the two copies,
/// a fifth faulting in buffers), and the relay stands for a network, which
/// takes no CPU from the machine measured. Each chunk waits in a pipe of
/// its own (reused once passed on): one pipe for a connection held no more
/// than 1 MiB, so a reply of 4 MiB took four delays, and a splice into a
/// pipe holds the pipe's lock while it waits for the socket.
fn relay(client: TcpStream, server: TcpStream, delay: Duration) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut c_read, mut s_write) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut c_read, &mut s_write);
        let _ = s_write.shutdown(Shutdown::Write);
    });
    // Chunks in order: when each is due, its pipe and its length.
    let (tx, rx) = mpsc::channel::<(Instant, Pipe, usize)>();
    let (free_tx, free) = mpsc::channel::<Pipe>();
    let writer = std::thread::spawn(move || {
        for (due, pipe, n) in rx {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if !splice_all(&pipe.read, &client, n) {
                break;
            }
            let _ = free_tx.send(pipe);
        }
        let _ = client.shutdown(Shutdown::Both);
    });
    loop {
        let Some(pipe) = free.try_recv().ok().or_else(Pipe::new) else {
            break;
        };
        // SAFETY: splice between two descriptors this function owns.
        let n = unsafe {
            libc::splice(
                server.as_raw_fd(),
                std::ptr::null_mut(),
                pipe.write.as_raw_fd(),
                std::ptr::null_mut(),
                PIPE_SIZE as usize,
                libc::SPLICE_F_MOVE,
            )
        };
        if n <= 0 || tx.send((Instant::now() + delay, pipe, n as usize)).is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.join();
}

/// A pipe of [`PIPE_SIZE`] bytes (or the system's default, if it refuses).
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    fn new() -> Option<Pipe> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two descriptors, owned from here on.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return None;
        }
        // SAFETY: both descriptors were just made and are owned by nothing
        // else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: fcntl on a descriptor owned here.
        unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_SIZE) };
        Some(Pipe { read, write })
    }
}

/// `n` bytes from the pipe to the socket; false if the socket is gone.
fn splice_all(pipe: &OwnedFd, to: &TcpStream, mut n: usize) -> bool {
    while n > 0 {
        // SAFETY: splice between two descriptors the caller owns.
        let moved = unsafe {
            libc::splice(
                pipe.as_raw_fd(),
                std::ptr::null_mut(),
                to.as_raw_fd(),
                std::ptr::null_mut(),
                n,
                libc::SPLICE_F_MOVE,
            )
        };
        if moved <= 0 {
            return false;
        }
        n -= moved as usize;
    }
    true
}
