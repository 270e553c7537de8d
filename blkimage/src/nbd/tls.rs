//! TLS over NBD (after NBD_OPT_STARTTLS).

use super::transport::{Socket, Split};
use std::io;
use std::path::Path;

pub struct Tls(Socket);

impl io::Read for Tls {
    fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "TLS"))
    }
}
impl io::Write for Tls {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "TLS"))
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

pub fn connect(_sock: Socket, _host: &str, _certs: Option<&Path>) -> io::Result<Tls> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "TLS (nbds://) is not supported yet",
    ))
}

pub fn split(t: Tls) -> io::Result<Split> {
    Split::plain(t.0)
}
