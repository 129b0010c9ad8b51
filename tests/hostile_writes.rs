//! Safe with anyone's files, the second pass (contract 15, `docs/internals.md`): names the
//! user gives that are another user's FIFO, the run's notes folder, and a trace folder reached
//! through a link into another user's folder. As `tests/hostile_folders.rs`, as two real users
//! where the tests run as root.

use crate::common::*;
use crate::hostile_folders::{
    ATTACKER, READER, a_trace, as_user, chmod, finish_within, give, gpushim_as, two_users,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

/// A program on the simulator as `uid` (root only), with the shim preloaded, writing its trace
/// at `trace`; stdout and stderr kept.
fn client_as(uid: Option<u32>, cwd: &Path, trace: &Path) -> Output {
    let mut c = as_user(uid, &sim().bin("train_loop"));
    c.arg("2")
        .current_dir(cwd)
        .env("LD_LIBRARY_PATH", &sim().dir)
        .env("LD_PRELOAD", shim())
        .env("GPUSHIM_TRACE", trace)
        .env_remove("GPUSHIM_CONF")
        .env_remove("GPUSHIM_RUN_REPORT");
    finish_within(c, Duration::from_secs(60), "the client")
}

fn mkfifo(p: &Path, mode: u32) {
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), mode) }, 0, "{p:?}");
    chmod(p, mode);
}

/// A reader of `fifo` (as root) copying what arrives into `into`.
fn listen(fifo: &Path, into: &Path) -> std::process::Child {
    Command::new("cat")
        .arg(fifo)
        .stdout(std::fs::File::create(into).unwrap())
        .spawn()
        .unwrap()
}

/// A name the user gives is written in place only when it is the user's (or root's, as
/// `/dev/null`): another user's FIFO in a shared folder is refused at once, never waited on and
/// never fed the page; the user's own FIFO with a reader receives the export, and with none
/// the command says so instead of hanging.
#[test]
fn another_users_fifo_is_never_written_and_nothing_waits_on_a_fifo() {
    let root = tempdir("hostile-fifo");
    chmod(&root, 0o1777);
    let trace = a_trace(&root, "mine.trace");
    chmod(&trace, 0o644);
    let home = root.join("home");
    std::fs::create_dir(&home).unwrap();
    let reader = two_users(&root).then_some(READER);
    if let Some(r) = reader {
        for p in [&home, &trace] {
            give(p, r);
        }
    }
    // Another user's FIFO, open to all, at the name the user gives; someone even reads it.
    if reader.is_some() {
        let theirs = root.join("out.html");
        mkfifo(&theirs, 0o666);
        give(&theirs, ATTACKER);
        let got = root.join("received");
        let listener = listen(&theirs, &got);
        for args in [
            vec![OsStr::new("report"), trace.as_os_str(), OsStr::new("-o")],
            vec![
                OsStr::new("export"),
                OsStr::new("--format"),
                OsStr::new("perfetto"),
                trace.as_os_str(),
                OsStr::new("-o"),
            ],
        ] {
            let mut args = args.clone();
            args.push(theirs.as_os_str());
            let out = finish_within(
                gpushim_as(reader, &home, &home, &args),
                Duration::from_secs(60),
                "writing to another user's FIFO",
            );
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
            assert!(err.contains("another user (uid 4242)"), "{err}");
            assert!(!err.contains("wrote"), "{err}");
        }
        // The listener never even saw a writer: nothing of the page reached it.
        let mut listener = listener;
        let _ = listener.kill();
        let _ = listener.wait();
        assert_eq!(
            std::fs::read(&got).unwrap_or_default(),
            b"",
            "the other user got data"
        );
    }
    // The user's own FIFO with nobody reading: said at once, not a hang.
    let mine = home.join("mine.fifo");
    mkfifo(&mine, 0o600);
    if let Some(r) = reader {
        give(&mine, r);
    }
    // A Perfetto export of the trace to `target`, as the reader, in bounded time.
    let export_to = |target: &Path, what: &str| {
        finish_within(
            gpushim_as(
                reader,
                &home,
                &home,
                &[
                    OsStr::new("export"),
                    OsStr::new("--format"),
                    OsStr::new("perfetto"),
                    trace.as_os_str(),
                    OsStr::new("-o"),
                    target.as_os_str(),
                ],
            ),
            Duration::from_secs(60),
            what,
        )
    };
    let out = export_to(&mine, "an export to a FIFO nobody reads");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("nobody is reading"),
        "{}",
        stderr(&out)
    );
    // With a reader, the user's own FIFO and /dev/null work as before.
    let got = home.join("got.json");
    let listener = listen(&mine, &got);
    std::thread::sleep(Duration::from_millis(200));
    for target in [mine.as_path(), Path::new("/dev/null")] {
        assert_ok(&export_to(target, "an export to the user's own FIFO"));
    }
    let mut listener = listener;
    listener.wait().unwrap();
    serde_json::from_slice::<serde_json::Value>(&std::fs::read(&got).unwrap())
        .expect("the export arrived whole through the user's FIFO");
}

/// The folder `gpushim run` keeps its processes' notes in is 0700 whatever the umask, with a
/// private folder and, without one, in the system's temporary folder.
#[test]
fn the_runs_notes_folder_is_the_users_alone() {
    let dir = tempdir("hostile-notes");
    let home = dir.join("home");
    std::fs::create_dir(&home).unwrap();
    for with_home in [true, false] {
        let mut c = Command::new(gpushim_bin());
        c.current_dir(&dir)
            .env_remove("XDG_CACHE_HOME")
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("GPUSHIM_CONF")
            .env("GPUSHIM_TRACE", "off")
            .args(["run", "--lib"])
            .arg(shim())
            .args([
                "--",
                "sh",
                "-c",
                r#"umask; stat -c %a "$GPUSHIM_RUN_REPORT""#,
            ]);
        if with_home {
            c.env("HOME", &home);
        } else {
            c.env_remove("HOME");
        }
        let out = c.output().unwrap();
        assert_ok(&out);
        let said = stdout(&out);
        assert_eq!(
            said.lines().last(),
            Some("700"),
            "HOME set: {with_home}: {said}"
        );
    }
}

/// A trace folder named through a link another user planted, or through the user's own link
/// into a folder another user owns, is refused by `run` before the program starts; the shim
/// preloaded without `run` records nothing through either link and says why. The real
/// folder named as it is, and the user's own link into a folder of theirs, work.
#[test]
fn a_trace_folder_through_a_link_into_another_users_folder_is_refused_before_the_start() {
    let root = tempdir("hostile-trace-link");
    chmod(&root, 0o1777);
    let home = root.join("home");
    let theirs = root.join("theirs");
    let mine = root.join("mine");
    for d in [&home, &theirs, &mine] {
        std::fs::create_dir(d).unwrap();
    }
    chmod(&theirs, 0o777);
    let planted = root.join("tr");
    std::os::unix::fs::symlink(&theirs, &planted).unwrap();
    let own_link = home.join("to-theirs");
    std::os::unix::fs::symlink(&theirs, &own_link).unwrap();
    let good_link = home.join("to-mine");
    std::os::unix::fs::symlink(&mine, &good_link).unwrap();
    let Some(reader) = two_users(&root).then_some(READER) else {
        return;
    };
    give(&theirs, ATTACKER);
    give(&planted, ATTACKER);
    for p in [&home, &own_link, &good_link, &mine] {
        give(p, reader);
    }
    let marker = home.join("ran");
    for through in [&planted, &own_link] {
        let trace = through.join("x.%p.trace");
        let out = finish_within(
            {
                let mut c = gpushim_as(
                    Some(reader),
                    &home,
                    &home,
                    &[
                        OsStr::new("run"),
                        OsStr::new("--lib"),
                        shim().as_os_str(),
                        OsStr::new("--trace"),
                        trace.as_os_str(),
                        OsStr::new("--"),
                        OsStr::new("touch"),
                        marker.as_os_str(),
                    ],
                );
                c.env("LD_LIBRARY_PATH", &sim().dir);
                c
            },
            Duration::from_secs(60),
            "run",
        );
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{through:?}: {err}");
        assert!(
            err.contains("is reached through the link") && err.contains("Not running"),
            "{err}"
        );
        assert!(!marker.exists(), "the program started");
    }
    // Plain LD_PRELOAD through the planted link: nothing lands in the other user's folder.
    let out = client_as(Some(reader), &home, &planted.join("x.trace"));
    assert_ok(&out);
    assert!(
        stderr(&out).contains("a link another user (uid 4242) owns"),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read_dir(&theirs).unwrap().count(), 0);
    // Plain LD_PRELOAD through the user's own link into the other user's folder: refused by
    // the shim as by `run`, with the folder's owner named.
    let out = client_as(Some(reader), &home, &own_link.join("x.trace"));
    assert_ok(&out);
    assert!(
        stderr(&out)
            .contains("lands in or below a folder that another user controls (owner uid 4242"),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read_dir(&theirs).unwrap().count(), 0);
    // The user's own link into their own folder, and the shared folder named as it is, work.
    for trace in [good_link.join("y.trace"), root.join("z.trace")] {
        let out = client_as(Some(reader), &home, &trace);
        assert_ok(&out);
        assert!(!stderr(&out).contains("another user"), "{}", stderr(&out));
        assert!(trace.is_file(), "{trace:?}: {}", stderr(&out));
    }
}
