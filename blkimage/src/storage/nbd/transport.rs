//! Sockets (TCP or unix) and their split into a reading half (for the
//! reader thread) and a writing half (for the callers).

use super::url::Address;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

/// A connected socket.
pub enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Socket {
    pub fn connect(addr: &Address, timeout: Option<Duration>) -> io::Result<Socket> {
        let s = match addr {
            Address::Tcp { host, port } => {
                let mut last = None;
                let mut found = None;
                for a in (host.as_str(), *port).to_socket_addrs()? {
                    let r = match timeout {
                        Some(t) => TcpStream::connect_timeout(&a, t),
                        None => TcpStream::connect(a),
                    };
                    match r {
                        Ok(s) => {
                            found = Some(s);
                            break;
                        }
                        Err(e) => last = Some(e),
                    }
                }
                let s = match found {
                    Some(s) => s,
                    None => {
                        return Err(last.unwrap_or_else(|| {
                            io::Error::new(io::ErrorKind::NotFound, "host has no address")
                        }));
                    }
                };
                s.set_nodelay(true)?;
                Socket::Tcp(s)
            }
            Address::Unix(path) => Socket::Unix(UnixStream::connect(path)?),
        };
        s.set_timeouts(timeout)?;
        Ok(s)
    }

    fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
            Socket::Unix(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
        }
    }

    /// Whether the peer sends something within `wait` (without consuming
    /// it); the timeouts are `timeout` again after.
    pub fn speaks_within(&self, wait: Duration, timeout: Option<Duration>) -> io::Result<bool> {
        self.set_timeouts(Some(wait))?;
        let mut b = [0u8; 1];
        let peeked = match self {
            Socket::Tcp(s) => s.peek(&mut b),
            // UnixStream::peek is unstable: recv(MSG_PEEK) on its descriptor.
            Socket::Unix(s) => {
                use std::os::fd::AsRawFd;
                // SAFETY: recv into a buffer we own, on a descriptor we hold.
                let n =
                    unsafe { libc::recv(s.as_raw_fd(), b.as_mut_ptr().cast(), 1, libc::MSG_PEEK) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            }
        };
        self.set_timeouts(timeout)?;
        match peeked {
            Ok(n) => Ok(n > 0),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    pub fn try_clone(&self) -> io::Result<Socket> {
        Ok(match self {
            Socket::Tcp(s) => Socket::Tcp(s.try_clone()?),
            Socket::Unix(s) => Socket::Unix(s.try_clone()?),
        })
    }

    /// Non-blocking mode (the TLS transport polls instead of blocking).
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.set_nonblocking(on),
            Socket::Unix(s) => s.set_nonblocking(on),
        }
    }

    pub fn shutdown(&self) {
        let _ = match self {
            Socket::Tcp(s) => s.shutdown(Shutdown::Both),
            Socket::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl super::handshake::SetReadTimeout for Socket {
    fn set_read_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.set_read_timeout(t),
            Socket::Unix(s) => s.set_read_timeout(t),
        }
    }
}

impl AsRawFd for Socket {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Socket::Tcp(s) => s.as_raw_fd(),
            Socket::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.read(buf),
            Socket::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.write(buf),
            Socket::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A connection split for the transmission phase.
pub struct Split {
    pub reader: Box<dyn BufRead + Send>,
    pub writer: Box<dyn Write + Send>,
    /// Wakes the reader and fails the writer: the connection is over.
    pub shutdown: Arc<dyn Fn() + Send + Sync>,
}

/// Buffered reads: headers come in one system call, while large payloads
/// bypass the buffer (straight into the caller's memory).
const READ_BUFFER: usize = 64 << 10;

impl Split {
    pub fn plain(sock: Socket) -> io::Result<Split> {
        let reader = sock.try_clone()?;
        let control = sock.try_clone()?;
        Ok(Split {
            reader: Box::new(BufReader::with_capacity(READ_BUFFER, reader)),
            writer: Box::new(sock),
            shutdown: Arc::new(move || control.shutdown()),
        })
    }
}
