//! The C API as C programs use it: the programs in `tests/c/` compiled with
//! the system `cc` against the libblkhash.so cargo built for this test (and
//! once through pkg-config, once statically), run, and run again under
//! valgrind. Nothing is skipped: without cc, pkg-config or valgrind the test
//! fails and says what to install (`scripts/setup.sh` installs them).

use construction::{ALGORITHMS, Algorithm, checksum_of};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// Where cargo put libblkhash.so: the profile directory, two levels above
/// this test binary (`target/<profile>/deps/c_api-<hash>`).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary in target/<profile>/deps")
        .to_path_buf();
    assert!(
        dir.join("libblkhash.so").exists(),
        "{}: no libblkhash.so: cargo test does not build it; cargo build -p libblkhash with this test's profile does (scripts/test.sh runs both)",
        dir.display()
    );
    dir
}

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The directory shared by the tests of this binary, holding the compiled
/// programs and `lib/libblkhash.so.0` (the SONAME the programs ask the
/// loader for) pointing at cargo's libblkhash.so. It is a build output
/// beside the library (`target/<profile>/c-api-tests/`), made anew by the
/// first test of each run: a temporary directory would outlive the tests,
/// since a static is never dropped.
struct Scratch {
    dir: PathBuf,
}

fn scratch() -> &'static Scratch {
    static S: OnceLock<Scratch> = OnceLock::new();
    S.get_or_init(|| {
        let dir = lib_dir().join("c-api-tests");
        if let Err(e) = std::fs::remove_dir_all(&dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            panic!("{}: {e}", dir.display())
        }
        let lib = dir.join("lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::os::unix::fs::symlink(lib_dir().join("libblkhash.so"), lib.join("libblkhash.so.0"))
            .unwrap();
        Scratch { dir }
    })
}

impl Scratch {
    fn path(&self) -> &Path {
        &self.dir
    }

    fn lib(&self) -> PathBuf {
        self.path().join("lib")
    }
}

fn run(cmd: &mut Command) -> Output {
    let shown = format!("{cmd:?}");
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("{shown}: {e} (scripts/setup.sh installs gcc, pkg-config and valgrind)")
    });
    assert!(
        out.status.success(),
        "{shown}: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

const CFLAGS: &[&str] = &[
    "-std=gnu11",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-O2",
    "-g",
    "-pthread",
];

/// Compile `tests/c/NAME.c` against the built library, once per test run.
fn compile(name: &str) -> PathBuf {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let s = scratch();
    let exe = s.path().join(name);
    if !exe.exists() {
        let src = crate_dir().join("tests/c").join(format!("{name}.c"));
        run(Command::new("cc")
            .args(CFLAGS)
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .arg("-I")
            .arg(crate_dir().join("include"))
            .arg("-L")
            .arg(lib_dir())
            .arg("-lblkhash"));
    }
    exe
}

/// Run a compiled program with the scratch lib directory on the loader's path.
fn program(exe: &Path) -> Command {
    let mut c = Command::new(exe);
    c.env("LD_LIBRARY_PATH", scratch().lib());
    c
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("utf-8 output")
}

#[test]
fn api_and_error_paths() {
    let exe = compile("api");
    let out = run(&mut program(&exe));
    assert!(stdout(&out).contains("api: ok"));
}

#[test]
fn the_shared_object_is_libblkhash_so_0() {
    let out = run(Command::new("readelf")
        .arg("-d")
        .arg(lib_dir().join("libblkhash.so")));
    assert!(
        stdout(&out).contains("Library soname: [libblkhash.so.0]"),
        "{}",
        stdout(&out)
    );
    // Only the C API is exported, no Rust symbols.
    let out = run(Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib_dir().join("libblkhash.so")));
    let exported: Vec<String> = stdout(&out)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .filter(|s| !s.is_empty())
        .collect();
    for name in &exported {
        assert!(name.starts_with("blkhash_"), "exported: {name}");
    }
    // The 19 functions of 0.11's header, no more.
    assert_eq!(exported.len(), 19, "{exported:?}");
}

/// The fixed input of `api digests` (see api.c).
fn fixed_input() -> Vec<u8> {
    let mut v: Vec<u8> = (0..10000u32).map(|i| (i * 7 + 1) as u8).collect();
    v.extend(std::iter::repeat_n(0u8, 8192 + 12288));
    v.extend_from_slice(b"tail!");
    v
}

/// Every digest `blkhash_digests` names, in blksum --list-digests's order,
/// and the other spellings `blkhash_opts_new` takes (hashlib's, OpenSSL's,
/// blake2b-256) give the Rust library's checksums.
#[test]
fn every_digest_matches_the_rust_library() {
    let exe = compile("api");
    let others = [
        "blake2b-256",
        "shake_128",
        "sha3_256",
        "SHA2-512/256",
        "blake2b",
    ];
    let out = run(program(&exe).arg("digests").args(others));
    let text = stdout(&out);
    let data = fixed_input();
    let mut seen = Vec::new();
    for line in text.lines() {
        let (name, hex) = line.split_once(' ').unwrap_or((line, ""));
        let alg: Algorithm = name
            .parse()
            .unwrap_or_else(|_| panic!("unknown name {name}"));
        assert_eq!(
            hex,
            checksum_of(alg, 4096, &data).to_hex(),
            "{name}: C and Rust differ"
        );
        seen.push(name.to_string());
    }
    let listed: Vec<String> = Algorithm::listed().map(|a| a.to_string()).collect();
    let want: Vec<String> = listed.into_iter().chain(others.map(String::from)).collect();
    assert_eq!(
        seen, want,
        "blkhash_digests lists what blksum --list-digests does, in order"
    );
    assert!(ALGORITHMS.iter().all(|a| seen.contains(&a.to_string())));
}

#[test]
fn async_updates_polled_many_in_flight() {
    let exe = compile("aio");
    for (mib, qd, threads, digest) in [
        ("256", "32", "2", "sha256"),
        ("64", "1", "1", "blake3"),
        ("64", "64", "4", "sha1"),
    ] {
        let out = run(program(&exe).args([mib, qd, threads, digest]));
        let text = stdout(&out);
        assert!(text.contains("aio: ok"), "{text}");
        // The queue really filled up (the program checks it reached QD).
        assert!(text.contains(&format!("at most {qd} in flight")), "{text}");
    }
}

#[test]
fn many_threads() {
    let exe = compile("threads");
    let out = run(program(&exe).args(["8", "6"]));
    assert!(stdout(&out).contains("threads: ok"));
}

#[test]
fn reference_vectors_three_ways() {
    let exe = compile("vectors");
    let dir = tempfile::tempdir().unwrap();
    let mut list = String::new();
    let mut images = std::collections::HashMap::new();
    let raw = testkit::vectors()
        .into_iter()
        .filter(|v| v.format.is_none());
    for (i, v) in raw.enumerate() {
        let n = images.len();
        let path = images
            .entry(v.recipe.clone())
            .or_insert_with(|| {
                let p = dir.path().join(format!("img{n}"));
                testkit::Recipe::parse(&v.recipe)
                    .unwrap()
                    .write_image(&p)
                    .unwrap();
                p
            })
            .clone();
        let mode = ["update", "aio", "sparse"][i % 3];
        list.push_str(&format!(
            "{} {} {} {} {}\n",
            path.display(),
            v.digest,
            v.block_size,
            mode,
            v.pipe_checksum()
        ));
    }
    let list_path = dir.path().join("list");
    std::fs::write(&list_path, &list).unwrap();
    let out = run(program(&exe).arg(&list_path));
    let text = stdout(&out);
    assert!(text.contains("vectors: ok"), "{text}");
    assert!(text.contains(&format!("vectors: {} checked", list.lines().count())));
}

/// The .pc file install.sh writes, pointing at the build tree.
fn write_pc(dir: &Path) {
    let pc = std::fs::read_to_string(crate_dir().join("blkhash.pc.in")).unwrap();
    let pc = pc
        .replace("@PREFIX@", &dir.display().to_string())
        .replace("@LIBDIR@", &lib_dir().display().to_string())
        .replace(
            "@INCLUDEDIR@",
            &crate_dir().join("include").display().to_string(),
        )
        .replace("@VERSION@", "0.11.0");
    std::fs::write(dir.join("blkhash.pc"), pc).unwrap();
}

#[test]
fn builds_with_pkg_config_and_statically() {
    let dir = tempfile::tempdir().unwrap();
    write_pc(dir.path());
    let pkg = |args: &[&str]| -> Vec<String> {
        let out = run(Command::new("pkg-config")
            .env("PKG_CONFIG_PATH", dir.path())
            .args(args)
            .arg("blkhash"));
        stdout(&out)
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    assert!(
        run(Command::new("pkg-config")
            .env("PKG_CONFIG_PATH", dir.path())
            .args(["--atleast-version=0.11", "blkhash"]))
        .status
        .success()
    );
    let src = crate_dir().join("tests/c/api.c");

    // cc prog.c $(pkg-config --cflags --libs blkhash)
    let exe = dir.path().join("api-pc");
    run(Command::new("cc")
        .args(CFLAGS)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .args(pkg(&["--cflags", "--libs"])));
    let out = run(&mut program(&exe));
    assert!(stdout(&out).contains("api: ok"));

    // Static: libblkhash.a and the system libraries it needs (Libs.private).
    let exe = dir.path().join("api-static");
    let libs: Vec<String> = pkg(&["--static", "--libs"])
        .into_iter()
        .filter(|a| a != "-lblkhash" && !a.starts_with("-L"))
        .collect();
    run(Command::new("cc")
        .args(CFLAGS)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .args(pkg(&["--cflags"]))
        .arg(lib_dir().join("libblkhash.a"))
        .args(&libs));
    let out = run(Command::new(&exe).env_remove("LD_LIBRARY_PATH"));
    assert!(stdout(&out).contains("api: ok"));
    let needed = stdout(&run(Command::new("readelf").arg("-d").arg(&exe)));
    assert!(!needed.contains("libblkhash"), "{needed}");
}

#[test]
fn header_is_strict_c_and_cxx() {
    // Pedantic C99 and C++: the header declares, nothing more.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("inc.c");
    std::fs::write(
        &src,
        "#include <blkhash.h>\nint main(void) { return BLKHASH_MAX_MD_SIZE == 64 ? 0 : 1; }\n",
    )
    .unwrap();
    let inc = crate_dir().join("include");
    run(Command::new("cc")
        .args([
            "-std=c99",
            "-pedantic",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-c",
            "-o",
        ])
        .arg(dir.path().join("inc.o"))
        .arg("-I")
        .arg(&inc)
        .arg(&src));
    run(Command::new("c++")
        .args([
            "-x",
            "c++",
            "-std=c++11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-c",
            "-o",
        ])
        .arg(dir.path().join("inc-cxx.o"))
        .arg("-I")
        .arg(&inc)
        .arg(&src));
}

#[test]
fn valgrind_finds_no_error_or_leak() {
    for (name, args) in [
        ("api", vec![]),
        ("aio", vec!["16", "8", "2", "sha256"]),
        ("threads", vec!["3", "2"]),
    ] {
        let exe = compile(name);
        let out = run(Command::new("valgrind")
            .args([
                "--error-exitcode=1",
                "--leak-check=full",
                // "Possibly lost": the 48-byte handle std makes for a C
                // thread that calls into Rust, kept for the thread's life.
                "--errors-for-leak-kinds=definite,indirect",
                "--show-possibly-lost=no",
                "--quiet",
            ])
            .env("LD_LIBRARY_PATH", scratch().lib())
            .arg(&exe)
            .args(&args));
        assert!(stdout(&out).contains(&format!("{name}: ok")));
        assert!(
            out.stderr.is_empty(),
            "{name} under valgrind:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Under a thread limit (RLIMIT_NPROC of 3 tasks: the program and 2
/// threads, as a user of its own since root ignores the limit),
/// `blkhash_new` and `blkhash_new_opts` return NULL with errno EAGAIN, as
/// blkhash.3 says, and write nothing to standard error (no panic message).
#[test]
fn threads_that_cannot_start_are_eagain() {
    // The other user runs copies of the program and the library, in a
    // directory it can reach (the build directory may be private).
    let open = testkit::tools::open_scratch(false);
    let exe = open.path().join("limits");
    std::fs::copy(compile("limits"), &exe).unwrap();
    std::fs::copy(
        lib_dir().join("libblkhash.so"),
        open.path().join("libblkhash.so.0"),
    )
    .unwrap();
    let Some(mut cmd) = testkit::tools::thread_limited(&exe, 64_101, 3) else {
        return;
    };
    let out = cmd
        .arg("threads")
        .env("LD_LIBRARY_PATH", open.path())
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stdout.contains("limits threads: ok"),
        "{}\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stderr.is_empty(), "{stderr}");
}

/// A total past 2^64 - 1 bytes (`blkhash_update(h, buf, 1)` then
/// `blkhash_zero(h, SIZE_MAX)`) is EINVAL and fails the hash, never a
/// wrapped length.
#[test]
fn length_past_two_to_the_64_is_einval() {
    let exe = compile("limits");
    let out = run(program(&exe).arg("length"));
    assert!(stdout(&out).contains("limits length: ok"));
}
