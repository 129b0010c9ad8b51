//! Safe with anyone's traces and folders (contract 15; the model is in `docs/internals.md`,
//! "Safe with anyone's files"). Each of the ways in that once worked, as a test:
//! 1. a picture's default name in another user's folder, a link there to the reader's file;
//! 2. the shim written out to a folder another user can change, or over a planted link;
//! 3. `run` reading FIFOs, `/dev/zero` and traces it did not write from the trace folder;
//! 4. symbol names from a module file reaching the terminal raw;
//! 5. a name made in advance switching recording off;
//! 6. pictures and exports readable by others.
//!
//! And one test that pushes names with newlines, ESC, `<`, quotes and bytes that are not UTF-8
//! through every command and output format.
//!
//! Where the tests run as root (CI), "another user" is real: files are handed to uid 4242 with
//! `lchown`, and the reader runs as uid 4243 through `setpriv`. Elsewhere the same-user parts
//! run and the rest says it was skipped.

use crate::common::*;
use gpushim::trace::format::{Api, RecordKind};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

pub(crate) const ATTACKER: u32 = 4242;
pub(crate) const READER: u32 = 4243;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether the test can be two users: it runs as root, and the reader's uid can reach `dir`
/// and run the command (a umask of 077 on the build's folders would stop it: then the parts
/// that need a second user are skipped, and say so).
pub(crate) fn two_users(dir: &Path) -> bool {
    if !is_root() {
        skipped("hostile_folders", "not root: the parts with a second user");
        return false;
    }
    let ok = Command::new("setpriv")
        .args([
            format!("--reuid={READER}"),
            format!("--regid={READER}"),
            "--clear-groups".into(),
            "--".into(),
            "sh".into(),
            "-c".into(),
            r#"cd "$1" && "$2" --version"#.into(),
            "sh".into(),
        ])
        .arg(dir)
        .arg(gpushim_bin())
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skipped(
            "hostile_folders",
            &format!("uid {READER} cannot reach the build's folders: the parts with a second user"),
        );
    }
    ok
}

pub(crate) fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Hands `p` (a link itself, not what it points at) to `uid`.
pub(crate) fn give(p: &Path, uid: u32) {
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::lchown(c.as_ptr(), uid, uid) }, 0, "{p:?}");
}

/// `program`, as `uid` when given (root only: through `setpriv`, with no groups).
pub(crate) fn as_user(uid: Option<u32>, program: &Path) -> Command {
    match uid {
        Some(u) => {
            let mut c = Command::new("setpriv");
            c.args([
                format!("--reuid={u}"),
                format!("--regid={u}"),
                "--clear-groups".into(),
                "--".into(),
            ])
            .arg(program);
            c
        }
        None => Command::new(program),
    }
}

/// The command, as `uid` when given (root only), in `cwd`, with `HOME` set.
pub(crate) fn gpushim_as(uid: Option<u32>, cwd: &Path, home: &Path, args: &[&OsStr]) -> Command {
    let mut c = as_user(uid, &gpushim_bin());
    c.args(args)
        .current_dir(cwd)
        .env("HOME", home)
        .env_remove("XDG_CACHE_HOME")
        .env_remove("GPUSHIM_CONF")
        .env_remove("GPUSHIM_TRACE");
    c
}

/// Waits for `c` at most `limit`; a command still running then is killed and the test fails.
pub(crate) fn finish_within(mut c: Command, limit: Duration, what: &str) -> Output {
    let mut child = c
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("{what} did not finish in {limit:?}: {}", stderr(&out));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

pub(crate) fn a_trace(dir: &Path, name: &str) -> PathBuf {
    let t = dir.join(name);
    std::fs::copy(repo().join("tests/data/torch/oom.trace"), &t).unwrap();
    t
}

fn mode_of(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o777
}

/// 1 and 6: with no `--output`, `plot` and `flamegraph` write beside the trace only in a folder
/// that is the reader's alone; in a folder others can write they write into the working folder,
/// and never through the link planted there; what they write is 0600.
#[test]
fn default_pictures_never_go_through_a_link_in_a_folder_others_can_write() {
    let root = tempdir("hostile-pictures");
    chmod(&root, 0o755);
    let shared = root.join("shared");
    let home = root.join("home");
    for d in [&shared, &home] {
        std::fs::create_dir(d).unwrap();
    }
    chmod(&shared, 0o777);
    let victim = home.join(".bashrc");
    std::fs::write(&victim, b"# mine\n").unwrap();
    let trace = a_trace(&shared, "fake.trace");
    chmod(&trace, 0o644);
    for kind in ["timeline", "flamegraph"] {
        std::os::unix::fs::symlink(&victim, shared.join(format!("fake.{kind}.svg"))).unwrap();
    }
    let reader = two_users(&root).then(|| {
        for p in [
            &shared.join("fake.timeline.svg"),
            &shared.join("fake.flamegraph.svg"),
        ] {
            give(p, ATTACKER);
        }
        give(&trace, ATTACKER);
        give(&shared, ATTACKER);
        for p in [&home, &victim] {
            give(p, READER);
        }
        READER
    });
    for cmd in ["plot", "flamegraph"] {
        let out = gpushim_as(
            reader,
            &home,
            &home,
            &[
                OsStr::new(cmd),
                trace.as_os_str(),
                OsStr::new("--no-symbols"),
            ],
        )
        .output()
        .unwrap();
        assert_ok(&out);
        assert_eq!(std::fs::read(&victim).unwrap(), b"# mine\n", "{cmd}");
        let kind = if cmd == "plot" {
            "timeline"
        } else {
            "flamegraph"
        };
        let made = home.join(format!("fake.{kind}.svg"));
        assert!(made.is_file(), "{cmd}: {}", stderr(&out));
        assert_eq!(mode_of(&made), 0o600, "{cmd} writes private");
        assert!(stderr(&out).contains("working folder"), "{}", stderr(&out));
    }
    // Neither folder the reader's alone: nothing is written, and the error says what to do.
    let out = gpushim_as(
        reader,
        &shared,
        &home,
        &[OsStr::new("plot"), trace.as_os_str()],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--output"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&victim).unwrap(), b"# mine\n");
    // `-o` naming a link another user planted replaces the link; the reader's file stays.
    if let Some(r) = reader {
        for args in [vec!["plot", "-o"], vec!["export", "--format", "rmm", "-o"]] {
            let link = shared.join("out.svg");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&victim, &link).unwrap();
            give(&link, ATTACKER);
            // The sticky bit keeps other users' names: the reader cannot replace the link, and
            // says so; without it the link is replaced.
            let mut a: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
            a.push(link.as_os_str());
            a.push(trace.as_os_str());
            let out = gpushim_as(Some(r), &home, &home, &a).output().unwrap();
            assert_ok(&out);
            assert_eq!(std::fs::read(&victim).unwrap(), b"# mine\n", "{args:?}");
            let meta = std::fs::symlink_metadata(&link).unwrap();
            assert!(meta.is_file() && meta.uid() == r, "{args:?}");
            assert_eq!(meta.mode() & 0o777, 0o600);
        }
    } else {
        skipped(
            "hostile_folders",
            "one user: the -o through another user's link part",
        );
    }
}

/// 6: every export is created private, whatever the umask.
#[test]
fn exports_are_private_and_appear_whole() {
    let dir = tempdir("hostile-exports");
    let trace = a_trace(&dir, "t.trace");
    for format in ["perfetto", "rmm", "memory-viz"] {
        let out_path = dir.join(format!("out-{format}"));
        std::fs::write(&out_path, b"old").unwrap();
        chmod(&out_path, 0o644);
        let out = gpushim(&[
            &"export",
            &"--format",
            &format,
            &"-o",
            &out_path,
            &trace.as_path(),
        ]);
        assert_ok(&out);
        assert_eq!(mode_of(&out_path), 0o600, "{format}");
        assert_ne!(std::fs::read(&out_path).unwrap(), b"old");
    }
    // A failed export leaves the earlier file as it was and no half file beside it.
    let kept = dir.join("kept.json");
    std::fs::write(&kept, b"earlier").unwrap();
    let out = gpushim(&[
        &"export",
        &"--format",
        &"perfetto",
        &"-o",
        &kept,
        &dir.join("absent.trace"),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(std::fs::read(&kept).unwrap(), b"earlier");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".part"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// 2: the folder the shim is written to is used only when no other user can change any folder
/// on its path; a link planted where the shim goes is replaced, never followed.
#[test]
fn the_shim_is_written_only_where_no_one_else_can_swap_it() {
    let root = tempdir("hostile-cache");
    chmod(&root, 0o755);
    let open = root.join("open-cache");
    std::fs::create_dir(&open).unwrap();
    chmod(&open, 0o777);
    let home = root.join("home");
    std::fs::create_dir(&home).unwrap();
    let private =
        gpushim::run::private_folder_among(&[Some(open.clone()), Some(home.join(".cache"))])
            .unwrap();
    assert!(
        private.starts_with(home.canonicalize().unwrap()),
        "{private:?}"
    );
    assert_eq!(mode_of(&private), 0o700);
    let e = gpushim::run::private_folder_among(&[Some(open.clone())]).unwrap_err();
    assert!(e.to_string().contains("can be written by others"), "{e}");
    // Under a folder others can write, even a private folder of the reader's is refused: the
    // folder itself could be moved away and another put in its place.
    let under = open.join("mine");
    std::fs::create_dir(&under).unwrap();
    chmod(&under, 0o700);
    assert!(gpushim::run::private_folder_among(&[Some(under)]).is_err());

    // A link planted where the shim goes (a folder once open to others), and a second name of
    // the same bytes, are replaced by a file of the reader's own.
    let victim = root.join("theirs.so");
    let shim_bytes = b"\x7fELF not really a shim";
    std::fs::write(&victim, shim_bytes).unwrap();
    let path = private.join("libgpushim-test.so");
    std::os::unix::fs::symlink(&victim, &path).unwrap();
    gpushim::run::write_checked(&path, shim_bytes, 0o755).unwrap();
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.is_file() && meta.nlink() == 1, "{meta:?}");
    std::fs::remove_file(&path).unwrap();
    std::fs::hard_link(&victim, &path).unwrap();
    gpushim::run::write_checked(&path, shim_bytes, 0o755).unwrap();
    assert_eq!(std::fs::symlink_metadata(&path).unwrap().nlink(), 1);
    // Open to others: rewritten, closed.
    chmod(&path, 0o777);
    gpushim::run::write_checked(&path, shim_bytes, 0o755).unwrap();
    assert_eq!(mode_of(&path) & 0o022, 0);
    if is_root() {
        give(&path, ATTACKER);
        gpushim::run::write_checked(&path, shim_bytes, 0o755).unwrap();
        assert_eq!(std::fs::symlink_metadata(&path).unwrap().uid(), 0);
    }
    assert_eq!(std::fs::read(&path).unwrap(), shim_bytes);
}

/// 3 and 5: after the program, `run` reads only the traces its own processes wrote: a FIFO, a
/// link to `/dev/zero` and a trace copied into the folder during the run are not read (no hang,
/// no endless read), and the program's exit code comes back.
#[test]
fn run_reads_only_what_its_processes_wrote_and_returns_the_exit_code() {
    let dir = tempdir("hostile-run");
    let copied_from = repo().join("tests/data/torch/oom.trace");
    let script = format!(
        "mkfifo gpushim-fifo.trace && ln -s /dev/zero gpushim-zero.trace && \
         ln -s /dev/zero zero.trace && cp '{}' gpushim-copied.trace && '{}' 2 && exit 7",
        copied_from.display(),
        sim().bin("train_loop").display()
    );
    let mut c = Command::new(gpushim_bin());
    c.current_dir(&dir)
        .env("LD_LIBRARY_PATH", &sim().dir)
        .env_remove("GPUSHIM_CONF")
        .env_remove("GPUSHIM_TRACE")
        .args(["run", "--lib"])
        .arg(shim())
        .args(["--", "sh", "-c", &script]);
    let out = finish_within(c, Duration::from_secs(60), "gpushim run");
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    let err = stderr(&out);
    let named: Vec<&str> = err
        .lines()
        .filter_map(|l| l.strip_prefix("gpushim: trace "))
        .collect();
    assert_eq!(named.len(), 1, "{err}");
    assert!(named[0].contains("gpushim-train_loop."), "{err}");
    for other in ["fifo", "zero", "copied"] {
        assert!(!err.contains(&format!("gpushim-{other}")), "{err}");
    }
}

/// 5: a name taken in advance (a link to the reader's file) never turns recording off: the
/// trace takes another name, says which, and `run`'s last lines name the trace truly.
#[test]
fn a_name_taken_in_advance_gives_another_name_never_no_recording() {
    let dir = tempdir("hostile-names");
    let victim = dir.join("victim");
    std::fs::write(&victim, b"keep").unwrap();
    let taken = dir.join("t.trace");
    std::os::unix::fs::symlink(&victim, &taken).unwrap();
    // Plain LD_PRELOAD.
    let out = run(
        &sim().bin("train_loop"),
        Run {
            preload: true,
            trace: Some(&taken),
            args: vec!["2".into()],
            ..Run::default()
        },
    );
    assert_ok(&out);
    let err = stderr(&out);
    assert!(err.contains("is taken"), "{err}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    let written: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.to_string_lossy().ends_with(".trace"))
        .filter(|p| p != &taken)
        .collect();
    assert_eq!(written.len(), 1, "{written:?}");
    assert!(err.contains(&written[0].display().to_string()), "{err}");
    assert_ok(&gpushim(&[&"summary", &written[0]]));
    // Under `run`: it starts, and its last lines name the trace the program really wrote.
    let out = Command::new(gpushim_bin())
        .current_dir(&dir)
        .env("LD_LIBRARY_PATH", &sim().dir)
        .env_remove("GPUSHIM_CONF")
        .args(["run", "--lib"])
        .arg(shim())
        .arg("--trace")
        .arg(&taken)
        .arg(sim().bin("train_loop"))
        .arg("2")
        .output()
        .unwrap();
    assert_ok(&out);
    let err = stderr(&out);
    let named = err
        .lines()
        .find_map(|l| l.strip_prefix("gpushim: trace "))
        .unwrap_or_else(|| panic!("{err}"));
    assert_ne!(Path::new(named), taken.as_path());
    assert!(Path::new(named).is_file(), "{err}");
    assert!(!err.contains("made no CUDA"), "{err}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
}

/// What no terminal, page or file format may receive raw from a trace or a file it names.
/// A newline that starts a line of its own, escape sequences (ESC and the C1 CSI), markup, a
/// byte that is not UTF-8, a right-to-left override (U+202E) and a first-strong isolate
/// (U+2068) that read the rest reversed, a zero-width space (U+200B), and the four characters
/// `\x1b`, which must not read like the ESC before them.
const HOSTILE: &[u8] =
    b"ev\nssh-ed25519 AAAA il\x1b]0;owned\x07\x1b[2J\xc2\x9b1m<b onload=\"x\">'&\xff\
    \xe2\x80\xaegnp.exe\xe2\x81\xa8x\xe2\x80\x8by \\x1b";

/// The checks on text meant for a terminal: nothing that moves it, no line the hostile name
/// starts, valid UTF-8.
fn terminal_safe(what: &str, bytes: &[u8]) {
    let text = std::str::from_utf8(bytes).unwrap_or_else(|e| panic!("{what}: not UTF-8: {e}"));
    for c in text.chars() {
        assert!(
            !c.is_control() || c == '\n' || c == '\t',
            "{what}: control character {c:?} in:\n{text}"
        );
    }
    unseen_free(what, text);
    assert!(
        !text.lines().any(|l| l.starts_with("ssh-ed25519")),
        "{what}: a name split a line:\n{text}"
    );
}

/// No character that changes how text reads without being seen (a direction override or
/// isolate, a zero-width space): what the reader sees is what is there.
fn unseen_free(what: &str, text: &str) {
    for c in text.chars() {
        assert!(
            !matches!(c as u32, 0x200b..=0x200f | 0x202a..=0x202e | 0x2066..=0x2069 | 0xfeff),
            "{what}: unseen character U+{:04X} in:\n{text}",
            c as u32
        );
    }
}

/// Text for SVG or HTML: no markup from a name, no line of its own, no control character.
fn markup_safe(what: &str, bytes: &[u8]) {
    terminal_safe(what, bytes);
    let text = String::from_utf8_lossy(bytes);
    assert!(!text.contains("<b onload"), "{what}: markup from a name");
}

/// A trace whose every string is hostile: its host, a module, Python frames, NVTX ranges; and
/// a module file whose symbol names are hostile.
fn hostile_trace(dir: &Path) -> PathBuf {
    // A module whose function names carry escape sequences: a library built here, its names
    // patched in place after the link (the build-id stays, so it is the file "that ran").
    let src = dir.join("m.c");
    std::fs::write(
        &src,
        "void gpushim_marker_fn_aaaaaaaaaa(void) { __asm__ volatile(\"nop\"); }\n",
    )
    .unwrap();
    let lib = dir.join("libm_evil.so");
    cc(&[
        "-shared",
        "-fPIC",
        "-g",
        "-Wl,--build-id",
        "-o",
        lib.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    let nm = Command::new("nm").arg(&lib).output().unwrap();
    let offset = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .find(|l| l.ends_with("gpushim_marker_fn_aaaaaaaaaa"))
        .and_then(|l| u64::from_str_radix(l.split(' ').next()?, 16).ok())
        .expect("nm names the marker function");
    let mut bytes = std::fs::read(&lib).unwrap();
    let marker = b"gpushim_marker_fn_aaaaaaaaaa";
    let evil = b"\x1b]0;owned\x07\x1b[2J\nssh-ed25519xx";
    assert_eq!(marker.len(), evil.len());
    let mut patched = 0;
    let mut i = 0;
    while i + marker.len() <= bytes.len() {
        if &bytes[i..i + marker.len()] == marker {
            bytes[i..i + marker.len()].copy_from_slice(evil);
            patched += 1;
        }
        i += 1;
    }
    assert!(patched > 0);
    std::fs::write(&lib, &bytes).unwrap();
    let build_id = {
        use object::Object;
        let f = object::File::parse(&*bytes).unwrap();
        f.build_id().unwrap().unwrap().to_vec()
    };

    let plain = dir.join("plain.trace");
    let mut t = HandTrace::create_on(&plain, HOSTILE);
    let base = 0x7f00_0000_0000u64;
    let module = t.recorder.intern_string(lib.as_os_str().as_bytes());
    t.rec(RecordKind::Module, Api::Shim, base, module);
    let hex: String = build_id.iter().map(|b| format!("{b:02x}")).collect();
    let id = t.recorder.intern_string(hex.as_bytes());
    t.rec(RecordKind::ModuleBuildId, Api::Shim, base, id);
    let odd_module = t.recorder.intern_string(HOSTILE);
    t.rec(RecordKind::Module, Api::Shim, 0x6000_0000_0000, odd_module);
    let mut frame_text = HOSTILE.to_vec();
    frame_text.push(0);
    frame_text.extend_from_slice(HOSTILE);
    let py = t.recorder.intern_string(&frame_text);
    let range = t.recorder.intern_string(HOSTILE);
    for step in 0..4u64 {
        t.rec(RecordKind::RangePush, Api::Shim, range, 1);
        let frames = [
            gpushim::trace::format::py_frame(py, 7),
            base + offset + 2,
            0x6000_0000_0010,
        ];
        let (stack, _) = t.recorder.intern_stack(&frames);
        t.rec(
            RecordKind::Alloc,
            Api::CudaMalloc,
            0x1000_0000 + step * 0x10_0000,
            1 << 20,
        );
        t.rec(RecordKind::StackRef, Api::Shim, stack, frames.len() as u64);
        t.rec(RecordKind::Mark, Api::Shim, range, 0);
        t.rec(RecordKind::RangePop, Api::Shim, 0, 1);
    }
    let formula = t.recorder.intern_string(b"=HYPERLINK(\"http://x\",\"y\")");
    t.rec(RecordKind::Mark, Api::Shim, formula, 0);
    t.rec(RecordKind::OutOfMemory, Api::CudaMalloc, 0, 1 << 40);
    drop(t);
    let mut name = dir.as_os_str().as_bytes().to_vec();
    name.push(b'/');
    name.extend_from_slice(HOSTILE);
    name.extend_from_slice(b".trace");
    let hostile = PathBuf::from(OsStr::from_bytes(&name));
    std::fs::rename(&plain, &hostile).unwrap();
    hostile
}

/// Names with newlines, ESC, `<`, quotes and bytes that are not UTF-8, in the trace's file
/// name and in every string it holds, through every command and output format.
#[test]
fn hostile_names_are_escaped_in_every_command_and_format() {
    let dir = tempdir("hostile-names-everywhere");
    let trace = hostile_trace(&dir);
    let t = trace.as_os_str();
    let reports: &[&[&str]] = &[
        &["summary"],
        &["leaks"],
        &["peak"],
        &["oom"],
        &["events"],
        &["simulate"],
        &["simulate", "--torch", "expandable_segments:True"],
    ];
    for args in reports {
        for json in [false, true] {
            let mut c = Command::new(gpushim_bin());
            c.args(*args).arg(t);
            if json {
                c.arg("--json");
            }
            let out = c.output().unwrap();
            let what = format!("{args:?} json={json}");
            // Some reports have nothing to say of a trace without PyTorch; none may crash.
            assert!(
                out.status.code() == Some(0) || out.status.code() == Some(2),
                "{what}: {:?}\n{}",
                out.status,
                stderr(&out)
            );
            terminal_safe(&format!("{what} stderr"), &out.stderr);
            if json {
                // JSON escapes nothing of these by itself: the strings carry them escaped.
                unseen_free(&what, &String::from_utf8_lossy(&out.stdout));
            }
            if json && out.status.success() {
                // `events --json` prints one object per line; the rest one document.
                let docs: Vec<&[u8]> = if args[0] == "events" {
                    out.stdout
                        .split(|&b| b == b'\n')
                        .filter(|l| !l.is_empty())
                        .collect()
                } else {
                    vec![&out.stdout]
                };
                for d in docs {
                    serde_json::from_slice::<serde_json::Value>(d)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                }
            } else {
                terminal_safe(&format!("{what} stdout"), &out.stdout);
            }
        }
    }
    // CSV: a name a spreadsheet would run as a formula is shown as text.
    let events = Command::new(gpushim_bin())
        .arg("events")
        .arg(t)
        .output()
        .unwrap();
    assert!(
        stdout(&events).contains(",\"'=HYPERLINK("),
        "{}",
        stdout(&events)
    );
    // The symbol really was named (else the test would prove nothing of symbols).
    let leaks = Command::new(gpushim_bin())
        .args(["peak"])
        .arg(t)
        .output()
        .unwrap();
    assert!(
        stdout(&leaks).contains("\\x1b]0;owned"),
        "the patched symbol is shown escaped:\n{}",
        stdout(&leaks)
    );
    // ESC reads `\x1b`; the four characters `\x1b` read `\x5cx1b`; the override is named.
    let events = stdout(
        &Command::new(gpushim_bin())
            .arg("events")
            .arg(t)
            .output()
            .unwrap(),
    );
    assert!(
        events.contains("\\x1b]0;owned") && events.contains("\\x5cx1b"),
        "{events}"
    );
    assert!(events.contains("\\u{202e}gnp.exe"), "{events}");
    let diff = Command::new(gpushim_bin())
        .arg("diff")
        .arg(t)
        .arg(t)
        .output()
        .unwrap();
    assert_ok(&diff);
    terminal_safe("diff", &diff.stdout);
    terminal_safe("diff stderr", &diff.stderr);
    for (cmd, file) in [
        ("plot", "p.svg"),
        ("plot --by line", "l.svg"),
        ("plot --by total", "t.svg"),
        ("flamegraph", "f.svg"),
        ("flamegraph --color name", "n.svg"),
    ] {
        let o = dir.join(file);
        let out = Command::new(gpushim_bin())
            .args(cmd.split(' '))
            .arg(t)
            .arg("-o")
            .arg(&o)
            .output()
            .unwrap();
        assert_ok(&out);
        terminal_safe(cmd, &out.stderr);
        let svg = std::fs::read(&o).unwrap();
        markup_safe(cmd, &svg);
        // Well-formed: it renders.
        gpushim::export::svg_to_png(std::str::from_utf8(&svg).unwrap())
            .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    }
    for format in ["perfetto", "rmm", "memory-viz"] {
        let o = dir.join(format!("x.{format}"));
        let out = Command::new(gpushim_bin())
            .args(["export", "--format", format, "-o"])
            .arg(&o)
            .arg(t)
            .output()
            .unwrap();
        assert_ok(&out);
        terminal_safe(format, &out.stderr);
        let bytes = std::fs::read(&o).unwrap();
        match format {
            "perfetto" => {
                serde_json::from_slice::<serde_json::Value>(&bytes).unwrap();
            }
            "rmm" => terminal_safe(format, &bytes),
            _ => {}
        }
    }
    // The page: every string inside its data element, none able to end it.
    let o = dir.join("r.html");
    let out = Command::new(gpushim_bin())
        .arg("report")
        .arg(t)
        .arg("-o")
        .arg(&o)
        .output()
        .unwrap();
    assert_ok(&out);
    terminal_safe("report", &out.stderr);
    let page = std::fs::read(&o).unwrap();
    markup_safe("report", &page);
    let text = String::from_utf8_lossy(&page);
    assert_eq!(
        text.matches("</script>").count(),
        2,
        "a string closed a script"
    );
}
