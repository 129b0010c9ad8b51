//! All that gpushim knows of CUDA: the ABI types and constants it uses ([`ffi`]), every hooked
//! symbol with its library and C signature ([`symbols`]), and how the real functions are found
//! behind our hooks ([`real`]). Nothing here records or pools.

pub mod ffi;
pub mod functions;
pub mod real;
pub mod symbols;
