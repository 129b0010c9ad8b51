//! The one replay of what is live lives with the trace ([`crate::trace::live`]), since the shim's
//! summarizer runs it too; the reports reach it here.

pub use crate::trace::live::*;
