//! Names stack frames offline, after the run: function, file and line from a module's DWARF
//! (addr2line), else the nearest symbol of its symbol table, else `module+0xoffset`. A module
//! that cannot be read (moved, deleted, another machine) is named once on stderr and its frames
//! stay `module+0xoffset`. A module is named only from the file that ran: where the trace
//! holds the module's GNU build-id (the shim reads it from the loaded image), a file on disk
//! with another one, or with none, is not read (a rebuilt library would give wrong names), and
//! that is said once per module.

use crate::trace::reader::{TraceTables, printable};
use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether an unreadable module was reported: one line in all, not one per module.
static UNREADABLE_SAID: AtomicBool = AtomicBool::new(false);

/// Opens a module named by a trace, which anyone may have written: only a regular file, opened
/// without blocking (a FIFO or a device never stalls the report). The path to read it by is the
/// open descriptor's, so the file checked is the file read.
fn open_module(path: &str) -> Result<(File, String), String> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| e.to_string())?;
    let meta = f.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    // A library is some bytes to some gigabytes. A file of no length that still reads (a
    // `/proc` file such as `/proc/self/pagemap`, gigabytes long to a reader) or one past the
    // bound (a sparse file) is no module.
    if meta.len() == 0 || meta.len() > MAX_MODULE_BYTES {
        return Err(format!(
            "{} bytes long, not a library (one is between 1 byte and {} GiB)",
            meta.len(),
            MAX_MODULE_BYTES >> 30
        ));
    }
    // Nor is a file mostly holes: a library's bytes are on disk (a compressing file system
    // keeps more than a sixteenth of them).
    use std::os::unix::fs::MetadataExt;
    if meta.len() > 1 << 20 && meta.blocks().saturating_mul(512) < meta.len() / 16 {
        return Err(format!(
            "{} bytes long with {} on disk, a sparse file, not a library",
            meta.len(),
            meta.blocks().saturating_mul(512)
        ));
    }
    use std::os::fd::AsRawFd;
    let by_fd = format!("/proc/self/fd/{}", f.as_raw_fd());
    Ok((f, by_fd))
}

/// The largest module file named from: PyTorch's CUDA library with its debug information is
/// a few gigabytes.
const MAX_MODULE_BYTES: u64 = 16 << 30;

/// What is known of one frame.
#[derive(Clone, Debug, Default)]
pub struct FrameInfo {
    /// The module's file name (no directory), when known.
    pub module: Option<String>,
    pub offset: u64,
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    /// A Python frame: `file` is the source file's path, `function` its qualified name.
    pub python: bool,
}

impl FrameInfo {
    /// `function (file:line)`, `function (module+0xoffset)`, `module+0xoffset` or the bare
    /// address. Without a line the offset stays, so two call sites in one function read apart.
    pub fn label(&self) -> String {
        if self.python && self.file.as_deref() == Some(BACKWARD) {
            return format!(
                "{} (autograd's backward)",
                self.function.as_deref().unwrap_or("?")
            );
        }
        if self.python {
            return format!(
                "{}:{} in {}",
                short_path(self.file.as_deref().unwrap_or("?")),
                self.line.unwrap_or(0),
                self.function.as_deref().unwrap_or("?")
            );
        }
        match (&self.function, &self.file, self.line, &self.module) {
            (Some(f), Some(file), Some(line), _) => format!("{f} ({file}:{line})"),
            (Some(f), _, _, Some(m)) => format!("{f} ({m}+{:#x})", self.offset),
            (Some(f), _, _, None) => f.clone(),
            (None, _, _, Some(m)) => format!("{m}+{:#x}", self.offset),
            (None, _, _, None) => format!("{:#x}", self.offset),
        }
    }
}

/// The file of the frame that stands for a tensor PyTorch's autograd thread allocated (no Python
/// runs there): its function is the backward function that asked (`MmBackward0`).
pub const BACKWARD: &str = "<backward>";

/// A Python source path as reports show it: inside an installed package, from the package on
/// (`torch/nn/modules/linear.py`); in the standard library, from there on; else the file name.
pub fn short_path(file: &str) -> &str {
    for marker in ["/site-packages/", "/dist-packages/"] {
        if let Some(i) = file.rfind(marker) {
            return &file[i + marker.len()..];
        }
    }
    if let Some(i) = file.find("/lib/python3") {
        let rest = &file[i + 5..];
        return rest.split_once('/').map_or(rest, |(_, r)| r);
    }
    file.rsplit('/').next().unwrap_or(file)
}

/// Whether a Python file is the program's own: not in an installed package, not in the
/// standard library, not frozen or generated (`<frozen ...>`, `<string>`).
pub fn is_program_file(file: &str) -> bool {
    !(file.contains("/site-packages/")
        || file.contains("/dist-packages/")
        || file.contains("/lib/python3")
        || file.starts_with('<'))
}

/// A module's function symbols with their sizes, sorted by address: a name is given only to an
/// address inside the symbol (the nearest exported symbol below a local function is not it).
struct Symbols(Vec<(u64, u64, String)>);

impl Symbols {
    fn of(file: Option<&object::File<'_>>) -> Symbols {
        use object::{Object, ObjectSymbol, SymbolKind};
        let mut v = Vec::new();
        if let Some(file) = file {
            for s in file.symbols().chain(file.dynamic_symbols()) {
                if s.kind() == SymbolKind::Text
                    && s.size() > 0
                    && let Ok(name) = s.name()
                {
                    v.push((s.address(), s.size(), name.to_string()));
                }
            }
        }
        v.sort();
        v.dedup_by_key(|e| e.0);
        Symbols(v)
    }

    fn find(&self, probe: u64) -> Option<&str> {
        let i = self.0.partition_point(|e| e.0 <= probe).checked_sub(1)?;
        let (addr, size, name) = &self.0[i];
        (probe < addr + size).then_some(name.as_str())
    }
}

/// A frame's function, source file and line, as far as known.
type Named = (Option<String>, Option<String>, Option<u32>);

#[derive(Default)]
struct Cache {
    loaders: HashMap<String, Option<(addr2line::Loader, Symbols)>>,
    frames: HashMap<(String, u64), Named>,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache::default());
}

/// The frame at return address `ip`.
pub fn frame(tables: &TraceTables, ip: u64) -> FrameInfo {
    if let Some((id, line)) = crate::trace::format::as_py_frame(ip) {
        let text = tables.string(id).unwrap_or("");
        let (file, function) = text.split_once('\0').unwrap_or((text, ""));
        let or_unknown = |s: &str| {
            if s.is_empty() {
                "?".to_string()
            } else {
                s.to_string()
            }
        };
        return FrameInfo {
            file: Some(or_unknown(file)),
            function: Some(or_unknown(function)),
            line: Some(line),
            python: true,
            ..FrameInfo::default()
        };
    }
    let Some((base, path)) = tables.module_of(ip) else {
        return FrameInfo {
            offset: ip,
            ..FrameInfo::default()
        };
    };
    let offset = ip - base;
    let mut info = FrameInfo {
        module: Some(path.rsplit('/').next().unwrap_or(path).to_string()),
        offset,
        ..FrameInfo::default()
    };
    if tables.symbols() && !path.is_empty() && !path.starts_with('[') {
        // A return address: the call is the instruction before it.
        let ran = tables.build_id_of(base);
        let (function, file, line) = lookup(path, ran, offset.saturating_sub(1));
        (info.function, info.file, info.line) = (function, file, line);
    }
    info
}

/// Whether the module file `file` (`None`: not an object file) is the one that ran, whose
/// build-id was `ran` (hex; `None` when the trace holds none, and then nothing can be
/// checked): `Err` says how it differs.
fn same_build(file: Option<&object::File<'_>>, ran: Option<&str>) -> Result<(), String> {
    use object::Object;
    let Some(ran) = ran else {
        return Ok(());
    };
    let file =
        file.ok_or_else(|| format!("it is not an object file, the one that ran had {ran}"))?;
    match file.build_id() {
        Ok(Some(id)) => {
            let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
            if hex.eq_ignore_ascii_case(ran) {
                Ok(())
            } else {
                Err(format!("its build-id is {hex}, the one that ran had {ran}"))
            }
        }
        Ok(None) => Err(format!("it has no build-id, the one that ran had {ran}")),
        Err(e) => Err(e.to_string()),
    }
}

/// Opens a module for naming: its debug information and symbols, if it is the file that ran.
fn load(path: &str, ran: Option<&str>) -> Option<(addr2line::Loader, Symbols)> {
    let opened = open_module(path).and_then(|(file, by_fd)| {
        // Mapped, not read: parsing touches the headers and sections it needs, so memory
        // follows what the module holds, never its claimed length.
        // SAFETY: a read-only private mapping of a regular file; the bytes are only parsed
        // (a file cut short meanwhile faults as it would under addr2line's own mapping).
        let data = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| e.to_string())?;
        let parsed = object::File::parse(&*data).ok();
        if let Err(why) = same_build(parsed.as_ref(), ran) {
            return Ok(Err(why));
        }
        let l = addr2line::Loader::new(&by_fd).map_err(|e| e.to_string())?;
        let symbols = Symbols::of(parsed.as_ref());
        drop(file);
        Ok(Ok((l, symbols)))
    });
    match opened {
        Ok(Ok(x)) => Some(x),
        Ok(Err(why)) => {
            eprintln!(
                "gpushim: {} is not the file that ran ({why}): its frames stay module+offset \
                 (name them where the binaries that ran are, or rebuild them as they were)",
                crate::fixedfmt::Escaped(path.as_bytes())
            );
            None
        }
        Err(e) => {
            if !UNREADABLE_SAID.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "gpushim: cannot read {} to name its frames ({e}); its frames, and those \
                     of any other module that cannot be read, stay module+offset \
                     (--no-symbols skips naming)",
                    crate::fixedfmt::Escaped(path.as_bytes())
                );
            }
            None
        }
    }
}

/// `frame(reader, ip).label()`.
pub fn describe(tables: &TraceTables, ip: u64) -> String {
    frame(tables, ip).label()
}

fn lookup(path: &str, ran: Option<&str>, probe: u64) -> Named {
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        // A path and the build-id that ran there: traces merged from several hosts may hold
        // two builds of one path.
        let module = format!("{path}\0{}", ran.unwrap_or(""));
        let key = (module.clone(), probe);
        if let Some(hit) = c.frames.get(&key) {
            return hit.clone();
        }
        let loader = c.loaders.entry(module).or_insert_with(|| load(path, ran));
        let found = loader
            .as_ref()
            .map_or((None, None, None), |(l, s)| name(l, s, probe));
        c.frames.insert(key, found.clone());
        found
    })
}

fn name(l: &addr2line::Loader, symbols: &Symbols, probe: u64) -> Named {
    let (function, file, line) = name_raw(l, symbols, probe);
    // Names come from files a trace points at, which anyone may have written: a control
    // character in a symbol or a file name would move the reader's terminal.
    let clean = |s: String| printable(s.as_bytes());
    (function.map(clean), file.map(clean), line)
}

fn name_raw(l: &addr2line::Loader, symbols: &Symbols, probe: u64) -> Named {
    // The innermost frame (an inlined function, if any) is the most precise.
    if let Ok(mut frames) = l.find_frames(probe)
        && let Ok(Some(f)) = frames.next()
        && let Some(func) = f.function.as_ref().and_then(|n| n.demangle().ok())
    {
        let (file, line) = f.location.map_or((None, None), |loc| {
            let file = loc
                .file
                .map(|p| p.rsplit('/').next().unwrap_or(p).to_string());
            (file, loc.line)
        });
        return (Some(without_parameters(&func).to_string()), file, line);
    }
    let symbol = symbols
        .find(probe)
        .map(|s| addr2line::demangle_auto(s.into(), None).into_owned());
    (
        symbol.map(|s| without_parameters(&s).to_string()),
        None,
        None,
    )
}

/// `ns::f(int, char*) const` -> `ns::f`: the parameter list says little in a call-site label.
pub fn without_parameters(name: &str) -> &str {
    let trimmed = name.trim_end_matches(" const").trim_end();
    if !trimmed.ends_with(')') {
        return name;
    }
    let mut depth = 0i32;
    for (i, c) in trimmed.char_indices().rev() {
        match c {
            ')' => depth += 1,
            '(' => {
                depth -= 1;
                if depth == 0 {
                    return if i == 0 { name } else { &trimmed[..i] };
                }
            }
            _ => {}
        }
    }
    name
}

#[cfg(test)]
mod tests {
    use super::without_parameters;

    #[test]
    fn parameter_lists_are_dropped_from_names() {
        assert_eq!(without_parameters("leak"), "leak");
        assert_eq!(
            without_parameters("c10::Alloc::malloc(signed char, unsigned long, CUstream_st*)"),
            "c10::Alloc::malloc"
        );
        assert_eq!(
            without_parameters("f(std::function<void (int)>) const"),
            "f"
        );
        assert_eq!(
            without_parameters("(anonymous namespace)"),
            "(anonymous namespace)"
        );
    }
}
