//! `gpushim run -- CMD`: runs a command under the shim and reports where its traces are.

mod notes;
mod private;

use notes::RunNotes;
use private::ensure_private;
pub(crate) use private::private_folder;
pub use private::{private_folder_among, write_checked};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

pub const LIB_NAME: &str = "libgpushim.so";

/// Why `gpushim run` (or `gpushim lib`) cannot start the program. Each says what to do.
#[derive(Debug)]
pub enum RunError {
    /// `--lib` or `GPUSHIM_LIB` (the source named) points at no file.
    LibMissing { source: &'static str, path: PathBuf },
    /// The command cannot find its own executable (to look beside it).
    NoSelf(std::io::Error),
    /// No shim next to the command or in `../lib` (the folder looked in).
    LibNotFound(PathBuf),
    /// The folder the bundled shim is written to is not this user's alone.
    NotPrivate(PathBuf),
    /// A file or folder could not be used (what, and the system's reason).
    Io(PathBuf, std::io::Error),
    /// The trace pattern does not expand.
    Pattern(String, crate::trace::recorder::PatternError),
    /// The trace's folder (described) cannot take it.
    TraceFolder(String, FolderProblem),
    /// `gpushim run` with no command.
    NothingToRun,
    /// The trace's folder (as named) is reached through `link`, into `lands`, which another
    /// user controls (why).
    TraceThroughLink {
        named: PathBuf,
        link: PathBuf,
        lands: PathBuf,
        why: String,
    },
    /// The folder holding the private folder can be changed by another user.
    Untrusted(crate::files::Untrusted),
    /// Neither `XDG_CACHE_HOME`, `HOME` nor `XDG_RUNTIME_DIR` names a folder to write to.
    NoPrivateFolder,
    /// Python was given a flag (`-I`, `-E`, `-S`) under which it reads no `sitecustomize`
    /// from PYTHONPATH, so `--pluggable`/`--per-tensor` could install nothing.
    PythonIgnoresSite(char),
    /// The command could not be started.
    Spawn(PathBuf, std::io::Error),
}

/// What is wrong with a trace's folder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FolderProblem {
    Missing,
    NulByte,
    NotWritable,
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::LibMissing { source, path } => {
                write!(f, "{source}{}: no such file", crate::files::shown(path))
            }
            RunError::NoSelf(e) => write!(f, "cannot locate gpushim itself: {e}"),
            RunError::LibNotFound(dir) => write!(
                f,
                "cannot find {LIB_NAME} next to {} or in ../lib; build it with \
                 `cargo build --release -p gpushim-shim`, or pass --lib PATH",
                crate::files::shown(dir)
            ),
            RunError::NotPrivate(dir) => write!(
                f,
                "{} is not a private folder of this user (a link, or owned by another): not \
                 writing there; remove it, or set XDG_CACHE_HOME to a folder of yours",
                crate::files::shown(dir)
            ),
            RunError::Io(path, e) => write!(f, "cannot use {}: {e}", crate::files::shown(path)),
            RunError::Untrusted(why) => write!(
                f,
                "{why}, so another user could change the files gpushim keeps there (the shim it \
                 preloads among them): not using it; set XDG_CACHE_HOME to a folder of yours \
                 that only you can write"
            ),
            RunError::PythonIgnoresSite(flag) => write!(
                f,
                "python -{flag} reads no sitecustomize from PYTHONPATH, so --pluggable and \
                 --per-tensor could not set PyTorch up: drop -{flag}, or call \
                 gpushim.torch_allocator() in the program before its first CUDA tensor"
            ),
            RunError::NoPrivateFolder => write!(
                f,
                "no folder of this user's to write to: set HOME (or XDG_CACHE_HOME) to an \
                 absolute path of a folder you own"
            ),
            RunError::Pattern(p, e) => write!(f, "trace pattern '{p}': {e}"),
            RunError::TraceFolder(what, FolderProblem::Missing) => {
                write!(
                    f,
                    "{what} does not exist: create it, or pick another --trace"
                )
            }
            RunError::TraceFolder(what, FolderProblem::NulByte) => {
                write!(f, "{what}: the path holds a NUL byte")
            }
            RunError::TraceFolder(what, FolderProblem::NotWritable) => {
                write!(
                    f,
                    "{what} cannot be written by this user: pick another --trace"
                )
            }
            RunError::TraceThroughLink {
                named,
                link,
                lands,
                why,
            } => write!(
                f,
                "the trace's folder {} is reached through the link {} into {}, and {why}: that \
                 user, not you, would decide where the trace lands and could take it away. \
                 Not running; name a folder of your own with --trace (or name the real folder \
                 itself, if you mean it)",
                crate::files::shown(named),
                crate::files::shown(link),
                crate::files::shown(lands)
            ),
            RunError::NothingToRun => f.write_str(
                "nothing to run: give a command after --, as in `gpushim run -- python train.py`",
            ),
            RunError::Spawn(prog, e) => write!(f, "cannot run {}: {e}", crate::files::shown(prog)),
        }
    }
}

impl std::error::Error for RunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunError::NoSelf(e) | RunError::Io(_, e) | RunError::Spawn(_, e) => Some(e),
            RunError::Pattern(_, e) => Some(e),
            _ => None,
        }
    }
}

/// Finds `libgpushim.so`: the explicit path, `GPUSHIM_LIB`, then next to this executable and in
/// `../lib` from it.
pub fn find_shim(explicit: Option<&Path>) -> Result<PathBuf, RunError> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(RunError::LibMissing {
                source: "--lib ",
                path: p.to_path_buf(),
            })
        };
    }
    if let Some(p) = std::env::var_os("GPUSHIM_LIB") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(RunError::LibMissing {
                source: "GPUSHIM_LIB=",
                path: p,
            })
        };
    }
    let exe = std::env::current_exe().map_err(RunError::NoSelf)?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    for cand in [dir.join(LIB_NAME), dir.join("../lib").join(LIB_NAME)] {
        if cand.is_file() {
            return Ok(cand.canonicalize().unwrap_or(cand));
        }
    }
    #[cfg(feature = "bundle-shim")]
    {
        bundled::write_out()
    }
    #[cfg(not(feature = "bundle-shim"))]
    Err(RunError::LibNotFound(dir.to_path_buf()))
}

/// The shim carried inside this command (the Python wheel's build), written out once to a
/// private folder and checked byte for byte before each use, so a file planted there by anyone
/// else is never preloaded.
#[cfg(feature = "bundle-shim")]
mod bundled {
    use std::path::PathBuf;

    use super::RunError;

    static SHIM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libgpushim.so"));
    /// The fingerprint of the sources the carried shim was built from (build.rs).
    pub static SOURCES: &str = include_str!(concat!(env!("OUT_DIR"), "/shim_sources.txt"));

    pub fn write_out() -> Result<PathBuf, RunError> {
        let name = format!("libgpushim-{}-{:016x}.so", env!("CARGO_PKG_VERSION"), {
            use std::hash::Hasher;
            let mut h = crate::fasthash::FastHasher::default();
            h.write(SHIM);
            h.finish()
        });
        let path = super::private_folder()?.join(name);
        super::write_checked(&path, SHIM, 0o755)?;
        Ok(path)
    }
}

/// The fingerprint of the sources the shim this command carries was built from (FNV-1a over
/// `shim/`, `src/core/`, `Cargo.toml` and `Cargo.lock`, as build.rs computes it); `None` when it
/// carries none.
pub fn bundled_sources() -> Option<&'static str> {
    #[cfg(feature = "bundle-shim")]
    {
        Some(bundled::SOURCES)
    }
    #[cfg(not(feature = "bundle-shim"))]
    None
}

/// A colon-separated list (`LD_PRELOAD`, `PYTHONPATH`) with `shim` (or another path) first
/// and whatever it held before kept after it.
pub fn preload_value(shim: &Path, existing: Option<OsString>) -> OsString {
    let mut v = OsString::from(shim.as_os_str());
    if let Some(e) = existing.filter(|e| !e.is_empty()) {
        v.push(":");
        v.push(e);
    }
    v
}

/// Whether a trace will be written where `pattern` (`--trace` or `GPUSHIM_TRACE`, the default
/// when `None`) points, checked before the program starts, so a long job never runs
/// unrecorded by mistake. `Ok(false)`: recording was turned off on purpose (`off`).
pub fn check_trace(pattern: Option<&str>) -> Result<bool, RunError> {
    let Some(pattern) = pattern.filter(|p| !p.is_empty()) else {
        return writable_dir(Path::new("."), "the working directory").map(|_| true);
    };
    if pattern.eq_ignore_ascii_case("off") {
        return Ok(false);
    }
    let mut buf = [0u8; crate::trace::recorder::PATH_CAP];
    let n = crate::trace::recorder::expand_pattern(
        pattern.as_bytes(),
        std::process::id(),
        b"host",
        0,
        &mut buf,
    )
    .map_err(|e| RunError::Pattern(pattern.to_string(), e))?;
    let path = PathBuf::from(String::from_utf8_lossy(&buf[..n]).into_owned());
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    writable_dir(&dir, &format!("the folder {}", crate::files::shown(&dir)))?;
    not_through_a_link_to_others(&dir)?;
    if !pattern.contains("%p") && path.symlink_metadata().is_ok() {
        // Traces are never overwritten, and a name already there never turns recording off.
        eprintln!(
            "gpushim: {} exists: the trace takes another name beside it, said at the end",
            crate::files::shown(&path)
        );
    }
    Ok(true)
}

/// Refuses a trace folder named through a link that another user owns, or that leads into a
/// folder another user controls ([`crate::files::others_control`]): the trace would land where
/// that user decides and could be replaced there. A folder named as it is, even a shared one
/// like `/tmp`, is the user's choice; so is a link of the user's own into a folder of theirs.
fn not_through_a_link_to_others(dir: &Path) -> Result<(), RunError> {
    let mut at = PathBuf::new();
    let mut first_link = None;
    for part in dir.components() {
        at.push(part);
        if std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
            first_link = Some(at.clone());
            break;
        }
    }
    let Some(link) = first_link else {
        return Ok(());
    };
    let lands = dir
        .canonicalize()
        .map_err(|e| RunError::Io(dir.to_path_buf(), e))?;
    // The shim's own rule first (any link another user owns on the way), so `run` never
    // starts a program whose trace the shim would then refuse.
    let mut probe = dir.as_os_str().as_encoded_bytes().to_vec();
    probe.extend_from_slice(b"/x.trace");
    let why = if let Some(owner) = crate::trace::recorder::foreign_link(&probe) {
        Some(format!(
            "a link on the way belongs to another user (uid {owner})"
        ))
    } else {
        crate::files::others_control(&lands)
            .err()
            .map(|e| e.to_string())
    };
    match why {
        None => Ok(()),
        Some(why) => Err(RunError::TraceThroughLink {
            named: dir.to_path_buf(),
            link,
            lands,
            why,
        }),
    }
}

fn writable_dir(dir: &Path, what: &str) -> Result<(), RunError> {
    let problem = |p| RunError::TraceFolder(what.to_string(), p);
    if !dir.is_dir() {
        return Err(problem(FolderProblem::Missing));
    }
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| problem(FolderProblem::NulByte))?;
    // SAFETY: a NUL-terminated path; access only reads it.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
        return Err(problem(FolderProblem::NotWritable));
    }
    Ok(())
}
pub struct RunOutcome {
    pub exit_code: i32,
    /// The signal that ended the program, when one did (its exit code is then 128 + it).
    pub signal: Option<i32>,
    pub traces: Vec<PathBuf>,
}

/// `trace` as a pattern: a folder that exists (or a path ending in `/`) takes the traces inside
/// it, named as by default (`gpushim-PROGRAM.%p.trace`, PROGRAM the command's file name).
pub fn in_folder(trace: &str, program: Option<&OsString>) -> String {
    if !(trace.ends_with('/') || Path::new(trace).is_dir()) {
        return trace.to_string();
    }
    let name = program
        .map(Path::new)
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .filter(|n| !n.contains('%'))
        .unwrap_or("program");
    format!("{}/gpushim-{name}.%p.trace", trace.trim_end_matches('/'))
}

/// The pool `--per-tensor` adds when `--conf` names none: plain segments, requests of 1 to 10
/// MiB sharing 20 MiB ones as PyTorch's own allocator does. Beside plain `pool:caching` in the
/// same GPU runs (H100, steady steps): transformer 0.993x against 1.267x PyTorch's
/// default step (3 rounds, faster in each), GPT-2 1.07x against 1.13x (2 rounds, faster in
/// each), ResNet-50 slower in both of 2 rounds (28.5/32.9 against 25.5/31.9 ms); replayed on
/// GPT-2 traces, half the device allocations at the same or a lower peak reserved.
pub const PER_TENSOR_POOL: &str = "pool:caching,medium:20MiB";

/// The pool `--pluggable` adds when `--conf` names none: PyTorch's pluggable allocator over
/// expandable segments used as little device memory as PyTorch's own expandable segments on
/// GPT-2, ResNet-50 and a transformer (README, Benchmarks).
pub const PLUGGABLE_POOL: &str = "pool:expandable";

/// How PyTorch's tensors reach the shim: through its own cache (segments only, the default),
/// one `cudaMalloc` each with its cache off (`--per-tensor`), or through its pluggable
/// allocator, installed when the program imports torch (`--pluggable`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TorchRoute {
    Cache,
    PerTensor,
    Pluggable,
}

impl TorchRoute {
    /// The run's configuration from the one given (`--conf`, else `GPUSHIM_CONF`): as given
    /// with PyTorch's cache; for the other two, after the route's pool ([`PER_TENSOR_POOL`],
    /// [`PLUGGABLE_POOL`]) unless it names a pool itself (a key given later wins, so
    /// `--conf medium:off` turns medium off).
    pub fn conf(self, given: Option<&str>) -> Option<String> {
        let pool = match self {
            TorchRoute::Cache => return given.map(str::to_string),
            TorchRoute::PerTensor => PER_TENSOR_POOL,
            TorchRoute::Pluggable => PLUGGABLE_POOL,
        };
        Some(match given.map(str::trim).filter(|g| !g.is_empty()) {
            None => pool.to_string(),
            Some(g) if g.split(',').any(|kv| kv.trim().starts_with("pool:")) => g.to_string(),
            Some(g) => format!("{pool},{g}"),
        })
    }
}

/// The `sitecustomize` that installs PyTorch's pluggable allocator at `import torch`.
const TORCH_SITE: &str = include_str!("../torch_site.py");

/// The folder on the run's PYTHONPATH holding [`TORCH_SITE`] as `sitecustomize.py`, inside
/// [`private_folder`] and named by its content. It is never removed: the path stays in the
/// environment of whatever the program leaves running, and a removed folder in a shared place
/// could be created again by another user, whose `sitecustomize.py` would then run as this
/// user. Inside a folder of this user's alone nobody else can create it.
fn torch_site() -> Result<PathBuf, RunError> {
    use std::hash::Hasher;
    let mut h = crate::fasthash::FastHasher::default();
    h.write(TORCH_SITE.as_bytes());
    let dir = private_folder()?.join(format!("site-{:016x}", h.finish()));
    ensure_private(&dir)?;
    write_checked(&dir.join("sitecustomize.py"), TORCH_SITE.as_bytes(), 0o600)?;
    Ok(dir)
}

/// The flag among Python's own options (those before the script, `-c` or `-m`) under which it
/// reads no `sitecustomize` from PYTHONPATH: `-I` (isolated), `-E` (no PYTHON* variables),
/// `-S` (no `site`). `None` for a program that is not Python.
fn python_flag_ignoring_site(prog: &OsString, args: &[OsString]) -> Option<char> {
    let name = Path::new(prog).file_name()?.to_str()?;
    if !name.starts_with("python") {
        return None;
    }
    let mut args = args.iter().filter_map(|a| a.to_str());
    while let Some(a) = args.next() {
        if a == "-" || a == "--" || !a.starts_with('-') || a.starts_with("--") {
            return None;
        }
        let cluster = &a[1..];
        for (i, c) in cluster.char_indices() {
            match c {
                'I' | 'E' | 'S' => return Some(c),
                // The rest of the word, or the next one, is the option's value or the code.
                'c' | 'm' => return None,
                'W' | 'X' => {
                    if i + 1 == cluster.len() {
                        args.next();
                    }
                    break;
                }
                _ => {}
            }
        }
    }
    None
}
pub fn run(
    shim: &Path,
    conf: Option<&str>,
    trace: Option<&str>,
    route: TorchRoute,
    cmd: &[OsString],
) -> Result<RunOutcome, RunError> {
    let (prog, args) = cmd.split_first().ok_or(RunError::NothingToRun)?;
    // Absolute: the dynamic loader resolves a relative LD_PRELOAD against each process's own
    // working folder, and the program's children may run elsewhere.
    let shim = &std::path::absolute(shim).unwrap_or_else(|_| shim.to_path_buf());
    let notes = RunNotes::new()?;
    let mut c = Command::new(prog);
    c.args(args);
    c.env(
        "LD_PRELOAD",
        preload_value(shim, std::env::var_os("LD_PRELOAD")),
    );
    // NVTX ranges (torch.cuda.nvtx, ...) become trace records; another tool's injection wins.
    if std::env::var_os("NVTX_INJECTION64_PATH").is_none() {
        c.env("NVTX_INJECTION64_PATH", shim);
    } else {
        eprintln!("gpushim: NVTX_INJECTION64_PATH is already set; NVTX ranges will not be traced");
    }
    if let Some(conf) = conf {
        c.env("GPUSHIM_CONF", conf);
    }
    // Each process that opens a trace leaves a note of it in a folder of this user's alone, and
    // `gpushim run` names those traces itself when the command ends (the shim need not).
    c.env("GPUSHIM_RUN_REPORT", notes.folder());
    // What the `sitecustomize` (`torch_site.py`) does at `import torch`, if it is written.
    let site_does = match route {
        TorchRoute::Cache => None,
        TorchRoute::PerTensor => {
            // PyTorch allocates every tensor with cudaMalloc and frees it with cudaFree. Its
            // counters would read 0; with a pool they answer from it.
            c.env("PYTORCH_NO_CUDA_MEMORY_CACHING", "1");
            let pooled = conf
                .and_then(|t| crate::config::parse_strict(t).ok())
                .is_some_and(|p| p.pool != crate::config::Pool::Off);
            pooled.then_some("GPUSHIM_TORCH_STATS")
        }
        TorchRoute::Pluggable => Some("GPUSHIM_TORCH_PLUGGABLE"),
    };
    if let Some(var) = site_does {
        if let Some(flag) = python_flag_ignoring_site(prog, args) {
            return Err(RunError::PythonIgnoresSite(flag));
        }
        let site = torch_site()?;
        c.env(
            "PYTHONPATH",
            preload_value(&site, std::env::var_os("PYTHONPATH")),
        );
        c.env(var, shim);
    }
    if let Some(t) = trace {
        c.env("GPUSHIM_TRACE", t);
    }
    let status = c
        .status()
        .map_err(|e| RunError::Spawn(PathBuf::from(prog), e))?;
    use std::os::unix::process::ExitStatusExt;
    let signal = status.signal();
    let exit_code = match status.code() {
        Some(c) => c,
        None => 128 + signal.unwrap_or(0),
    };
    let traces = notes.traces();
    Ok(RunOutcome {
        exit_code,
        signal,
        traces,
    })
}

#[cfg(test)]
mod tests;
