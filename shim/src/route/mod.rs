//! How a program's calls reach the hooks: the exported symbols and the wrappers entry-point
//! lookups hand out, both made here from the rows of [`crate::cuda::functions`]; our `dlsym`
//! ([`dlsym`]); and the driver's entry-point lookups ([`entry`]). The tables below say which
//! name `dlsym` answers with which hook, which wrapper a lookup hands out for which ABI.

pub mod dlsym;
pub mod entry;

use crate::cuda::functions::cuda_functions;
use crate::cuda::symbols::Sym;
use core::ffi::{CStr, c_void};

/// A function address in a static table.
#[derive(Clone, Copy)]
pub struct Addr(*const c_void);

// SAFETY: code addresses are immutable and valid for the life of the library (-z nodelete).
unsafe impl Sync for Addr {}

/// A hook's shell: calls the row's body with the real function `real::$how` finds, typed by
/// the row's signature (`function`: the exported symbol's; `proc_function`: the one an
/// entry-point lookup returned).
macro_rules! shell {
    ($(#[$attr:meta])* $how:ident $var:ident $name:ident ($($a:ident: $t:ty),*)
        => $body:path as $api:ident) => {
        $(#[$attr])*
        pub unsafe extern "C" fn $name($($a: $t),*) -> i32 {
            use crate::cuda::symbols::sig::of;
            let real = crate::hooks::Real::of::<of::$var>(
                crate::cuda::real::$how::<of::$var>(),
                gpushim_core::trace::format::Api::$api,
            );
            // SAFETY: the caller's arguments go unchanged to the real function of this ABI.
            unsafe { $body(real, $($a),*) }
        }
    };
}

/// The exported hook of a hooked row (nothing for a row only resolved).
macro_rules! export {
    ($var:ident $name:ident ($($a:ident: $t:ty),*) => $body:path as $api:ident) => {
        shell!(#[unsafe(no_mangle)] function $var $name ($($a: $t),*) => $body as $api);
    };
    ($var:ident $name:ident ($($a:ident: $t:ty),*)) => {};
}

/// The wrapper an entry-point lookup hands out for a hooked driver row: it forwards to the
/// pointer that lookup returned.
macro_rules! wrapper {
    (Driver $var:ident $name:ident ($($a:ident: $t:ty),*) => $body:path as $api:ident) => {
        shell!(proc_function $var $name ($($a: $t),*) => $body as $api);
    };
    ($lib:ident $var:ident $name:ident ($($a:ident: $t:ty),*) $($rest:tt)*) => {};
}

/// A table entry for a hooked row, `None` for the others.
macro_rules! entry_of {
    (exports $lib:ident $var:ident $name:ident => $api:ident) => {
        Some((Sym::$var, Addr(exports::$name as *const c_void)))
    };
    (wrappers Driver $var:ident $name:ident => $api:ident) => {
        Some((Sym::$var, Addr(wrappers::$name as *const c_void)))
    };
    ($table:ident $lib:ident $var:ident $name:ident $(=> $api:ident)?) => {
        None
    };
}

macro_rules! hooks_from_rows {
    ($(
        $var:ident = $name:ident in $lib:ident fn($($a:ident: $t:ty),*)
        $(=> $body:path as $api:ident)?
        $(, entry $flavor:ident $base:literal since $since:literal $(until $until:literal)?)*;
    )*) => {
        /// The exported hooks, under the names of the functions they stand for.
        #[allow(non_snake_case, unused_imports)]
        pub mod exports {
            use crate::cuda::ffi::{CuIpcMemHandle, CudaExtent, CudaPitchedPtr};
            use crate::cuda::symbols::{Sym, sig::Stream};
            use crate::hooks::memory::{Driver, Runtime};
            use core::ffi::{c_char, c_int, c_void};
            $(export!($var $name ($($a: $t),*) $(=> $body as $api)?);)*
        }

        /// The wrappers driver entry-point lookups hand out.
        #[allow(non_snake_case, unused_imports)]
        pub mod wrappers {
            use crate::cuda::ffi::{CuIpcMemHandle, CudaExtent, CudaPitchedPtr};
            use crate::cuda::symbols::{Sym, sig::Stream};
            use crate::hooks::memory::{Driver, Runtime};
            use core::ffi::{c_char, c_int, c_void};
            $(wrapper!($lib $var $name ($($a: $t),*) $(=> $body as $api)?);)*
        }

        /// Exported hooks by the symbol they stand for.
        static EXPORTED: &[Option<(Sym, Addr)>] =
            &[$(entry_of!(exports $lib $var $name $(=> $api)?),)*];
        /// Entry-point wrappers by the ABI they wrap.
        static PROC: &[Option<(Sym, Addr)>] =
            &[$(entry_of!(wrappers $lib $var $name $(=> $api)?),)*];
    };
}

cuda_functions!(hooks_from_rows);

/// Our exported hook for a symbol name, if we hook it.
pub fn exported_by_name(name: &CStr) -> Option<(Sym, usize)> {
    let name = name.to_bytes();
    EXPORTED
        .iter()
        .flatten()
        .find(|(s, _)| s.c_name().to_bytes() == name)
        .map(|(s, a)| (*s, a.0 as usize))
}

/// The wrapper an entry-point lookup hands out for an ABI.
pub fn proc_wrapper(sym: Sym) -> Option<usize> {
    PROC.iter()
        .flatten()
        .find(|(s, _)| *s == sym)
        .map(|(_, a)| a.0 as usize)
}
