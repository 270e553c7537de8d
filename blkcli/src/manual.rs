//! `--man` and `--completions SHELL`, as every command has them: the
//! manual page is clap's (name, synopsis, description, options) with the
//! sections clap cannot know, EXIT STATUS and EXAMPLES, and the completion
//! scripts offer the digest and format names where an option takes one.

use clap::CommandFactory;
use std::io::{self, Write};
use std::process::ExitCode;

/// The two options, flattened into each command's arguments.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ManualArgs {
    /// Print a shell completion script and exit.
    #[arg(long, value_name = "SHELL", exclusive = true)]
    pub completions: Option<clap_complete::Shell>,

    /// Print the manual page (roff) and exit.
    #[arg(long, exclusive = true)]
    pub man: bool,
}

/// What a command's manual says beyond its options.
pub struct Page {
    /// Exit statuses and what each means.
    pub exit_status: &'static [(&'static str, &'static str)],
    /// Examples: what it does, then the command line.
    pub examples: &'static [(&'static str, &'static str)],
}

/// If the command line asks for `--man` or `--completions`, print it and
/// return the exit code; otherwise `None` and the command parses its
/// arguments as usual. Called first, because the command's required
/// arguments (`blkmap IMAGE OUT`) are not given with these options.
pub fn early<C: CommandFactory>(page: &Page) -> Option<ExitCode> {
    let lenient = C::command().mut_args(|a| a.required(false));
    // Any other error is reported by the command's own parse.
    let matches = lenient.try_get_matches().ok()?;
    let manual = <ManualArgs as clap::FromArgMatches>::from_arg_matches(&matches).ok()?;
    manual.print::<C>(page)
}

impl ManualArgs {
    /// If `--man` or `--completions` was given, print it and return the
    /// exit code; otherwise `None`.
    pub fn print<C: CommandFactory>(&self, page: &Page) -> Option<ExitCode> {
        let mut cmd = C::command();
        let name = cmd.get_name().to_string();
        let mut out = io::stdout().lock();
        let result = if let Some(shell) = self.completions {
            clap_complete::generate(shell, &mut cmd, name.clone(), &mut out);
            Ok(())
        } else if self.man {
            render(cmd, page, &mut out)
        } else {
            return None;
        };
        Some(match result.and_then(|()| out.flush()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{name}: standard output: {e}");
                ExitCode::FAILURE
            }
        })
    }
}

/// The manual page: clap's sections in the usual order, with EXIT STATUS
/// and EXAMPLES before VERSION.
pub fn render(cmd: clap::Command, page: &Page, out: &mut dyn Write) -> io::Result<()> {
    let man = clap_mangen::Man::new(cmd);
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    man.render_options_section(out)?;
    writeln!(out, ".SH \"EXIT STATUS\"")?;
    for (status, meaning) in page.exit_status {
        writeln!(out, ".TP\n.B {}\n{}", roff(status), roff(meaning))?;
    }
    writeln!(out, ".SH EXAMPLES")?;
    for (what, line) in page.examples {
        writeln!(
            out,
            ".PP\n{}\n.PP\n.RS 4\n.nf\n{}\n.fi\n.RE",
            roff(what),
            roff(line)
        )?;
    }
    man.render_version_section(out)
}

/// Text as roff shows it: backslashes doubled, hyphens as minus signs (so
/// options can be copied), and a leading dot or quote that would start a
/// request escaped.
fn roff(s: &str) -> String {
    let mut t = s.replace('\\', "\\e").replace('-', "\\-");
    if t.starts_with('.') || t.starts_with('\'') {
        t.insert_str(0, "\\&");
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    #[command(name = "demo", version, about = "A demo.")]
    struct Demo {
        #[arg(long)]
        block_size: Option<String>,
    }

    #[test]
    fn the_page_has_every_section_in_order() {
        let page = Page {
            exit_status: &[("0", "Same."), ("2", "Trouble.")],
            examples: &[("Hash an image.", "demo --block-size 1m disk.img")],
        };
        let mut out = Vec::new();
        render(Demo::command(), &page, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let at = |s: &str| text.find(s).unwrap_or_else(|| panic!("{s} in {text}"));
        assert!(at(".SH NAME") < at(".SH OPTIONS"));
        assert!(at(".SH OPTIONS") < at(".SH \"EXIT STATUS\""));
        assert!(at(".SH \"EXIT STATUS\"") < at(".SH EXAMPLES"));
        assert!(at(".SH EXAMPLES") < at(".SH VERSION"));
        assert!(text.contains("demo \\-\\-block\\-size 1m disk.img"));
    }

    #[test]
    fn roff_escapes_what_would_be_requests() {
        assert_eq!(roff(".x a\\b"), "\\&.x a\\eb");
        assert_eq!(roff("'q"), "\\&'q");
    }
}
