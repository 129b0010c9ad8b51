//! Every CUDA function the shim resolves, hooks or hands out, as the rows of
//! [`super::functions`] declare them: the symbol list ([`Sym`]), each real function's C type
//! ([`sig`]) and the driver entry-point lookups that return each ABI ([`DRIVER_ENTRIES`]).

use super::functions::cuda_functions;
use core::ffi::CStr;

pub use sig::SigOf;

/// Which library a real function lives in, to find it when `RTLD_NEXT` cannot (the library was
/// loaded `RTLD_LOCAL`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Lib {
    Runtime,
    Driver,
}

impl Lib {
    pub const fn sonames(self) -> &'static [&'static CStr] {
        match self {
            Lib::Runtime => &[
                c"libcudart.so.13",
                c"libcudart.so.12",
                c"libcudart.so.11.0",
                c"libcudart.so",
            ],
            Lib::Driver => &[c"libcuda.so.1", c"libcuda.so"],
        }
    }
}

/// Which stream flavour of an entry-point lookup returns an ABI.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Flavor {
    Both,
    Legacy,
    PerThread,
}

/// An entry-point lookup of `base` for a version in `since..until` and a stream flavour
/// returns the ABI of `sym`.
pub struct DriverEntry {
    pub base: &'static CStr,
    pub since: i32,
    /// The first version that returns a newer ABI (another row), or [`FIRST_UNKNOWN_VERSION`].
    pub until: i32,
    pub flavor: Flavor,
    pub sym: Sym,
}

/// Versions at or past this one may return an ABI we have not seen; those pass through.
pub const FIRST_UNKNOWN_VERSION: i32 = 14000;

/// `cudaMalloc` from the identifier `cudaMalloc`, NUL-terminated; evaluated at compile time
/// only (in `const` blocks), so its panic can only fail the build.
const fn c_name_of(name_with_nul: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(name_with_nul.as_bytes()) {
        Ok(c) => c,
        Err(_) => panic!("a CUDA function's name has no NUL inside"),
    }
}

/// Whether a function's name ends in `_ptsz`.
const fn ends_with_ptsz(name: &str) -> bool {
    let b = name.as_bytes();
    let n = b.len();
    n >= 5
        && b[n - 5] == b'_'
        && b[n - 4] == b'p'
        && b[n - 3] == b't'
        && b[n - 2] == b's'
        && b[n - 1] == b'z'
}

/// Whether a hook's records may carry `api`: the trace API named after the function, or the
/// shim's own.
const fn api_fits(api: gpushim_core::trace::format::Api, name: &str) -> bool {
    if matches!(api, gpushim_core::trace::format::Api::Shim) {
        return true;
    }
    let (a, b) = (api.name().as_bytes(), name.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

macro_rules! declare_symbols {
    ($(
        $var:ident = $name:ident in $lib:ident fn($($a:ident: $t:ty),*)
        $(=> $body:path as $api:ident)?
        $(, entry $flavor:ident $base:literal since $since:literal $(until $until:literal)?)*;
    )*) => {
        /// A real CUDA function, by its exported (ABI-exact) name.
        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        #[repr(usize)]
        pub enum Sym { $($var,)* }

        pub const SYM_COUNT: usize = [$(Sym::$var,)*].len();

        impl Sym {
            pub const fn c_name(self) -> &'static CStr {
                match self { $(Sym::$var => const { c_name_of(concat!(stringify!($name), "\0")) },)* }
            }

            pub const fn lib(self) -> Lib {
                match self { $(Sym::$var => Lib::$lib,)* }
            }

            /// Whether this is the per-thread-default-stream variant (`_ptsz`).
            pub const fn per_thread(self) -> bool {
                match self { $(Sym::$var => const { ends_with_ptsz(stringify!($name)) },)* }
            }
        }

        /// The C signature of every real function the shim calls: `sig::CudaMalloc` is
        /// `cudaMalloc`'s. [`crate::cuda::real::function`] hands a real function out only typed
        /// by its own signature.
        #[allow(non_camel_case_types)]
        pub mod sig {
            use super::Sym;
            #[allow(unused_imports)]
            use crate::cuda::ffi::{CuIpcMemHandle, CudaExtent, CudaPitchedPtr};
            #[allow(unused_imports)]
            use core::ffi::{c_char, c_int, c_void};

            /// A stream handle (`cudaStream_t`, `CUstream`).
            pub type Stream = *mut c_void;

            /// Ties a symbol (a unit type named after it) to its signature.
            pub trait SigOf {
                const SYM: Sym;
                type F: Copy;
            }

            $(pub type $var = unsafe extern "C" fn($($t),*) -> i32;)*

            /// One unit type per symbol, for [`SigOf`]: names at the type level only.
            #[allow(dead_code)]
            pub mod of {
                $(
                    pub struct $var;
                    impl super::SigOf for $var {
                        const SYM: super::Sym = super::Sym::$var;
                        type F = super::$var;
                    }
                )*
            }
        }

        /// Every driver entry-point lookup that returns an ABI we wrap.
        pub const DRIVER_ENTRIES: &[DriverEntry] = &[$($(
            DriverEntry {
                base: $base,
                since: $since,
                until: [$($until,)? FIRST_UNKNOWN_VERSION][0],
                flavor: Flavor::$flavor,
                sym: Sym::$var,
            },
        )*)*];

        // Each recorded hook's records carry the trace API named after its function.
        $($(
            const _: () = assert!(
                api_fits(gpushim_core::trace::format::Api::$api, stringify!($name)),
                concat!("the trace API of ", stringify!($name), " is named otherwise"),
            );
        )?)*
    };
}

cuda_functions!(declare_symbols);

/// The ABI a lookup of `name` (as given to `cuGetProcAddress`) returns for `version` and the
/// stream flavour asked for, when it is one we wrap. No allocation.
pub fn driver_abi(name: &CStr, version: i32, per_thread: bool) -> Option<Sym> {
    let name = name.to_bytes();
    DRIVER_ENTRIES
        .iter()
        .find(|e| {
            e.base.to_bytes() == name
                && version >= e.since
                && version < e.until.min(FIRST_UNKNOWN_VERSION)
                && match e.flavor {
                    Flavor::Both => true,
                    Flavor::Legacy => !per_thread,
                    Flavor::PerThread => per_thread,
                }
        })
        .map(|e| e.sym)
}
