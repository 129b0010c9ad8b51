//! How a program's calls reach the hooks: the exported symbols themselves (in [`crate::hooks`]),
//! our `dlsym` ([`dlsym`]), the driver's entry-point lookups ([`entry`]), and the tables that
//! map a symbol to its hook or wrapper ([`wrappers`]).

pub mod dlsym;
pub mod entry;
pub mod wrappers;
