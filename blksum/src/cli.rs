//! Command-line arguments.

use blkcli::args::InputArgs;
use blkcli::manual::{ManualArgs, Page};
use blkcli::progress::ProgressArgs;
use clap::Parser;

/// Compute blkhash checksums of disk images: raw and qcow2 files, the other
/// formats QEMU reads (vmdk, vdi, vhdx, ...), block devices, NBD URLs,
/// HTTP(S) URLs of raw and qcow2 images (read by range requests: only what
/// a qcow2 image holds is fetched) and standard input; any of them
/// compressed with gzip, xz or zstd (disk.raw.xz, disk.img.gz) is the image
/// it holds.
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

    /// List the digests and exit.
    #[arg(short, long)]
    pub list_digests: bool,

    #[command(flatten)]
    pub input: InputArgs,

    #[command(flatten)]
    pub progress: ProgressArgs,

    /// Hash up to N inputs at once; output stays in argument order. Each
    /// input already uses every core: more jobs only help inputs that wait
    /// on I/O, like many small files or slow servers.
    #[arg(short, long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub jobs: u16,

    /// Write BSD-style lines that name the construction, digest and block
    /// size: "CONSTRUCTION/DIGEST[/BLOCK] (NAME) = HEX", as
    /// "blkhash/sha256 (disk.img) = ..." or "imageio/blake2b-256 (disk.img)
    /// = ..." (BLOCK when not the construction's default). --check of such
    /// a file needs no options.
    #[arg(long, conflicts_with_all = ["check", "json"])]
    pub tag: bool,

    /// End each output line with NUL, not newline, and write names as they
    /// are (no escaping), as sha256sum --zero: for names with newlines, read
    /// with xargs -0 or read -d ''. Not with --check, as sha256sum.
    #[arg(short, long, conflicts_with_all = ["check", "json", "output"])]
    pub zero: bool,

    /// Write one JSON document for the run: per input its name, format,
    /// virtual size, digest, block size, checksum, and data, zero and
    /// unallocated bytes (or its error).
    #[arg(long, conflicts_with = "check")]
    pub json: bool,

    /// The output format, as qemu-img's --output: human (checksum lines,
    /// the default) or json (as --json).
    #[arg(long, value_name = "FORMAT", value_parser = ["human", "json"], conflicts_with_all = ["check", "tag", "json"])]
    pub output: Option<String>,

    /// Save progress in FILE every few seconds, and continue from it when
    /// it exists: a run stopped in any way (Ctrl-C, a crash, a lost
    /// connection, a reboot) resumes where it was. FILE is checked against
    /// the image first (every file the image reads, backing and data files
    /// included: device, inode, size and times; an NBD export's address,
    /// name and size; a URL's file and every file it reads over HTTP(S):
    /// URL, length, ETag and Last-Modified; a few sampled data blocks) and
    /// removed on success; a
    /// second run on the same FILE fails at once. It is a
    /// part of the image's block map (blkmap's format), replaced atomically
    /// at each save. One image; not standard input.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["check", "jobs"])]
    pub checkpoint: Option<std::path::PathBuf>,

    /// Seconds between saves of --checkpoint (fractions allowed; a save
    /// that takes long spaces the next ones) [default: 5].
    #[arg(long, value_name = "SECONDS", requires = "checkpoint", value_parser = blkcli::units::parse_interval)]
    pub checkpoint_interval: Option<std::time::Duration>,

    /// On success, leave the image's whole block map in the --checkpoint
    /// FILE instead of removing it (blkmap checksum, blkdiff and blksync
    /// read it; a run given it again finishes without reading).
    #[arg(long, requires = "checkpoint")]
    pub keep_checkpoint: bool,

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

    #[command(flatten)]
    pub manual: ManualArgs,
}

/// The command, with `-h` a summary: the options a user reaches for first.
pub fn command() -> clap::Command {
    use blkcli::help::*;
    let shown = [
        ("list_digests", "List the digests"),
        CONSTRUCTION,
        DIGEST,
        BLOCK_SIZE,
        ("check", "Verify the checksums listed in the FILEs"),
        ("tag", "Lines that name the digest and block size"),
        ("json", "One JSON document for the run"),
        PROGRESS,
        ("jobs", "Hash up to N inputs at once"),
        ("checkpoint", "Save progress in FILE; resume from it"),
        FORMAT,
        NO_BACKING,
        FORCE_SHARE,
        CACHE,
        THREADS,
    ];
    summarize(<Args as clap::CommandFactory>::command(), &shown)
}

/// What the manual page says beyond the options.
pub const PAGE: Page = Page {
    exit_status: &[
        (
            "0",
            "Every input was hashed (with --check: every listed image matched).",
        ),
        (
            "1",
            "An input could not be read or hashed, or with --check an image did not match, \
             was missing or a line was malformed (with --strict); the other inputs are still done.",
        ),
        (
            "2",
            "Usage error: an unknown option, digest or format, a bad block size.",
        ),
        (
            "130, 143",
            "Stopped by SIGINT (Ctrl-C) or SIGTERM; no checksum is printed for the input being read.",
        ),
    ],
    examples: &[
        (
            "Hash a qcow2 image (only its allocated data is read):",
            "blksum disk.qcow2",
        ),
        (
            "Save checksums and verify them later, as with sha256sum:",
            "blksum *.img > SUMS && blksum -c SUMS",
        ),
        (
            "A tagged line carries the digest and block size for --check:",
            "blksum --tag -d blake3 --block-size 1m disk.raw",
        ),
        (
            "Hash an export of an NBD server:",
            "blksum nbd+unix:///?socket=/tmp/nbd.sock",
        ),
        (
            "Check that an imported disk holds the published image, reading only the image's allocated clusters over HTTPS:",
            "blksum https://images.example/disk.qcow2 /dev/vg/disk",
        ),
        (
            "Hash a large export, resuming after an interruption (run it again):",
            "blksum --checkpoint disk.ckpt nbd://server/disk",
        ),
        (
            "Hash a stream (holes cannot be skipped in a pipe):",
            "xz -dc disk.raw.xz | blksum",
        ),
    ],
};
