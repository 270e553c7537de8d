//! Command-line arguments.

use blkhash::{Algorithm, MAX_THREADS};
pub use blkimage::units::{parse_block_size, parse_size, parse_timeout};
use clap::Parser;

/// Compute blkhash checksums of disk images: raw and qcow2 files, block
/// devices and standard input.
///
/// The checksum is H(H(block 0) || ... || H(block n-1) || le64(size)), equal
/// to blkhash 0.11's. Unallocated ranges are never read and all-zero blocks
/// never digested, so sparse images hash in a fraction of the time of
/// sha256sum.
#[derive(Parser, Debug)]
#[command(name = "blksum", version, about, max_term_width = 100)]
pub struct Args {
    /// Images to hash; none, or '-', reads standard input.
    #[arg(value_name = "FILE")]
    pub files: Vec<std::ffi::OsString>,

    /// Digest, by its OpenSSL name (see --list-digests).
    #[arg(short, long, value_name = "NAME", default_value = "sha256", value_parser = parse_digest)]
    pub digest: Algorithm,

    /// List the digests and exit.
    #[arg(short, long)]
    pub list_digests: bool,

    /// Block size: a multiple of 512 from 512 to 64m (suffixes k, m).
    #[arg(long, value_name = "SIZE", default_value = "64k", value_parser = parse_block_size)]
    pub block_size: usize,

    /// Digest threads [default: the number of cores]: digesting is
    /// CPU-bound and reading mostly waits, so one per core keeps all busy.
    #[arg(short, long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=MAX_THREADS as i64))]
    pub threads: Option<u16>,

    /// Image format: raw (the bytes as they are), qcow2, or one QEMU reads
    /// through a private qemu-nbd: vmdk, vdi, vhdx, vpc, qed, parallels, dmg,
    /// qcow, bochs, cloop, luks (with --secret-file) [default: probed from the magic bytes: qcow2 if the
    /// file starts with the qcow2 magic and version 2 or later, one of the
    /// others by its signature, else raw]. Standard input, pipes and NBD
    /// URLs are always raw.
    #[arg(short, long, value_name = "FORMAT", value_parser = parse_format)]
    pub format: Option<blkimage::Format>,

    /// Refuse images that refer to other files: qcow2 backing files and
    /// external data files. Use it for untrusted images: a qcow2 image can
    /// name any host file as its backing file, and that file would be read.
    #[arg(long)]
    pub no_backing: bool,

    /// Read images even while another process has them open for writing
    /// (a running VM, a writable qemu-nbd), as qemu-img's -U: by default
    /// such an image fails with "in use", as QEMU's image locks say, and an
    /// image being read is locked against new writers.
    #[arg(short = 'U', long)]
    pub force_share: bool,

    /// LUKS images: the file that holds the passphrase. Its bytes are the
    /// passphrase as they are (a trailing newline is part of it: write it
    /// with printf '%s'), as QEMU's `--object secret,file=FILE` reads them:
    /// a file, not the passphrase itself, so that it never shows in the
    /// process list or the shell history, and the file that works with
    /// qemu-img and qemu-nbd works here.
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<std::path::PathBuf>,

    /// Use the page cache. By default files are read with direct I/O where
    /// the file system allows it, as QEMU's cache=none: a large image does
    /// not evict everything else from memory.
    #[arg(long)]
    pub cache: bool,

    /// NBD: seconds a handshake step or a reply may take (trickled or
    /// silent), and a request may wait for its reply to begin, before the
    /// input fails (also the connect timeout) [default: no limit].
    #[arg(long, value_name = "SECONDS", value_parser = parse_timeout)]
    pub timeout: Option<std::time::Duration>,

    /// NBD over TLS (nbds://, nbds+unix://): the directory with ca-cert.pem,
    /// and client-cert.pem and client-key.pem for a client certificate, when
    /// the URL has no tls-certificates=DIR [default: the system's CAs].
    #[arg(long, value_name = "DIR")]
    pub tls_certificates: Option<std::path::PathBuf>,

    /// Bytes per read (suffixes k, m), rounded up to whole blocks [default: 1m].
    #[arg(long, value_name = "SIZE", value_parser = parse_read_size)]
    pub read_size: Option<usize>,

    /// Reads and digest jobs queued ahead of the digest workers.
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=128))]
    pub queue_depth: u16,

    /// Show progress on standard error (bytes, rate, time left).
    #[arg(short, long)]
    pub progress: bool,

    /// Hash up to N inputs at once; output stays in argument order. Each
    /// input already uses every core: more jobs only help inputs that wait
    /// on I/O, like many small files or slow servers.
    #[arg(short, long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub jobs: u16,

    /// Write BSD-style lines that name the digest and block size:
    /// "blkhash/DIGEST[/BLOCK] (NAME) = HEX". --check of such a file needs
    /// no options.
    #[arg(long, conflicts_with_all = ["check", "json"])]
    pub tag: bool,

    /// Write one JSON document for the run: per input its name, format,
    /// virtual size, digest, block size, checksum, and data, zero and
    /// unallocated bytes (or its error).
    #[arg(long, conflicts_with = "check")]
    pub json: bool,

    /// Read checksum lines from the FILEs (or standard input) and check the
    /// images they name. Untagged lines use --digest and --block-size.
    #[arg(short, long)]
    pub check: bool,

    /// With --check: don't print OK for each verified image.
    #[arg(long, requires = "check")]
    pub quiet: bool,

    /// With --check: print nothing; the exit status tells.
    #[arg(long, requires = "check")]
    pub status: bool,

    /// With --check: warn about improperly formatted checksum lines.
    #[arg(short, long, requires = "check")]
    pub warn: bool,

    /// With --check: fail for improperly formatted checksum lines.
    #[arg(long, requires = "check")]
    pub strict: bool,

    /// With --check: don't fail or report status for missing images.
    #[arg(long, requires = "check")]
    pub ignore_missing: bool,

    /// Print a shell completion script and exit.
    #[arg(long, value_name = "SHELL", exclusive = true)]
    pub completions: Option<clap_complete::Shell>,

    /// Print the manual page (roff) and exit.
    #[arg(long, exclusive = true)]
    pub man: bool,
}

fn parse_format(s: &str) -> Result<blkimage::Format, String> {
    s.parse()
}

fn parse_digest(s: &str) -> Result<Algorithm, String> {
    s.parse()
        .map_err(|e: blkhash::UnknownAlgorithm| e.to_string())
}

fn parse_read_size(s: &str) -> Result<usize, String> {
    let n = parse_size(s)?;
    if n % 4096 != 0 || !(4096..=(256u64 << 20)).contains(&n) {
        return Err(format!(
            "read size must be a multiple of 4k from 4k to 256m, not {n}"
        ));
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_sizes() {
        assert_eq!(parse_read_size("1m"), Ok(1 << 20));
        assert!(parse_read_size("1000").is_err());
        assert!(parse_read_size("512m").is_err());
    }
}
