//! Every command's manual page and completion scripts: the sections users
//! look for, and the digest and format names offered where options take them.

use std::process::{Command, Output};

fn run(exe: &str, args: &[&str]) -> Output {
    Command::new(exe).args(args).output().expect(exe)
}

const COMMANDS: [(&str, &str); 3] = [
    ("blkmap", env!("CARGO_BIN_EXE_blkmap")),
    ("blkdiff", env!("CARGO_BIN_EXE_blkdiff")),
    ("blksync", env!("CARGO_BIN_EXE_blksync")),
];

#[test]
fn man_pages_have_exit_status_and_examples() {
    for (name, exe) in COMMANDS {
        let out = run(exe, &["--man"]);
        assert!(out.status.success(), "{name}");
        let page = String::from_utf8(out.stdout).unwrap();
        assert!(page.contains(&format!(".TH {name} 1")), "{name}: {page}");
        for section in [
            ".SH NAME",
            ".SH SYNOPSIS",
            ".SH OPTIONS",
            ".SH \"EXIT STATUS\"",
            ".SH EXAMPLES",
        ] {
            assert!(page.contains(section), "{name}: no {section}");
        }
        // The one-line summary is the command's own, not the package's.
        assert!(!page.contains("blkmap, blkdiff and blksync"), "{name}");
    }
}

#[test]
fn completions_offer_digest_and_format_names() {
    for (name, exe) in COMMANDS {
        for shell in ["bash", "zsh", "fish"] {
            let out = run(exe, &["--completions", shell]);
            assert!(out.status.success(), "{name} {shell}");
            let script = String::from_utf8(out.stdout).unwrap();
            assert!(script.contains("block-size"), "{name} {shell}");
            assert!(
                script.contains("sha512-256") && script.contains("blake3"),
                "{name} {shell}: digests"
            );
            assert!(
                script.contains("qcow2") && script.contains("vmdk"),
                "{name} {shell}: formats"
            );
        }
        // Alone, as blksum's: with anything else it is a usage error.
        assert_eq!(
            run(exe, &["--completions", "bash", "x"]).status.code(),
            Some(2),
            "{name}"
        );
        // Without them the command's arguments are still required.
        assert_eq!(run(exe, &[]).status.code(), Some(2), "{name}");
    }
}

#[test]
fn one_letter_one_meaning_c_is_blksums_check_only() {
    let out = run(env!("CARGO_BIN_EXE_blksync"), &["-c", "a", "b"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unexpected argument '-c'"));
}

/// `page` as `man` formats it at 80 columns, and what `man --warnings`
/// says of it (nothing for clean roff).
fn man(page: &[u8]) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("page.1");
    std::fs::write(&file, page).unwrap();
    let out = Command::new("man")
        .args(["--warnings", "-l"])
        .arg(&file)
        .env("MANWIDTH", "80")
        .output()
        .expect("man runs (scripts/setup.sh installs man-db)");
    assert!(out.status.success());
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn man_pages_render_cleanly_and_document_every_subcommand() {
    for (name, exe) in COMMANDS {
        let page = run(exe, &["--man"]).stdout;
        let (text, warnings) = man(&page);
        assert_eq!(warnings, "", "{name}");
        // Markdown's backticks are set in bold, not shown.
        assert!(!text.contains('`'), "{name}: {text}");
        let roff = String::from_utf8(page).unwrap();
        let synopsis =
            &roff[roff.find(".SH SYNOPSIS").unwrap()..roff.find(".SH DESCRIPTION").unwrap()];
        // Options with their values, repeated arguments with "...".
        assert!(
            synopsis.contains("[\\fB\\-\\-block\\-size\\fR\\ \\fISIZE\\fR]"),
            "{name}: {synopsis}"
        );
        assert!(
            synopsis.contains("[\\fB\\-p\\fR|\\fB\\-\\-progress\\fR[=\\fIFD\\fR]]")
                || name == "blksync",
            "{name}: {synopsis}"
        );
    }
    let (text, _) = man(&run(COMMANDS[0].1, &["--man"]).stdout);
    for heading in ["BLKMAP MERGE", "BLKMAP CHECKSUM"] {
        let at = text
            .find(&format!("\n{heading}\n"))
            .unwrap_or_else(|| panic!("no {heading}: {text}"));
        assert!(text[at..].contains("--name NAME"), "{heading}: {text}");
        assert!(text[at..].contains("--tag"), "{heading}: {text}");
    }
    assert!(
        text.contains("blkmap merge [--name NAME] [--tag]"),
        "{text}"
    );
    assert!(text.contains("OUT PART..."), "{text}");
}
