//! Shared by the integration tests: builds the CUDA simulator and the C clients (once per test
//! binary), finds libgpushim.so, runs clients with or without the shim, decodes traces.

pub mod json;
pub mod rings;

use gpushim::trace::format::{Record, RecordKind};
use gpushim::trace::reader::{DecodeStats, TraceReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `target/debug` (or wherever this test binary's profile directory is).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary lives in <profile>/deps")
        .to_path_buf()
}

/// The shim under test: `$GPUSHIM_LIB`, else `libgpushim.so` of this build profile.
pub fn shim() -> PathBuf {
    if let Some(p) = std::env::var_os("GPUSHIM_LIB") {
        return PathBuf::from(p);
    }
    let p = profile_dir().join("libgpushim.so");
    assert!(
        p.is_file(),
        "{} is missing: build it first with `cargo build -p gpushim-shim` \
         (scripts/test.sh does), or set GPUSHIM_LIB",
        p.display()
    );
    static FRESH: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    if let Err(e) = FRESH.get_or_init(|| shim_is_fresh(&p)) {
        panic!("{e}");
    }
    p
}

/// Whether the shim at `lib` was built after every source it is built from: the shim's crate
/// and the core's (`shim/`, `src/core/`), their unit tests aside (a test-only file does not
/// make cargo rebuild the library). `cargo test` alone does not rebuild a library the tests
/// only load, and a stale one would test yesterday's shim.
fn shim_is_fresh(lib: &Path) -> Result<(), String> {
    let built = std::fs::metadata(lib)
        .and_then(|m| m.modified())
        .map_err(|e| format!("{}: {e}", lib.display()))?;
    let mut newer = Vec::new();
    let mut stack = vec![repo().join("shim"), repo().join("src/core")];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            for e in std::fs::read_dir(&p).map_err(|e| e.to_string())? {
                stack.push(e.map_err(|e| e.to_string())?.path());
            }
            continue;
        }
        if p.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let changed = std::fs::metadata(&p)
            .and_then(|m| m.modified())
            .is_ok_and(|m| m > built);
        if changed {
            newer.push(p.strip_prefix(repo()).unwrap_or(&p).display().to_string());
        }
    }
    if newer.is_empty() {
        Ok(())
    } else {
        newer.sort();
        Err(format!(
            "{} is older than its sources ({}): the tests would load a stale shim; rebuild it \
             with `cargo build -p gpushim-shim` (scripts/test.sh does)",
            lib.display(),
            newer.join(", ")
        ))
    }
}

/// The `gpushim` command of this build.
pub fn gpushim_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpushim"))
}

/// A fresh directory for one test, removed when the value is dropped unless the thread is
/// panicking (a failed test keeps its traces to look at) or `GPUSHIM_KEEP_TEST_DIRS` is set.
/// A CI machine's disk is small: each trace is tens of MiB and a run makes a hundred of them.
pub struct TestDir(PathBuf);

impl std::ops::Deref for TestDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for TestDir {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl AsRef<Path> for TestDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if !std::thread::panicking() && std::env::var_os("GPUSHIM_KEEP_TEST_DIRS").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl TestDir {
    /// A path named `name` inside this directory that keeps the directory alive while it lives.
    pub fn file(self, name: &str) -> TestFile {
        TestFile {
            path: self.0.join(name),
            _dir: self,
        }
    }
}

/// A file path inside a [`TestDir`]; the directory goes when this is dropped.
pub struct TestFile {
    path: PathBuf,
    _dir: TestDir,
}

impl std::ops::Deref for TestFile {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<std::ffi::OsStr> for TestFile {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.path.as_os_str()
    }
}

impl AsRef<Path> for TestFile {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

pub fn tempdir(name: &str) -> TestDir {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{}-{}-{}",
        name,
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    TestDir(d)
}

/// An empty library named like PyTorch's CUDA allocator (`libc10_cuda.so`) in `dir`: loaded
/// into a client, it makes the shim believe a framework with a caching allocator is present.
pub fn framework_library(dir: &Path) -> PathBuf {
    let src = dir.join("empty.c");
    std::fs::write(&src, "int c10_placeholder;\n").unwrap();
    let lib = dir.join("libc10_cuda.so");
    cc(&[
        "-shared",
        "-fPIC",
        "-o",
        lib.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    lib
}

pub fn cc(args: &[&str]) {
    let out = Command::new("cc")
        .args(args)
        .output()
        .expect("a C compiler (cc) is needed to build the CUDA simulator");
    assert!(
        out.status.success(),
        "cc {}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub struct Sim {
    /// Holds libcuda.so.1, libcudart.so.13 and the client programs.
    pub dir: PathBuf,
}

impl Sim {
    pub fn bin(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// The simulator and the clients, built once per test run: the first test binary that asks
/// builds them into a folder named by a hash of their sources (under a lock, so binaries run at
/// once never build twice); the others find the finished build and reuse it. A change to any
/// source makes a new folder.
pub fn sim() -> &'static Sim {
    static SIM: OnceLock<Sim> = OnceLock::new();
    SIM.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let dir = root.join(format!("sim-{:016x}", sim_sources_hash()));
        let done = dir.join(".built");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(root.join("sim.lock"))
            .expect("the simulator's lock file can be made in CARGO_TARGET_TMPDIR");
        // SAFETY: flock on a descriptor we own; released when `lock` is dropped below.
        let _ = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) };
        if !done.exists() {
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let out = Command::new("bash")
                .arg(repo().join("scripts/build-sim.sh"))
                .arg(&dir)
                .output()
                .expect("bash runs scripts/build-sim.sh");
            assert!(
                out.status.success(),
                "scripts/build-sim.sh failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::fs::write(&done, b"").unwrap();
        }
        drop(lock);
        Sim { dir }
    })
}

/// A hash of everything the simulator build reads: the build script, the simulator and the
/// clients.
fn sim_sources_hash() -> u64 {
    use std::hash::{Hash, Hasher};
    let mut files = vec![repo().join("scripts/build-sim.sh")];
    for d in ["tests/sim", "tests/clients", "tests/standin", "examples"] {
        let mut in_dir: Vec<PathBuf> = std::fs::read_dir(repo().join(d))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        in_dir.sort();
        files.extend(in_dir);
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for f in files {
        f.hash(&mut h);
        std::fs::read(&f).unwrap_or_default().hash(&mut h);
    }
    h.finish()
}

/// How to run a client.
#[derive(Default)]
pub struct Run<'a> {
    pub preload: bool,
    /// Trace path (sets GPUSHIM_TRACE).
    pub trace: Option<&'a Path>,
    pub env: Vec<(&'a str, String)>,
    pub args: Vec<String>,
}

pub fn run(program: &Path, opts: Run<'_>) -> Output {
    // A run that asks for no trace still writes one (the shim's default, in the working
    // directory: the repository). It goes to a directory of its own, removed afterwards.
    let default_trace = opts.preload
        && opts.trace.is_none()
        && !opts.env.iter().any(|(k, _)| *k == "GPUSHIM_TRACE");
    let scratch = default_trace.then(|| tempdir("untraced"));
    let mut c = command(program, opts);
    if let Some(d) = &scratch {
        c.env("GPUSHIM_TRACE", d.join("t.%p.trace"));
    }
    c.output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()))
}

/// The command `run` would run, to start it without waiting.
pub fn command(program: &Path, opts: Run<'_>) -> Command {
    let sim = sim();
    let mut c = Command::new(program);
    c.args(&opts.args)
        .env("LD_LIBRARY_PATH", &sim.dir)
        .env_remove("GPUSHIM_CONF")
        .env_remove("GPUSHIM_DISABLE")
        .env_remove("GPUSHIM_TRACE")
        .env_remove("LD_PRELOAD");
    if opts.preload {
        c.env("LD_PRELOAD", shim());
    }
    if let Some(t) = opts.trace {
        c.env("GPUSHIM_TRACE", t);
    }
    for (k, v) in &opts.env {
        c.env(k, v);
    }
    c
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[track_caller]
pub fn assert_ok(o: &Output) {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        stdout(o),
        stderr(o)
    );
}

pub fn decode(path: &Path) -> (Vec<Record>, DecodeStats) {
    let mut r = TraceReader::open(path)
        .unwrap_or_else(|e| panic!("cannot open trace {}: {e}", path.display()));
    let records: Vec<Record> = r.by_ref().collect();
    (records, r.stats().clone())
}

/// The records that stand for application calls (not thread or stream announcements, nor
/// the pool's own decisions, nor the memory figures it showed the caller).
pub fn calls(records: &[Record]) -> Vec<Record> {
    records
        .iter()
        .filter(|r| {
            !matches!(
                r.kind,
                RecordKind::ThreadStart | RecordKind::StreamName | RecordKind::MemInfoShown
            ) && r.api != gpushim::trace::format::Api::Shim
        })
        .copied()
        .collect()
}

pub fn api_names(records: &[Record]) -> Vec<&'static str> {
    calls(records).iter().map(|r| r.api.name()).collect()
}

/// A trace written by hand: a recorder opened on `path`, and one record at a time with
/// increasing time stamps (1 µs apart), on device 0, thread 0.
pub struct HandTrace {
    pub recorder: Box<gpushim::trace::recorder::Recorder>,
    t: u64,
}

impl HandTrace {
    pub fn create(path: &Path) -> HandTrace {
        HandTrace::create_on(path, b"test")
    }

    /// A trace whose header names host `host`.
    pub fn create_on(path: &Path, host: &[u8]) -> HandTrace {
        let recorder = Box::new(gpushim::trace::recorder::Recorder::new());
        assert!(recorder.begin_open());
        recorder
            .open(&gpushim::trace::recorder::OpenOptions {
                path: path.to_str().unwrap().as_bytes(),
                pid: 1,
                rank: 0,
                host,
                program: b"hand",
                cmdline: b"hand\0",
                env: b"",
                trace_max: 64 << 20,
                ring: false,
            })
            .unwrap();
        HandTrace { recorder, t: 0 }
    }

    /// Lets `ns` pass before the next record.
    pub fn wait(&mut self, ns: u64) {
        self.t += ns;
    }

    pub fn rec(&mut self, kind: RecordKind, api: gpushim::trace::format::Api, ptr: u64, size: u64) {
        self.rec_on(0, kind, api, ptr, size);
    }

    /// `rec` from thread `thread`.
    pub fn rec_on(
        &mut self,
        thread: u16,
        kind: RecordKind,
        api: gpushim::trace::format::Api,
        ptr: u64,
        size: u64,
    ) {
        self.t += 1000;
        self.recorder
            .append(&record_at(kind, api, 0, thread, self.t, ptr, size));
    }

    /// A call of `thread` on device 0 that failed with CUDA result `status`.
    pub fn failed_on(
        &mut self,
        thread: u16,
        kind: RecordKind,
        api: gpushim::trace::format::Api,
        status: u8,
        size: u64,
    ) {
        self.t += 1000;
        let mut r = record_at(kind, api, 0, thread, self.t, 0, size);
        r.status = status;
        self.recorder.append(&r);
    }

    /// A `cudaMalloc` (`kind` an allocation) or `cudaFree` on `device` from `thread`.
    pub fn call(&mut self, kind: RecordKind, device: u8, thread: u16, ptr: u64, size: u64) {
        use gpushim::trace::format::Api;
        let api = if kind == RecordKind::Free {
            Api::CudaFree
        } else {
            Api::CudaMalloc
        };
        self.t += 1000;
        self.recorder
            .append(&record_at(kind, api, device, thread, self.t, ptr, size));
    }
}

/// A record of a call that succeeded, on no stream, for the tests that write traces by hand.
pub fn record_at(
    kind: RecordKind,
    api: gpushim::trace::format::Api,
    device: u8,
    thread: u16,
    time_ns: u64,
    ptr: u64,
    size: u64,
) -> Record {
    Record {
        kind,
        api,
        device,
        status: 0,
        thread,
        time_ns,
        ptr,
        size,
        stream: 0,
    }
}

/// The one way the tests run a report: `gpushim ARGS... TRACES... --json`, which must succeed;
/// its JSON.
pub fn report_json(args: &[&str], traces: &[&Path]) -> serde_json::Value {
    let out = Command::new(gpushim_bin())
        .args(args)
        .args(traces)
        .arg("--json")
        .output()
        .unwrap_or_else(|e| panic!("cannot run gpushim: {e}"));
    assert_ok(&out);
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("gpushim {args:?} printed no JSON ({e}): {}", stdout(&out)))
}

/// Runs the command with `args` (text and paths alike).
pub fn gpushim(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    Command::new(gpushim_bin())
        .args(args.iter().map(|a| a.as_ref()))
        .output()
        .unwrap()
}

/// Runs the command with `args` and no `GPUSHIM_CONF` from the environment.
pub fn gpushim_text(args: &[&str]) -> std::process::Output {
    Command::new(gpushim_bin())
        .args(args)
        .env_remove("GPUSHIM_CONF")
        .output()
        .unwrap()
}

/// The bundled example under the shim with stacks, as the demo runs it.
pub fn train_loop_trace(name: &str) -> TestFile {
    let t = tempdir(name).file("train.trace");
    let out = run(
        &sim().bin("train_loop"),
        Run {
            preload: true,
            trace: Some(&t),
            env: vec![("GPUSHIM_CONF", "pool:caching,stacks:on".into())],
            args: vec!["20".into()],
        },
    );
    assert_ok(&out);
    t
}

/// The report tests' client (`tests/clients/leaky.c`): NVTX "step" iterations, 512 KiB leaked
/// per step from leak(), a 200 MiB spike from spike() in step 6, one allocation on device 1,
/// one failed 64 GiB request.
pub struct Leaky {
    pub trace: TestFile,
    pub leak_fn: Func,
    pub spike_fn: Func,
}

/// A function of the client: its name and where it starts in the executable.
pub struct Func {
    pub name: &'static str,
    pub start: u64,
}

pub fn leaky() -> Leaky {
    leaky_steps("reports", 12)
}

/// Runs the client under the shim for `steps` iterations and reads what it printed.
pub fn leaky_steps(dir: &str, steps: u32) -> Leaky {
    let t = tempdir(dir).file("leaky.trace");
    let out = run(
        &sim().bin("leaky"),
        Run {
            preload: true,
            trace: Some(&t),
            env: vec![
                ("GPUSHIM_CONF", "pool:caching,stacks:on".into()),
                ("GPUSHIM_SIM_DEVICES", "2".into()),
                ("GPUSHIM_SIM_MEMORY", (1u64 << 30).to_string()),
                ("NVTX_INJECTION64_PATH", shim().display().to_string()),
            ],
            args: vec![steps.to_string()],
        },
    );
    assert_ok(&out);
    let s = stdout(&out);
    let get = |k: &str| -> u64 {
        s.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{k} missing from {s}"))
    };
    assert!(s.contains("huge 2"), "{s}");
    Leaky {
        trace: t,
        leak_fn: Func {
            name: "leak",
            start: get("leak_fn "),
        },
        spike_fn: Func {
            name: "spike",
            start: get("spike_fn "),
        },
    }
}

/// Whether a call site's innermost frame is in `f`: named from the executable's symbol table
/// (`leak (leaky+0x123b) < ...`), or, with `--no-symbols`, `leaky+0x123b` inside the function
/// (the client's functions are a few dozen bytes long).
pub fn in_function(label: &str, f: &Func) -> bool {
    let first = label.split(" < ").next().unwrap_or("");
    if first.starts_with(&format!("{} (leaky+0x", f.name)) {
        return true;
    }
    let Some(off) = first.strip_prefix("leaky+0x") else {
        return false;
    };
    let off = u64::from_str_radix(off, 16).unwrap_or(0);
    (f.start..f.start + 0x60).contains(&off)
}

/// A small deterministic generator, so failures reproduce.
pub struct XorShift(pub u64);

impl XorShift {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A recorder writing a ring trace of at most `trace_max` bytes to `path` (the program "ring"),
/// for tests that make traces of any length in the test itself.
pub fn ring_recorder(path: &Path, trace_max: u64) -> Box<gpushim::trace::recorder::Recorder> {
    let r = Box::new(gpushim::trace::recorder::Recorder::new());
    assert!(r.begin_open());
    r.open(&gpushim::trace::recorder::OpenOptions {
        path: path.to_str().unwrap().as_bytes(),
        pid: 1,
        rank: 0,
        host: b"h",
        program: b"ring",
        cmdline: b"ring\0",
        env: b"",
        trace_max,
        ring: true,
    })
    .unwrap();
    r
}

/// The kinds program (`tests/clients/kinds/train.py`, on the PyTorch stand-in) under the shim,
/// `steps` steps, keeping each step's last activation with `leak`, tracing to `trace`, with
/// `env`: what it did.
pub fn kinds_program(
    trace: &Path,
    steps: u32,
    leak: bool,
    env: Vec<(&'static str, String)>,
) -> Output {
    kinds_program_with(trace, steps, leak, &[], env)
}

/// The kinds program as [`kinds_program`] runs it, with `more` words at the end of its command
/// line (a training script's flags).
pub fn kinds_program_with(
    trace: &Path,
    steps: u32,
    leak: bool,
    more: &[&str],
    env: Vec<(&'static str, String)>,
) -> Output {
    let lib = |n: &str| sim().dir.join("torch/lib").join(n).display().to_string();
    let mut args = vec![
        lib("libtorch_cpu.so"),
        lib("libc10_cuda.so"),
        steps.to_string(),
    ];
    if leak {
        args.push("leak".into());
    }
    args.extend(more.iter().map(|w| w.to_string()));
    python_client(trace, "kinds/train.py", args, env)
}

/// The Python program `tests/clients/{script}` with `args` under the shim, tracing to `trace`,
/// with `env` (and no bytecode written into the repository): what it did.
pub fn python_client(
    trace: &Path,
    script: &str,
    args: Vec<String>,
    mut env: Vec<(&'static str, String)>,
) -> Output {
    let mut all = vec![
        repo()
            .join("tests/clients")
            .join(script)
            .display()
            .to_string(),
    ];
    all.extend(args);
    env.push(("PYTHONDONTWRITEBYTECODE", "1".into()));
    run(
        Path::new("python3"),
        Run {
            preload: true,
            trace: Some(trace),
            args: all,
            env,
        },
    )
}

/// `cargo test` fails on a stale shim: one whose sources changed after it was built.
#[test]
fn a_shim_older_than_its_sources_is_refused() {
    let dir = tempdir("stale-shim");
    let lib = dir.join("libgpushim.so");
    std::fs::write(&lib, b"").unwrap();
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600 * 24 * 365 * 30);
    std::fs::File::options()
        .write(true)
        .open(&lib)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let e = shim_is_fresh(&lib).unwrap_err();
    assert!(
        e.contains("older than its sources") && e.contains("shim/src/"),
        "{e}"
    );
    assert!(e.contains("cargo build -p gpushim-shim"), "{e}");
    assert_eq!(shim_is_fresh(&shim()), Ok(()));
}

/// Says that a part of a test was skipped, and why, on stderr and in a list the test run
/// keeps (`CARGO_TARGET_TMPDIR/skipped.txt`), which `scripts/test.sh` prints at the end of the
/// run: a skip is never hidden in cargo's captured output.
pub fn skipped(test: &str, why: &str) {
    use std::io::Write;
    eprintln!("skipped: {test}: {why}");
    let list = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("skipped.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(list)
    {
        let _ = writeln!(f, "{test}: {why}");
    }
}

/// Every Rust file under `dir`.
pub fn rust_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}
