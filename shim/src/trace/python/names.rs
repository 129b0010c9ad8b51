//! Code objects to names and lines, for the frame walk: the interned `file\0function` of a
//! code object and the line of an instruction offset in it, each from a cache shared by every
//! thread (entries checked against what identifies the code object, since a freed one's
//! address may be reused), and string contents read as CPython stores them.

use super::{Api, Reader};
use crate::trace::RECORDER;
use core::ffi::c_int;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use gpushim_core::trace::format::STRING_MAX;

/// What identifies a code object beyond its address (which a freed one's successor may
/// reuse): its file name, name and line table objects and first line.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct CodeKey {
    pub(super) filename: usize,
    name: usize,
    linetable: usize,
    pub(super) firstlineno: u32,
}

/// One entry of a cache shared by every thread, guarded by a sequence number (odd while being
/// written): a reader that sees it change discards what it read.
struct Slot<const N: usize> {
    seq: AtomicU32,
    words: [AtomicU64; N],
}

impl<const N: usize> Slot<N> {
    #[allow(clippy::declare_interior_mutable_const)] // only to initialize the static tables
    const EMPTY: Slot<N> = Slot {
        seq: AtomicU32::new(0),
        words: [const { AtomicU64::new(0) }; N],
    };

    fn get(&self) -> Option<[u64; N]> {
        let s1 = self.seq.load(Ordering::Acquire);
        if s1 == 0 || s1 & 1 == 1 {
            return None;
        }
        let mut v = [0u64; N];
        for (x, w) in v.iter_mut().zip(&self.words) {
            *x = w.load(Ordering::Relaxed);
        }
        core::sync::atomic::fence(Ordering::Acquire);
        (self.seq.load(Ordering::Relaxed) == s1).then_some(v)
    }

    fn set(&self, v: [u64; N]) {
        let s = self.seq.load(Ordering::Relaxed);
        if s & 1 == 1
            || self
                .seq
                .compare_exchange(s, s | 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return; // another thread is writing this slot: leave it the work
        }
        core::sync::atomic::fence(Ordering::Release);
        for (x, w) in v.iter().zip(&self.words) {
            w.store(*x, Ordering::Relaxed);
        }
        self.seq
            .store((s | 1).wrapping_add(1).max(2), Ordering::Release);
    }
}

const CODE_SLOTS: usize = 1 << 13;
/// code address, filename, name, linetable, firstlineno, string id.
static CODES: [Slot<6>; CODE_SLOTS] = [const { Slot::EMPTY }; CODE_SLOTS];
const LINE_SLOTS: usize = 1 << 15;
/// code address, linetable, offset, line.
static LINES: [Slot<4>; LINE_SLOTS] = [const { Slot::EMPTY }; LINE_SLOTS];

fn slot_of(key: u64, slots: usize) -> usize {
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as usize % slots
}

/// The string id of a code object's `file\0function`, and its identity.
pub(super) fn code_id(a: &Api, m: Reader, code: usize) -> Option<(u64, CodeKey)> {
    let l = &a.layout;
    let key = CodeKey {
        filename: m.ptr(code + l.code_filename)?,
        name: m.ptr(code + l.code_name)?,
        linetable: m.ptr(code + l.code_linetable)?,
        firstlineno: m.read::<c_int>(code + l.code_firstlineno)? as u32,
    };
    let slot = &CODES[slot_of(code as u64, CODE_SLOTS)];
    let words = [
        code as u64,
        key.filename as u64,
        key.name as u64,
        key.linetable as u64,
        u64::from(key.firstlineno),
    ];
    if let Some(v) = slot.get()
        && (v[0], v[1], v[2], v[3], v[4]) == (words[0], words[1], words[2], words[3], words[4])
    {
        return Some((v[5], key));
    }
    let mut buf = [0u8; STRING_MAX];
    let (mut file_buf, mut name_buf) = ([0u8; STRING_MAX], [0u8; 128]);
    let file = string(a, m, key.filename, &mut file_buf)?;
    let name = string(a, m, key.name, &mut name_buf)?;
    let room = STRING_MAX - 1 - name.len();
    let file = &file[file.len().saturating_sub(room)..];
    buf[..file.len()].copy_from_slice(file);
    buf[file.len() + 1..file.len() + 1 + name.len()].copy_from_slice(name);
    let id = RECORDER.intern_string(&buf[..file.len() + 1 + name.len()]);
    slot.set([words[0], words[1], words[2], words[3], words[4], id]);
    Some((id, key))
}

/// The line of byte offset `offset` in `code`, cached.
pub(super) fn line_at(a: &Api, code: usize, key: CodeKey, offset: c_int) -> c_int {
    if offset < 0 {
        return key.firstlineno as c_int;
    }
    let slot = &LINES[slot_of((code as u64) ^ (offset as u64).rotate_left(40), LINE_SLOTS)];
    // The line is the first line plus what the line table says: a code object made by
    // `replace(co_firstlineno=...)` shares its line table with the one it was made from, and
    // may take its address once that one is freed.
    let words = [
        code as u64,
        key.linetable as u64,
        offset as u32 as u64 | u64::from(key.firstlineno) << 32,
    ];
    if let Some(v) = slot.get()
        && (v[0], v[1], v[2]) == (words[0], words[1], words[2])
    {
        return v[3] as c_int;
    }
    // SAFETY: `code` is a live code object (its type was checked, and the frame that runs it
    // holds it); PyCode_Addr2Line only reads its line table, which never changes, so it needs
    // no GIL.
    let line = unsafe { (a.addr2line)(code, offset) };
    slot.set([words[0], words[1], words[2], u64::from(line.max(0) as u32)]);
    line
}

/// The UTF-8 text of a `str` object, its last `into.len()` bytes at most (the end of a path
/// names the file); `None` when `obj` is not a string.
fn string<'b>(a: &Api, m: Reader, obj: usize, into: &'b mut [u8]) -> Option<&'b [u8]> {
    let l = &a.layout;
    if m.ptr(obj + 8)? != a.unicode_type {
        return None;
    }
    let length = m.read::<isize>(obj + 16)?.max(0) as usize;
    let state = m.read::<u32>(obj + 32)?;
    let (kind, compact, ascii) = ((state >> 2) & 7, state >> 5 & 1 == 1, state >> 6 & 1 == 1);
    if !compact {
        return Some(&into[..0]);
    }
    if ascii {
        return copy_tail(m, obj + l.ascii_size, length, into);
    }
    let utf8 = m.ptr(obj + l.compact_utf8).unwrap_or(0);
    if utf8 != 0 {
        let n = m.read::<isize>(obj + l.compact_utf8_length)?.max(0) as usize;
        return copy_tail(m, utf8, n, into);
    }
    // Characters of 1, 2 or 4 bytes: encoded here, the last ones kept.
    let data = obj + l.compact_size;
    let width = match kind {
        1 | 2 | 4 => kind as usize,
        _ => return Some(&into[..0]),
    };
    let mut len = 0;
    for i in (0..length).rev() {
        let c = match width {
            1 => u32::from(m.read::<u8>(data + i)?),
            2 => u32::from(m.read::<u16>(data + 2 * i)?),
            _ => m.read::<u32>(data + 4 * i)?,
        };
        let ch = char::from_u32(c).unwrap_or('?');
        let mut tmp = [0u8; 4];
        let bytes = ch.encode_utf8(&mut tmp).as_bytes();
        if len + bytes.len() > into.len() {
            break;
        }
        // Written back to front, then moved to the start.
        let at = into.len() - len - bytes.len();
        into[at..at + bytes.len()].copy_from_slice(bytes);
        len += bytes.len();
    }
    into.copy_within(into.len() - len.., 0);
    Some(&into[..len])
}

/// Copies the last `into.len()` of `n` bytes at `src`.
fn copy_tail(m: Reader, src: usize, n: usize, into: &mut [u8]) -> Option<&[u8]> {
    let take = n.min(into.len());
    m.copy(src + (n - take), &mut into[..take])?;
    Some(&into[..take])
}
