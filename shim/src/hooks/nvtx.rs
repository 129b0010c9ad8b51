//! NVTX injection: with `NVTX_INJECTION64_PATH=libgpushim.so` (which `gpushim run` sets), every
//! library that embeds NVTX v3 (PyTorch's `torch.cuda.nvtx`, for one) calls
//! `InitializeInjectionNvtx2` on its first NVTX call, and we fill its core callback slots. Ranges
//! and marks become trace records, so iterations and phases are visible with no code change.
//! Each library initializes its own table; the state shared between them is only the per-thread
//! push depth and the range-id counter, both lock-free.

use crate::{state, trace};
use core::cell::Cell;
use core::ffi::{CStr, c_char, c_int, c_void};
use core::sync::atomic::{AtomicU64, Ordering};

type FnSlot = Option<unsafe extern "C" fn()>;
type GetModuleFunctionTable = unsafe extern "C" fn(c_int, *mut *mut *mut FnSlot, *mut u32) -> c_int;
type GetExportTable = unsafe extern "C" fn(u32) -> *const c_void;

/// `NvtxExportTableCallbacks`.
#[repr(C)]
struct ExportTableCallbacks {
    struct_size: usize,
    get_module_function_table: Option<GetModuleFunctionTable>,
}

const NVTX_ETID_CALLBACKS: u32 = 1;
const NVTX_CB_MODULE_CORE: c_int = 1;
const CBID_MARK_EX: usize = 1;
const CBID_MARK_A: usize = 2;
const CBID_RANGE_START_EX: usize = 4;
const CBID_RANGE_START_A: usize = 5;
const CBID_RANGE_END: usize = 7;
const CBID_RANGE_PUSH_EX: usize = 8;
const CBID_RANGE_PUSH_A: usize = 9;
const CBID_RANGE_POP: usize = 11;

/// Offsets in `nvtxEventAttributes_t` (v2): `size` (u16), `messageType` (i32), `message`.
const ATTR_SIZE: usize = 2;
const ATTR_MESSAGE_TYPE: usize = 32;
const ATTR_MESSAGE: usize = 40;
const ATTR_MIN_SIZE: u16 = 48;
const NVTX_MESSAGE_TYPE_ASCII: i32 = 1;

thread_local! {
    static DEPTH: Cell<i32> = const { Cell::new(0) };
}
static NEXT_RANGE_ID: AtomicU64 = AtomicU64::new(1);

/// Called by each NVTX-embedding library on its first NVTX call. Returns 1 when our callbacks
/// are installed.
///
/// # Safety
/// `get_export_table` must be NVTX's export-table accessor (or null).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn InitializeInjectionNvtx2(
    get_export_table: Option<GetExportTable>,
) -> c_int {
    if !state::enabled() {
        return 0;
    }
    let Some(get) = get_export_table else {
        return 0;
    };
    // SAFETY: NVTX's accessor; the callbacks table it returns outlives the process's NVTX use.
    let callbacks = unsafe { get(NVTX_ETID_CALLBACKS) } as *const ExportTableCallbacks;
    if callbacks.is_null() {
        return 0;
    }
    // SAFETY: non-null pointer to NVTX's callbacks export table.
    let Some(get_table) = (unsafe { (*callbacks).get_module_function_table }) else {
        return 0;
    };
    let mut table: *mut *mut FnSlot = core::ptr::null_mut();
    let mut size: u32 = 0;
    // SAFETY: out-pointers to our locals.
    if unsafe { get_table(NVTX_CB_MODULE_CORE, &mut table, &mut size) } == 0 || table.is_null() {
        return 0;
    }
    // SAFETY: each function has exactly the signature NVTX gives its callback id (all eight),
    // and NVTX casts the generic slot back to that signature before calling.
    let slots: [(usize, unsafe extern "C" fn()); 8] = unsafe {
        [
            (
                CBID_MARK_EX,
                erase(mark_ex as unsafe extern "C" fn(*const u8)),
            ),
            (
                CBID_MARK_A,
                erase(mark_a as unsafe extern "C" fn(*const c_char)),
            ),
            (
                CBID_RANGE_START_EX,
                erase(range_start_ex as unsafe extern "C" fn(*const u8) -> u64),
            ),
            (
                CBID_RANGE_START_A,
                erase(range_start_a as unsafe extern "C" fn(*const c_char) -> u64),
            ),
            (
                CBID_RANGE_END,
                erase(range_end as unsafe extern "C" fn(u64)),
            ),
            (
                CBID_RANGE_PUSH_EX,
                erase(range_push_ex as unsafe extern "C" fn(*const u8) -> c_int),
            ),
            (
                CBID_RANGE_PUSH_A,
                erase(range_push_a as unsafe extern "C" fn(*const c_char) -> c_int),
            ),
            (
                CBID_RANGE_POP,
                erase(range_pop as unsafe extern "C" fn() -> c_int),
            ),
        ]
    };
    for (id, f) in slots {
        if id < size as usize {
            // SAFETY: `table` has `size` entries, each null or a pointer to a function slot.
            unsafe {
                let slot = *table.add(id);
                if !slot.is_null() {
                    *slot = Some(f);
                }
            }
        }
    }
    1
}

/// The bytes of a C string, without allocating.
///
/// # Safety
/// `s` must be null or NUL-terminated.
unsafe fn c_bytes<'a>(s: *const c_char) -> &'a [u8] {
    if s.is_null() {
        return b"";
    }
    // SAFETY: the caller vouches for the terminator.
    unsafe { CStr::from_ptr(s) }.to_bytes()
}

/// The ASCII message of an event attribute structure, or a placeholder.
///
/// # Safety
/// `attr` must be null or point to an `nvtxEventAttributes_t` of at least its `size` bytes.
unsafe fn attr_message<'a>(attr: *const u8) -> &'a [u8] {
    if attr.is_null() {
        return b"";
    }
    // SAFETY: reads within the structure, after checking its declared size.
    unsafe {
        let size = u16::from_le_bytes([*attr.add(ATTR_SIZE), *attr.add(ATTR_SIZE + 1)]);
        if size < ATTR_MIN_SIZE {
            return b"";
        }
        let kind = (attr.add(ATTR_MESSAGE_TYPE) as *const i32).read_unaligned();
        if kind != NVTX_MESSAGE_TYPE_ASCII {
            return b"(non-ASCII message)";
        }
        c_bytes((attr.add(ATTR_MESSAGE) as *const *const c_char).read_unaligned())
    }
}

unsafe extern "C" fn mark_a(message: *const c_char) {
    // SAFETY: NVTX passes a NUL-terminated message.
    trace::record_nvtx(unsafe { c_bytes(message) }, trace::Event::mark);
}

unsafe extern "C" fn mark_ex(attr: *const u8) {
    // SAFETY: NVTX passes its attribute structure.
    trace::record_nvtx(unsafe { attr_message(attr) }, trace::Event::mark);
}

fn push(text: &[u8]) -> c_int {
    let level = DEPTH
        .try_with(|d| {
            let v = d.get();
            d.set(v + 1);
            v
        })
        .unwrap_or(0);
    trace::record_nvtx(text, |id| trace::Event::range_push(id, level as u64));
    level
}

unsafe extern "C" fn range_push_a(message: *const c_char) -> c_int {
    // SAFETY: NVTX passes a NUL-terminated message.
    push(unsafe { c_bytes(message) })
}

unsafe extern "C" fn range_push_ex(attr: *const u8) -> c_int {
    // SAFETY: NVTX passes its attribute structure.
    push(unsafe { attr_message(attr) })
}

unsafe extern "C" fn range_pop() -> c_int {
    let level = DEPTH
        .try_with(|d| {
            let v = d.get();
            if v > 0 {
                d.set(v - 1);
            }
            v - 1
        })
        .unwrap_or(-1);
    if level >= 0 {
        trace::record_nvtx(b"", |_| trace::Event::range_pop(level as u64));
    }
    level
}

fn start(text: &[u8]) -> u64 {
    let id = NEXT_RANGE_ID.fetch_add(1, Ordering::Relaxed);
    trace::record_nvtx(text, |m| trace::Event::range_start(m, id));
    id
}

unsafe extern "C" fn range_start_a(message: *const c_char) -> u64 {
    // SAFETY: NVTX passes a NUL-terminated message.
    start(unsafe { c_bytes(message) })
}

unsafe extern "C" fn range_start_ex(attr: *const u8) -> u64 {
    // SAFETY: NVTX passes its attribute structure.
    start(unsafe { attr_message(attr) })
}

unsafe extern "C" fn range_end(id: u64) {
    trace::record_nvtx(b"", |_| trace::Event::range_end(id));
}

/// A callback as NVTX's generic slot type (`void (*)(void)`).
///
/// # Safety
/// `F` must be an `extern "C"` function pointer type, and whoever calls the result must cast it
/// back to `F` first.
unsafe fn erase<F: Copy>(f: F) -> unsafe extern "C" fn() {
    const { assert!(core::mem::size_of::<F>() == core::mem::size_of::<unsafe extern "C" fn()>()) };
    // SAFETY: same size (checked at compile time); both are function pointers (the caller's
    // promise), so the bits are a valid function pointer of the generic type.
    unsafe { core::mem::transmute_copy::<F, unsafe extern "C" fn()>(&f) }
}
