//! `-h`, a summary: the options a user reaches for first, one line each,
//! and where the others are; `--help` stays complete (every option with
//! its whole text), and so does the manual page.
//!
//! Each command names the options its `-h` shows, with a short text, from
//! the ones here or its own; every other option is hidden from `-h` only.
//! So an option added later (a transport's) is in `--help` and the manual
//! at once, and in `-h` once someone decides it is among the first.

use clap::{Command, FromArgMatches};

/// One line of `-h`: an argument's id (its field's name) and its text.
pub type Short = (&'static str, &'static str);

/// `--construction`.
pub const CONSTRUCTION: Short = (
    "construction",
    "blkhash, imageio (oVirt's checksum API) or pbs (a PBS index_csum)",
);
/// `-d, --digest`.
pub const DIGEST: Short = ("digest", "Digest [default: sha256] (blksum -l lists them)");
/// `--block-size`.
pub const BLOCK_SIZE: Short = ("block_size", "Block size, 512 to 64m [default: 64k]");
/// `-t, --threads`.
pub const THREADS: Short = ("threads", "Digest threads [default: the number of cores]");
/// `-f, --format`.
pub const FORMAT: Short = (
    "format",
    "raw, qcow2, vmdk, vdi, vhdx, ... [default: probed]",
);
/// `--no-backing`.
pub const NO_BACKING: Short = (
    "no_backing",
    "Refuse qcow2 images that name other files (untrusted images)",
);
/// `-U, --force-share`.
pub const FORCE_SHARE: Short = (
    "force_share",
    "Read images that a VM or qemu-nbd has open for writing",
);
/// `--cache`.
pub const CACHE: Short = ("cache", "Read through the page cache [default: direct I/O]");
/// `--timeout`.
pub const TIMEOUT: Short = (
    "timeout",
    "NBD: fail a server silent this long [default: none]",
);
/// `-p, --progress`.
pub const PROGRESS: Short = ("progress", "Show progress on standard error");

/// What `-h` says after the options.
const MORE: &str = "More options: --help (all of them), --man (the manual page).";

/// `cmd` with a summary for `-h`: the arguments in `shown` with their short
/// text (their whole text stays for `--help`), the others left out of
/// `-h`, and a line saying where they are. Positional arguments, `-h` and
/// `-V` are always shown.
pub fn summarize(cmd: Command, shown: &[Short]) -> Command {
    let ids: Vec<String> = cmd
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .collect();
    let mut cmd = cmd.after_help(MORE);
    for id in ids {
        let short = shown.iter().find(|(s, _)| *s == id).map(|(_, t)| *t);
        cmd = cmd.mut_arg(&id, |a| {
            if a.is_positional() || matches!(id.as_str(), "help" | "version") {
                return a;
            }
            match short {
                Some(text) => {
                    let whole = a.get_long_help().or(a.get_help()).cloned();
                    let a = a.help(text);
                    match whole {
                        Some(w) => a.long_help(w),
                        None => a,
                    }
                }
                None => a.hide_short_help(true),
            }
        });
    }
    // --help ends as it did: the options are all there.
    let long = cmd.get_after_long_help().cloned().unwrap_or_default();
    cmd.after_long_help(long)
}

/// `cmd` (a subcommand) with `about`, one line, as the list of subcommands
/// in its parent's `-h` shows it; its whole text stays for `--help`.
pub fn short_about(cmd: Command, about: &'static str) -> Command {
    let whole = cmd.get_long_about().or(cmd.get_about()).cloned();
    let cmd = cmd.about(about);
    match whole {
        Some(w) => cmd.long_about(w),
        None => cmd,
    }
}

/// Parse the command line with `cmd` (`A::command()` as [`summarize`] and
/// the command made it), exiting on an error or on `-h`/`--help`/`-V` as
/// `A::parse` does.
pub fn parse<A: FromArgMatches>(cmd: Command) -> A {
    let matches = cmd.get_matches();
    A::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    /// A command with one option shown and one not.
    #[derive(Parser)]
    #[command(name = "cmd")]
    struct Cmd {
        /// Digest, by its OpenSSL name: a long text of the kind --help
        /// shows.
        #[arg(short, long)]
        digest: Option<String>,
        /// Read through the page cache.
        #[arg(long)]
        cache: bool,
    }

    #[test]
    fn short_help_shows_the_chosen_options_in_short_and_long_help_all() {
        let mut cmd = summarize(Cmd::command(), &[DIGEST]);
        let short = cmd.render_help().to_string();
        let long = cmd.render_long_help().to_string();
        assert!(short.contains(DIGEST.1), "{short}");
        assert!(!short.contains("--cache"), "{short}");
        assert!(short.contains(MORE), "{short}");
        assert!(long.contains("a long text of the kind --help"), "{long}");
        assert!(long.contains("--cache"), "{long}");
        assert!(!long.contains(MORE), "{long}");
    }
}
