//! The input options every command takes, as one clap group
//! (`#[command(flatten)]`), with their parsers: an option means the same,
//! with the same default and the same validation, in `blksum`, `blkmap`,
//! `blkdiff` and `blksync`.

use crate::units::{parse_block_size, parse_size, parse_timeout};
use blkhash::{Algorithm, Construction, MAX_THREADS};
use blkimage::http::HttpOptions;
use blkimage::nbd::NbdOptions;
use blkimage::{Format, MapReads, OpenOptions};
use blkjob::{Job, JobSpec};
use std::path::PathBuf;
use std::time::Duration;

pub use blkjob::{DEFAULT_QUEUE_DEPTH, DEFAULT_READ_SIZE};

/// How the commands read and hash their inputs.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct InputArgs {
    /// How block digests become the checksum: blkhash (blkhash 0.11's,
    /// ending with the image's length), imageio (oVirt imageio's checksum
    /// API: no length; BLAKE2b-256 and 4m blocks unless -d and --block-size
    /// say otherwise), pbs (a Proxmox Backup Server fixed index's
    /// index_csum: imageio's with sha256 and 4m blocks) [default: blkhash].
    #[arg(long, value_name = "NAME", value_parser = construction_parser(), hide_possible_values = true)]
    pub construction: Option<Construction>,

    /// Digest, by its OpenSSL name (blksum --list-digests lists them, each
    /// a name Python's hashlib takes too), hashlib's (sha3_256, shake_128),
    /// or blake2b-256: BLAKE2b with a 32-byte output, oVirt imageio's
    /// blake2b (also taken as blake2b). --construction imageio takes the
    /// digests imageio computes [default: sha256 (blake2b-256 with
    /// --construction imageio), or a saved map's where one is read].
    #[arg(short, long, value_name = "NAME", value_parser = digest_parser(), hide_possible_values = true)]
    pub digest: Option<Algorithm>,

    /// Block size: a multiple of 512 from 512 to 64m (suffixes k, m)
    /// [default: 64k (4m with --construction imageio or pbs), or a saved
    /// map's where one is read].
    #[arg(long, value_name = "SIZE", value_parser = parse_block_size)]
    pub block_size: Option<usize>,

    /// Digest threads [default: the number of cores]: digesting is
    /// CPU-bound and reading mostly waits, so one per core keeps all busy.
    #[arg(short, long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=MAX_THREADS as i64))]
    pub threads: Option<u16>,

    /// Image format: raw (the bytes whatever they hold, the size rounded up
    /// to a multiple of 512 with zeros as QEMU does: a 1000-byte file is
    /// hashed as 1024 bytes, which is said on standard error; with
    /// --construction imageio or pbs, its exact size, as oVirt imageio and
    /// Proxmox's backup client read a file), qcow2, or one
    /// QEMU reads through a private qemu-nbd: vmdk, vdi, vhdx, vpc, qed,
    /// parallels, dmg, qcow, bochs, cloop, luks (with --secret-file), or
    /// virtnbdbackup: a stream virtnbdbackup writes (DISK.full.data,
    /// DISK.inc.CHECKPOINT.data, plain or lz4-compressed), read as the disk
    /// it holds, an incremental one with the earlier streams found beside
    /// it [default: probed from the magic bytes: qcow2 if the file starts
    /// with the qcow2 magic and version 2 or later, a virtnbdbackup stream
    /// by its header, one of the others by its signature, else raw]. A
    /// file, URL or pipe compressed with gzip, xz or zstd is the image it
    /// holds, probed the same way (a raw image hashed as it is
    /// decompressed, a qcow2 image or another decompressed into an unnamed
    /// temporary file in TMPDIR, which is said); with -f, the bytes as they
    /// are. Standard input, pipes and NBD URLs are otherwise raw, their
    /// exact bytes (so `blksum < FILE` differs from `blksum FILE` when the
    /// size is not a multiple of 512). HTTP(S) URLs are probed as files
    /// are, and read as raw, qcow2 or a virtnbdbackup stream only.
    #[arg(short, long, value_name = "FORMAT", value_parser = format_parser(), hide_possible_values = true)]
    pub format: Option<Format>,

    /// Each input is a chain of image files named oldest first between
    /// commas, FULL,INC1,INC2: each read over the one before as its backing
    /// image, as if chained with qemu-img rebase -u (without writing them):
    /// the disk as of the last. For backups written as standalone qcow2
    /// files (KubeVirt's VirtualMachineBackup): the first is any image
    /// (-f is its format), the others qcow2 images naming no backing file;
    /// virtual sizes may differ, as QEMU allows (the disk is the last one's
    /// size; what lies past a smaller image below reads as zeros). A name
    /// without a comma is an image as without --chain; a file of the chain
    /// missing, named twice or not qcow2 is an error naming it.
    #[arg(long)]
    pub chain: bool,

    /// Hash only the first SIZE bytes of each input, as an image of that
    /// size (suffixes k, m, g; QEMU's raw size= option): a block device
    /// larger than the image written to it (a Block PVC, whose tail holds
    /// whatever the storage held) checked against the image's size. An
    /// input shorter is an error.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub size: Option<u64>,

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
    pub secret_file: Option<PathBuf>,

    /// A Proxmox Backup Server key file (as `proxmox-backup-client key
    /// create` writes it, with any kdf): the key of an encrypted backup
    /// read from its datastore (a .fidx above which a directory holds
    /// .chunks), and the key an encrypted backup's chunk digests are keyed
    /// with (SHA-256 of the chunk and the key's id key): the disk's block
    /// digests are keyed with it where they are compared with such an
    /// index (blkdiff DISK X.fidx, blksync --state X.fidx), with
    /// `--construction pbs` (the index's index_csum), and in a map blkmap
    /// writes. Checked against the fingerprint in the manifest beside the
    /// index. Its passphrase, if it has one, is taken from
    /// PBS_ENCRYPTION_PASSWORD, else from the first line of --secret-file
    /// FILE; never from the command line.
    #[arg(long, value_name = "FILE")]
    pub keyfile: Option<PathBuf>,

    /// Use the page cache. By default files are read with direct I/O where
    /// the file system allows it, as QEMU's cache=none: a large image does
    /// not evict everything else from memory.
    #[arg(long)]
    pub cache: bool,

    /// Read files through the page cache with copies (read(2)), never
    /// hashing them in place from memory maps (as b3sum's --no-mmap);
    /// implied under an address-space limit (ulimit -v). By default, with
    /// --cache, each file is read both ways at first, and then the way
    /// measured to cost less CPU time on this machine is kept.
    #[arg(long, conflicts_with = "mmap")]
    pub no_mmap: bool,

    /// Read files through the page cache by hashing them in place from
    /// memory maps, never copied (but for ranges under 256 KiB), instead
    /// of the way measured to cost less (the default with --cache).
    #[arg(long)]
    pub mmap: bool,

    /// NBD and HTTP(S) URLs: seconds a handshake step or a reply may take
    /// (trickled or silent), and a request may wait for its reply to begin,
    /// before the input fails (also the connect timeout; an HTTP request
    /// that times out is tried again, see --retries) [default: no limit].
    #[arg(long, value_name = "SECONDS", value_parser = parse_timeout)]
    pub timeout: Option<Duration>,

    /// TLS (https://, nbds://, nbds+unix://): the certificate authorities
    /// to trust instead of the system's, as curl's --cacert or --capath: a
    /// PEM file of CA certificates, or a directory, either with ca-cert.pem
    /// (and client-cert.pem with client-key.pem for a client certificate,
    /// as QEMU lays it out) or of CA certificates (/etc/ssl/certs). An NBD
    /// URL's tls-certificates=DIR comes first [default: the system's CAs,
    /// SSL_CERT_FILE or SSL_CERT_DIR where set].
    #[arg(long, value_name = "FILE|DIR")]
    pub tls_certificates: Option<PathBuf>,

    /// HTTP(S) URLs: a header sent with every request to the URL's host
    /// (not to another host it redirects to), as curl's -H: 'Authorization:
    /// Bearer TOKEN', or a KubeVirt export's 'x-kubevirt-export-token:
    /// TOKEN'. @FILE reads headers from FILE, one a line, as curl's -H @FILE
    /// does: a token then stays out of ps and the shell's history (a
    /// KubeVirt export's header secret, mounted, is such a file).
    /// Repeatable. A user and password in the URL
    /// (https://user:password@host/...) are sent as basic auth; any password
    /// is shown as *** in every output line and message.
    #[arg(long = "header", value_name = "'NAME: VALUE'|@FILE", value_parser = parse_header_arg)]
    pub headers: Vec<HeaderArg>,

    /// HTTP(S) URLs: tries after the first for a request that failed on the
    /// way (a reset connection, a timeout, 408, 429, 502, 503, 504), the
    /// first at once, then after 0.25, 0.5, 1, 2, 4 s; then the input fails
    /// naming the range and the last error [default: 4].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=100))]
    pub retries: Option<u32>,

    /// Bytes per read (suffixes k, m), rounded up to whole blocks [default: 1m].
    /// Whatever the depths, the reads in flight hold at most 256 MiB (one
    /// read, two with --io-depth, when a read is larger): depths are cut to fit.
    #[arg(long, value_name = "SIZE", value_parser = parse_read_size)]
    pub read_size: Option<usize>,

    /// Reads and digest jobs queued ahead of the digest workers [default: 16];
    /// reads on the digest threads (--io-depth 0) at most 256 MiB / read size.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=blkjob::MAX_QUEUE_DEPTH as i64))]
    pub queue_depth: Option<u16>,

    /// Reads in flight at once, on reading threads apart from the digest
    /// threads (fio's iodepth); 0 runs each read on a digest thread
    /// [default: 4 for files and devices read with direct I/O (4 MiB of
    /// reads: up to 16 smaller ones, fewer larger ones), 16 for NBD URLs
    /// (16 MiB of reads: fewer with a larger --read-size), up to 64 for
    /// HTTP(S) URLs (16 MiB of them, up to 64 MiB for a server whose first
    /// reply took over 5 ms: small reads of scattered clusters wait on the
    /// network as long as large ones), else 0]. At
    /// most 256 MiB / (2 × read size): each read may have a second buffer
    /// waiting for a digest thread (2 with --read-size 64m).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(0..=blkjob::MAX_IO_DEPTH as i64))]
    pub io_depth: Option<u16>,
}

impl InputArgs {
    /// The job these options ask for: what was not asked for takes the
    /// library's default ([`blkjob::JobSpec`]).
    pub fn spec(&self) -> JobSpec {
        JobSpec {
            construction: self.construction.unwrap_or_default(),
            digest: self.digest,
            block_size: self.block_size,
            threads: self.threads.map(usize::from),
            queue_depth: self.queue_depth.map(usize::from),
            read_size: self.read_size,
            io_depth: self.io_depth.map(usize::from),
            open: self.open_options(),
            cancel: Default::default(),
            keyed: false,
        }
    }

    /// The checked job, its digest and block size asked for, else
    /// `saved` (a saved map's), else the defaults; a value the parsers
    /// let through and the library refuses is a usage error.
    pub fn job(&self, saved: Option<(Algorithm, usize)>) -> Job {
        InputArgs::resolve(self.spec(), saved)
    }

    /// [`InputArgs::job`] for a `spec` the command has added to (say, an
    /// NBD dirty bitmap to negotiate).
    pub fn resolve(spec: JobSpec, saved: Option<(Algorithm, usize)>) -> Job {
        match spec.resolve(saved) {
            Ok(job) => job,
            Err(e) => {
                clap::Error::raw(clap::error::ErrorKind::InvalidValue, format!("{e}\n")).exit()
            }
        }
    }

    /// How to open images.
    pub fn open_options(&self) -> OpenOptions {
        OpenOptions {
            cache: self.cache,
            // A command owns its process's signals, so it may install the
            // SIGBUS handler mapped reads need.
            map: match (self.mmap, self.no_mmap) {
                (true, _) => MapReads::Always,
                (_, true) => MapReads::Never,
                _ => MapReads::Auto,
            },
            format: self.format,
            no_backing: self.no_backing,
            secret_file: self.secret_file.clone(),
            keyfile: self.keyfile.clone(),
            force_share: self.force_share,
            nbd: self.nbd_options(),
            http: self.http_options(),
            random_access: false,
            chain: self.chain,
            size: self.size,
            // The job sets it from the construction (blkjob::exact_size).
            exact_size: false,
        }
    }

    /// How to reach HTTP(S) servers.
    pub fn http_options(&self) -> HttpOptions {
        HttpOptions {
            timeout: self.timeout,
            tls_certificates: self.tls_certificates.clone(),
            headers: self.headers.iter().flat_map(|h| h.0.clone()).collect(),
            retries: self.retries.unwrap_or(blkimage::http::DEFAULT_RETRIES),
        }
    }

    /// How to connect to NBD servers.
    pub fn nbd_options(&self) -> NbdOptions {
        NbdOptions {
            timeout: self.timeout,
            tls_certificates: self.tls_certificates.clone(),
            ..Default::default()
        }
    }
}

/// What one `--header` gives: a header, or those of a file (`@FILE`).
#[derive(Clone, Debug)]
pub struct HeaderArg(pub Vec<(String, String)>);

/// `--header`'s value: `Name: value`, or `@FILE` as curl's `-H` takes it
/// (read when the command line is parsed, as curl does).
fn parse_header_arg(s: &str) -> Result<HeaderArg, String> {
    match s.strip_prefix('@') {
        Some(path) => blkimage::http::read_headers(std::path::Path::new(path))
            .map(HeaderArg)
            .map_err(|e| e.to_string()),
        None => blkimage::http::parse_header(s).map(|h| HeaderArg(vec![h])),
    }
}

/// Parse the command line of a command that makes maps with `cmd` (its
/// `A::command()` with `-h` summarized: [`crate::help`]), and a digest that
/// computes no block digests (`null`) is a usage error, since its map
/// would say nothing.
pub fn parse_map_args<A: clap::Parser>(cmd: clap::Command, input: impl Fn(&A) -> &InputArgs) -> A {
    let args: A = crate::help::parse(cmd);
    if let Some(a) = input(&args).digest.filter(|a| a.output_len() == 0) {
        A::command()
            .error(
                clap::error::ErrorKind::InvalidValue,
                format!("invalid value '{a}' for '--digest <NAME>': digest {a} computes no block digests"),
            )
            .exit();
    }
    args
}

/// The options of [`InputArgs`] that say how to hash, not how to open an
/// image: they mean nothing to a command that only opens one (`blkmap
/// bitmaps`), which hides them ([`only_open_options`]) and refuses them
/// ([`InputArgs::refuse_hashing`]).
const HASHING: &[(&str, &str)] = &[
    ("construction", "--construction"),
    ("digest", "--digest"),
    ("block_size", "--block-size"),
    ("threads", "--threads"),
    ("cache", "--cache"),
    ("read_size", "--read-size"),
    ("queue_depth", "--queue-depth"),
    ("io_depth", "--io-depth"),
];

/// `cmd` without the hashing options of [`InputArgs`] in its help and
/// manual: for a command that only opens an image.
pub fn only_open_options(cmd: clap::Command) -> clap::Command {
    HASHING
        .iter()
        .fold(cmd, |c, (id, _)| c.mut_arg(*id, |a| a.hide(true)))
}

impl InputArgs {
    /// A usage error (exit 2) if a hashing option was given to `what`, a
    /// command that only opens an image ([`only_open_options`]).
    pub fn refuse_hashing(&self, cmd: &mut clap::Command, what: &str) {
        let given = [
            self.construction.is_some(),
            self.digest.is_some(),
            self.block_size.is_some(),
            self.threads.is_some(),
            self.cache,
            self.read_size.is_some(),
            self.queue_depth.is_some(),
            self.io_depth.is_some(),
        ];
        if let Some(((_, flag), _)) = HASHING.iter().zip(given).find(|(_, g)| *g) {
            cmd.error(
                clap::error::ErrorKind::ArgumentConflict,
                format!("{flag} does not apply to {what}: nothing is hashed"),
            )
            .exit();
        }
    }
}

/// An image format by name (raw, qcow2, or one QEMU reads).
pub fn parse_format(s: &str) -> Result<Format, String> {
    s.parse()
}

/// A format to write (blksync's `-O`): [`parse_format`]'s but
/// virtnbdbackup's streams, which are read only.
///
/// ```
/// assert!(blkcli::args::parse_output_format("qcow2").is_ok());
/// assert!(blkcli::args::parse_output_format("virtnbdbackup").is_err());
/// ```
pub fn parse_output_format(s: &str) -> Result<Format, String> {
    match s.parse()? {
        Format::Virtnbdbackup => Err(
            "virtnbdbackup streams are read, not written: raw, qcow2 or another format \
             qemu-img creates"
                .to_string(),
        ),
        f => Ok(f),
    }
}

/// A parser that also names the values it takes, so that shell completion
/// offers them (clap learns them from `possible_values`); parsing and its
/// error messages stay `parse`'s.
#[derive(Clone)]
pub struct Named<T> {
    parse: fn(&str) -> Result<T, String>,
    names: fn() -> Vec<&'static str>,
}

impl<T: Clone + Send + Sync + 'static> clap::builder::TypedValueParser for Named<T> {
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<T, clap::Error> {
        self.parse.parse_ref(cmd, arg, value)
    }

    fn possible_values(
        &self,
    ) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
        Some(Box::new(
            (self.names)()
                .into_iter()
                .map(clap::builder::PossibleValue::new),
        ))
    }
}

/// `--format`'s parser: [`parse_format`], completing the format names.
pub fn format_parser() -> Named<Format> {
    Named {
        parse: parse_format,
        names: || {
            let mut names = vec!["raw", "qcow2", "virtnbdbackup"];
            names.extend_from_slice(blkimage::QEMU_FORMATS);
            names
        },
    }
}

/// `--construction`'s parser, completing the construction names.
pub fn construction_parser() -> Named<Construction> {
    Named {
        parse: |s| {
            s.parse()
                .map_err(|e: blkhash::UnknownConstruction| e.to_string())
        },
        names: || blkhash::CONSTRUCTIONS.iter().map(|c| c.name()).collect(),
    }
}

/// `--digest`'s parser: [`parse_digest`], completing the digest names.
pub fn digest_parser() -> Named<Algorithm> {
    Named {
        parse: parse_digest,
        names: || blkhash::Algorithm::listed().map(|a| a.name()).collect(),
    }
}

/// A digest by its OpenSSL name; `null` (no digest, for measuring reads) too.
pub fn parse_digest(s: &str) -> Result<Algorithm, String> {
    s.parse()
        .map_err(|e: blkhash::UnknownAlgorithm| crate::hints::unknown_digest(&e))
}

/// A read size: a multiple of 4k from 4k to 256m (suffixes k, m).
pub fn parse_read_size(s: &str) -> Result<usize, String> {
    let n = parse_size(s)?;
    let n = usize::try_from(n).map_err(|_| blkjob::JobError::ReadSize(n).to_string())?;
    blkjob::check_read_size(n).map_err(|e| e.to_string())
}

/// `-p` and the manual's options (`--man`, `--completions`, handled before
/// the rest is parsed by [`crate::manual::early`]): what a map command
/// offers besides its inputs, flattened into its arguments.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ShowArgs {
    /// `-p`/`--progress[=FD]`.
    #[command(flatten)]
    pub progress: crate::progress::ProgressArgs,
    /// `--man`, `--completions SHELL`.
    #[command(flatten)]
    pub manual: crate::manual::ManualArgs,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        input: InputArgs,
    }

    #[test]
    fn read_sizes() {
        assert_eq!(parse_read_size("1m"), Ok(1 << 20));
        assert!(parse_read_size("1000").is_err());
        assert!(parse_read_size("512m").is_err());
    }

    #[test]
    fn defaults_and_saved_params() {
        let params = |j: Job| (j.algorithm(), j.block_size());
        let a = Cmd::parse_from(["cmd"]).input;
        assert_eq!(params(a.job(None)), (Algorithm::Sha256, 64 << 10));
        assert_eq!(
            params(a.job(Some((Algorithm::Md5, 4096)))),
            (Algorithm::Md5, 4096)
        );
        let j = a.job(None);
        assert_eq!((j.read_size(), j.queue_depth()), (1 << 20, 16));
        let a = Cmd::parse_from(["cmd", "-d", "blake3", "--block-size", "1m", "-t", "3"]).input;
        assert_eq!(
            params(a.job(Some((Algorithm::Md5, 4096)))),
            (Algorithm::Blake3, 1 << 20)
        );
        assert_eq!(a.job(None).threads(), 3);
        let a = Cmd::parse_from(["cmd", "--construction", "imageio"]).input;
        assert_eq!(params(a.job(None)), (Algorithm::Blake2b256, 4 << 20));
        let a = Cmd::parse_from(["cmd", "--construction", "pbs", "-d", "sha3_256"]).input;
        assert_eq!(params(a.job(None)), (Algorithm::Sha3_256, 4 << 20));
        assert_eq!(a.job(None).construction(), Construction::Pbs);
    }

    #[test]
    fn one_validation_for_every_command() {
        for bad in [
            &["cmd", "--block-size", "1000"][..],
            &["cmd", "-t", "0"],
            &["cmd", "-d", "sha3"],
            &["cmd", "--read-size", "100"],
            &["cmd", "--queue-depth", "0"],
            &["cmd", "-f", "iso"],
            &["cmd", "--construction", "vdsm"],
        ] {
            assert!(Cmd::try_parse_from(bad).is_err(), "{bad:?}");
        }
    }
}
