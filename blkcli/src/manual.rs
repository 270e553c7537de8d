//! `--man` and `--completions SHELL`, as every command has them: the
//! manual page is clap's (name, description, options) with what clap's
//! generator leaves out or gets wrong: a SYNOPSIS that shows each option's
//! value and repeated arguments with `...`, a section per subcommand with
//! its options, `literal` text in bold (the help's Markdown backticks), and
//! the sections clap cannot know, EXIT STATUS and EXAMPLES. The completion
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
                crate::output::failed(&name, &e);
                ExitCode::FAILURE
            }
        })
    }
}

/// The manual page: clap's sections in the usual order, a section per
/// subcommand after OPTIONS, and EXIT STATUS and EXAMPLES before VERSION.
pub fn render(mut cmd: clap::Command, page: &Page, out: &mut dyn Write) -> io::Result<()> {
    // Built: arguments know how many values they take, -h and -V are there.
    cmd.build();
    let name = cmd.get_name().to_string();
    let man = clap_mangen::Man::new(cmd.clone());
    man.render_title(out)?;
    let mut text = Vec::new();
    man.render_name_section(&mut text)?;
    // Not justified (.na): the words of a synopsis are not a paragraph.
    writeln!(text, ".SH SYNOPSIS\n.na")?;
    synopsis(&cmd, &name, &mut text)?;
    for sub in subcommands(&cmd) {
        writeln!(text, ".br")?;
        synopsis(sub, &format!("{name} {}", sub.get_name()), &mut text)?;
    }
    writeln!(text, ".ad")?;
    man.render_description_section(&mut text)?;
    man.render_options_section(&mut text)?;
    for sub in subcommands(&cmd) {
        let full = format!("{name} {}", sub.get_name());
        writeln!(text, ".SH \"{}\"", roff(&full.to_uppercase()))?;
        synopsis(sub, &full, &mut text)?;
        let sub_man = clap_mangen::Man::new(sub.clone());
        let mut sub_text = Vec::new();
        sub_man.render_description_section(&mut sub_text)?;
        sub_man.render_options_section(&mut sub_text)?;
        // Under the subcommand's heading: its description as paragraphs,
        // its options as a subsection.
        for line in String::from_utf8_lossy(&sub_text).lines() {
            match line {
                ".SH DESCRIPTION" => writeln!(text, ".PP")?,
                ".SH OPTIONS" => writeln!(text, ".SS Options")?,
                _ => writeln!(text, "{line}")?,
            }
        }
    }
    out.write_all(bold_literals(&String::from_utf8_lossy(&text)).as_bytes())?;
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

/// The subcommands a page documents (not clap's `help`).
fn subcommands(cmd: &clap::Command) -> impl Iterator<Item = &clap::Command> {
    cmd.get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
}

/// One SYNOPSIS line for `cmd`, called `name`: every option with its value
/// (`[--block-size SIZE]`, `[-p|--progress[=FD]]`), then the positional
/// arguments, `...` after those that repeat; spaces inside a bracket do
/// not break, nor does hyphenation split a word.
fn synopsis(cmd: &clap::Command, name: &str, out: &mut dyn Write) -> io::Result<()> {
    let mut words = vec![format!("\\fB{}\\fR", roff(name))];
    let value = |a: &clap::Arg| {
        let v = a
            .get_value_names()
            .and_then(|v| v.first().map(|n| n.to_string()))
            .unwrap_or_else(|| a.get_id().to_string().to_uppercase());
        format!("\\fI{}\\fR", roff(&v))
    };
    let shown = |a: &&clap::Arg| !a.is_hide_set();
    for a in cmd
        .get_arguments()
        .filter(shown)
        .filter(|a| !a.is_positional())
    {
        let mut names = Vec::new();
        if let Some(c) = a.get_short() {
            names.push(format!("\\fB\\-{}\\fR", roff(&c.to_string())));
        }
        if let Some(l) = a.get_long() {
            names.push(format!("\\fB\\-\\-{}\\fR", roff(l)));
        }
        let mut w = names.join("|");
        let range = a.get_num_args().unwrap_or_default();
        if a.get_action().takes_values() && range.takes_values() {
            if range.min_values() == 0 {
                w += &format!("[={}]", value(a));
            } else {
                w += &format!("\\ {}", value(a));
            }
        }
        words.push(format!("[{w}]"));
    }
    for a in cmd.get_positionals().filter(shown) {
        let many = matches!(a.get_action(), clap::ArgAction::Append)
            || a.get_num_args().is_some_and(|r| r.max_values() > 1);
        let dots = if many { "..." } else { "" };
        words.push(match a.is_required_set() {
            true => format!("{}{dots}", value(a)),
            false => format!("[{}]{dots}", value(a)),
        });
    }
    // \% keeps the formatter from hyphenating an option across lines.
    let words: Vec<String> = words.iter().map(|w| format!("\\%{w}")).collect();
    writeln!(out, "{}", words.join(" "))
}

/// Text marked up as Markdown's `literal` (the help's backticks, which the
/// terminal shows as they are) set in bold, as manual pages set commands
/// and options; a backtick without its pair is left as it is. Requests
/// (lines starting with a dot) are left alone.
fn bold_literals(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let pairs = line.matches('`').count() / 2;
        if line.starts_with('.') || pairs == 0 {
            out.push_str(line);
        } else {
            let mut parts = line.split('`');
            out.push_str(parts.next().unwrap_or_default());
            for (i, part) in parts.enumerate() {
                match (i % 2, i < 2 * pairs) {
                    (0, true) => out.push_str("\\fB"),
                    (_, true) => out.push_str("\\fR"),
                    (_, false) => out.push('`'),
                }
                out.push_str(part);
            }
        }
        out.push('\n');
    }
    out
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

    /// A command with what clap's own synopsis got wrong: repeated
    /// arguments, options with values, one with an optional value, a
    /// subcommand, backticks in the help.
    #[derive(clap::Parser)]
    #[command(name = "tool", version)]
    struct Tool {
        /// Inputs; see `tool sub`.
        #[arg(value_name = "FILE")]
        files: Vec<String>,
        #[arg(long, value_name = "SIZE")]
        block_size: Option<String>,
        #[arg(short, long, value_name = "FD", num_args = 0..=1, require_equals = true)]
        progress: Option<Option<i32>>,
        #[command(subcommand)]
        command: Option<Sub>,
    }

    #[derive(clap::Subcommand)]
    enum Sub {
        /// Do the other thing to `PART`s.
        Merge {
            /// Where to write.
            #[arg(value_name = "OUT")]
            out: String,
            #[arg(value_name = "PART", required = true)]
            parts: Vec<String>,
            /// A name.
            #[arg(long, value_name = "NAME")]
            name: Option<String>,
        },
    }

    #[test]
    fn the_synopsis_shows_values_repeats_and_subcommands() {
        let page = Page {
            exit_status: &[],
            examples: &[],
        };
        let mut out = Vec::new();
        render(Tool::command(), &page, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let synopsis =
            &text[text.find(".SH SYNOPSIS").unwrap()..text.find(".SH DESCRIPTION").unwrap()];
        assert!(
            synopsis.contains("[\\fB\\-\\-block\\-size\\fR\\ \\fISIZE\\fR]"),
            "{synopsis}"
        );
        assert!(
            synopsis.contains("[\\fB\\-p\\fR|\\fB\\-\\-progress\\fR[=\\fIFD\\fR]]"),
            "{synopsis}"
        );
        assert!(synopsis.contains(" \\%[\\fIFILE\\fR]...\n"), "{synopsis}");
        assert!(synopsis.contains("\\fBtool merge\\fR"), "{synopsis}");
        assert!(
            synopsis.contains("\\fIOUT\\fR \\%\\fIPART\\fR...\n"),
            "{synopsis}"
        );
        assert!(
            !synopsis.contains("help\\fR ["),
            "no help subcommand: {synopsis}"
        );
        // The subcommand's own section, with its options.
        let merge = &text[text.find(".SH \"TOOL MERGE\"").expect("a MERGE section")..];
        assert!(
            merge.contains("Do the other thing to \\fBPART\\fRs\n"),
            "{merge}"
        );
        assert!(merge.contains(".SS Options"), "{merge}");
        assert!(merge.contains("\\fB\\-\\-name\\fR"), "{merge}");
        assert!(!text.contains('`'), "{text}");
    }

    #[test]
    fn backticks_become_bold() {
        assert_eq!(bold_literals("a `b` c `d`\n"), "a \\fBb\\fR c \\fBd\\fR\n");
        assert_eq!(bold_literals("odd `one\n"), "odd `one\n");
        assert_eq!(bold_literals("`a` and `b\n"), "\\fBa\\fR and `b\n");
        assert_eq!(bold_literals(".B `x`\n"), ".B `x`\n");
    }

    #[test]
    fn roff_escapes_what_would_be_requests() {
        assert_eq!(roff(".x a\\b"), "\\&.x a\\eb");
        assert_eq!(roff("'q"), "\\&'q");
    }
}
