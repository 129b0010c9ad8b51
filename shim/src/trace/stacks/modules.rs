//! The loaded objects: their address ranges (is a return address in a known module?) and a
//! `Module` record, path and build-id, for each, so that `gpushim` names frames offline.

use super::*;

pub(super) fn known(ip: u64) -> bool {
    let n = COUNT.load(Ordering::Acquire).min(MAX_MODULES);
    (0..n).any(|i| {
        let s = RANGES[2 * i].load(Ordering::Relaxed);
        let e = RANGES[2 * i + 1].load(Ordering::Relaxed);
        (s..e).contains(&ip)
    })
}

/// Writes a `Module` record for every loaded object not written yet. One scanner at a time;
/// a thread that finds a scan under way goes on without waiting.
pub(super) fn scan_modules() {
    if SCANNING.swap(true, Ordering::Acquire) {
        return;
    }
    // SAFETY: dl_iterate_phdr calls `visit` with valid info for each loaded object.
    unsafe { libc::dl_iterate_phdr(Some(visit), core::ptr::null_mut()) };
    SCANNING.store(false, Ordering::Release);
}

unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    _data: *mut c_void,
) -> c_int {
    // SAFETY: the loader passes a valid dl_phdr_info for the duration of the call.
    let info = unsafe { &*info };
    let base = info.dlpi_addr;
    let (mut start, mut end) = (u64::MAX, 0u64);
    for i in 0..info.dlpi_phnum as usize {
        // SAFETY: dlpi_phdr has dlpi_phnum entries.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        if ph.p_type == libc::PT_LOAD {
            start = start.min(base + ph.p_vaddr);
            end = end.max(base + ph.p_vaddr + ph.p_memsz);
        }
    }
    if start >= end || known(start) {
        return 0;
    }
    let own = visit as *const () as usize as u64;
    if (start..end).contains(&own) {
        SELF_START.store(start, Ordering::Relaxed);
        SELF_END.store(end, Ordering::Relaxed);
    }
    let mut exe = [0u8; 512];
    // SAFETY: dlpi_name is null or NUL-terminated.
    let mut name: &[u8] = if info.dlpi_name.is_null() {
        b""
    } else {
        // SAFETY: as above.
        unsafe { core::ffi::CStr::from_ptr(info.dlpi_name) }.to_bytes()
    };
    if name.is_empty() {
        // The main program: its path from /proc.
        // SAFETY: readlink into our buffer, within its length.
        let n = unsafe {
            libc::readlink(
                c"/proc/self/exe".as_ptr(),
                exe.as_mut_ptr().cast(),
                exe.len(),
            )
        };
        if n > 0 {
            name = &exe[..n as usize];
        }
    }
    let path_id = RECORDER.intern_string(name);
    let k = COUNT.load(Ordering::Relaxed);
    if k < MAX_MODULES {
        RANGES[2 * k].store(start, Ordering::Relaxed);
        RANGES[2 * k + 1].store(end, Ordering::Relaxed);
        COUNT.store(k + 1, Ordering::Release);
    }
    let define =
        |e: crate::trace::Event| RECORDER.append_definition(&e.record(RECORDER.now_ns(), 0, 0));
    define(crate::trace::Event::module(base, path_id));
    let mut hex = [0u8; 2 * BUILD_ID_MAX];
    let n = build_id(info, &mut hex);
    if n > 0 {
        define(crate::trace::Event::module_build_id(
            base,
            RECORDER.intern_string(&hex[..n]),
        ));
    }
    0
}

/// `NT_GNU_BUILD_ID`: the note type of a GNU build-id.
const NT_GNU_BUILD_ID: u32 = 3;

/// The module's GNU build-id, read from its note segments as the loader mapped them, written
/// into `hex` as lowercase hex; returns its length, 0 when the module has none (or one longer
/// than [`BUILD_ID_MAX`] bytes). Only notes that lie inside a loaded, readable segment are
/// read, every length is checked against the note segment's end, and nothing is allocated.
fn build_id(info: &libc::dl_phdr_info, hex: &mut [u8; 2 * BUILD_ID_MAX]) -> usize {
    let base = info.dlpi_addr;
    // SAFETY: the loader gives `dlpi_phnum` headers at `dlpi_phdr` for the duration of the
    // dl_iterate_phdr callback that calls this.
    let phdrs = unsafe { core::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let mapped = |start: u64, end: u64| {
        phdrs.iter().any(|p| {
            let s = base.checked_add(p.p_vaddr);
            let e = s.and_then(|s| s.checked_add(p.p_memsz));
            p.p_type == libc::PT_LOAD
                && p.p_flags & libc::PF_R != 0
                && s.is_some_and(|s| s <= start)
                && e.is_some_and(|e| end <= e)
        })
    };
    for ph in phdrs.iter().filter(|p| p.p_type == libc::PT_NOTE) {
        let Some(start) = base.checked_add(ph.p_vaddr) else {
            continue;
        };
        let Some(end) = start.checked_add(ph.p_filesz.min(ph.p_memsz)) else {
            continue;
        };
        if !mapped(start, end) {
            continue;
        }
        let read_u32 = |at: u64| -> Option<u32> {
            (at.checked_add(4)? <= end).then(|| {
                // SAFETY: `at..at + 4` lies inside the note segment, which lies inside a
                // readable loaded segment of a module the loader holds while we are called.
                unsafe { core::ptr::read_unaligned(at as *const u32) }
            })
        };
        let pad4 = |n: u64| n.checked_add(3).map(|v| v & !3);
        let mut at = start;
        while let (Some(namesz), Some(descsz), Some(kind)) = (
            read_u32(at),
            read_u32(at.saturating_add(4)),
            read_u32(at.saturating_add(8)),
        ) {
            let name = at + 12;
            let Some(desc) = pad4(u64::from(namesz)).and_then(|n| name.checked_add(n)) else {
                break;
            };
            let Some(next) = pad4(u64::from(descsz)).and_then(|n| desc.checked_add(n)) else {
                break;
            };
            // The last note's padding may lie past the segment's end (a linker that writes an
            // id whose length is not a multiple of 4 does not pad it); its bytes may not.
            if desc.saturating_add(u64::from(descsz)) > end {
                break;
            }
            // SAFETY: `name..name + namesz` lies before `desc` and `desc..desc + descsz`
            // before `end` (checked just above), inside the note segment.
            let (name_bytes, desc_bytes) = unsafe {
                (
                    core::slice::from_raw_parts(name as *const u8, namesz as usize),
                    core::slice::from_raw_parts(desc as *const u8, descsz as usize),
                )
            };
            if kind == NT_GNU_BUILD_ID
                && name_bytes == b"GNU\0"
                && !desc_bytes.is_empty()
                && desc_bytes.len() <= BUILD_ID_MAX
            {
                const DIGITS: &[u8; 16] = b"0123456789abcdef";
                for (i, b) in desc_bytes.iter().enumerate() {
                    hex[2 * i] = DIGITS[usize::from(b >> 4)];
                    hex[2 * i + 1] = DIGITS[usize::from(b & 15)];
                }
                return 2 * desc_bytes.len();
            }
            // `next` lies at least 12 bytes past `at` (no wrap: checked above), so this ends.
            at = next;
        }
    }
    0
}
