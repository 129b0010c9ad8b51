//! Where the fields the walk reads lie in each CPython minor version.

/// Where the fields the walk reads lie, for one minor version (x86_64 and aarch64 Linux,
/// release builds; measured with `offsetof` on each version's headers).
#[derive(Clone, Copy)]
pub(super) struct Layout {
    /// Thread state -> current frame (through `cframe` in 3.11 and 3.12).
    pub(super) tstate_frame: usize,
    pub(super) cframe_frame: Option<usize>,
    pub(super) frame_code: usize,
    pub(super) frame_back: usize,
    /// `f_lasti` (an int) up to 3.10; the instruction pointer from 3.11.
    pub(super) frame_instr: usize,
    /// `owner` (a char) from 3.11.
    pub(super) frame_owner: Option<usize>,
    pub(super) code_filename: usize,
    /// `co_qualname` from 3.11, else `co_name`.
    pub(super) code_name: usize,
    pub(super) code_firstlineno: usize,
    /// `co_version` from 3.12: a number CPython gives each code object it creates, from a
    /// counter that only grows (and stops at 0 once it would wrap), so no two code objects it
    /// makes ever share one that is not 0. `None` before 3.12.
    pub(super) code_version: Option<usize>,
    pub(super) code_linetable: usize,
    /// Where the bytecode starts (`co_code_adaptive`) from 3.11.
    pub(super) code_adaptive: usize,
    pub(super) ascii_size: usize,
    pub(super) compact_size: usize,
    pub(super) compact_utf8: usize,
    pub(super) compact_utf8_length: usize,
}

pub(super) const fn layout(minor: u32) -> Option<Layout> {
    let (ascii_size, compact_size, compact_utf8, compact_utf8_length) = if minor >= 12 {
        (40, 56, 48, 40)
    } else {
        (48, 72, 56, 48)
    };
    let base = Layout {
        tstate_frame: 24,
        cframe_frame: None,
        frame_code: 32,
        frame_back: 24,
        frame_instr: 104,
        frame_owner: None,
        code_filename: 104,
        code_name: 112,
        code_firstlineno: 40,
        code_version: None,
        code_linetable: 120,
        code_adaptive: 0,
        ascii_size,
        compact_size,
        compact_utf8,
        compact_utf8_length,
    };
    match minor {
        9 => Some(base),
        10 => Some(Layout {
            frame_instr: 96,
            ..base
        }),
        11 => Some(Layout {
            tstate_frame: 56,
            cframe_frame: Some(8),
            frame_code: 32,
            frame_back: 48,
            frame_instr: 56,
            frame_owner: Some(69),
            code_filename: 112,
            code_name: 128,
            code_firstlineno: 72,
            code_linetable: 136,
            code_adaptive: 184,
            ..base
        }),
        12 | 13 => Some(Layout {
            tstate_frame: if minor == 12 { 56 } else { 72 },
            cframe_frame: if minor == 12 { Some(0) } else { None },
            frame_code: 0,
            frame_back: 8,
            frame_instr: 56,
            frame_owner: Some(70),
            code_filename: 112,
            code_name: 128,
            code_firstlineno: 68,
            code_version: Some(92),
            code_linetable: 136,
            code_adaptive: if minor == 12 { 192 } else { 200 },
            ..base
        }),
        _ => None,
    }
}

/// `owner` of a frame that belongs to the C stack (an entry frame, from 3.12): not a frame of
/// Python code.
pub(super) const FRAME_OWNED_BY_CSTACK: u8 = 3;
