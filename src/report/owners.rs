//! Who owns device memory: the library whose code asked CUDA for it, named from the module in
//! which the caller's return address lies (the trace's `Caller` records), or the framework for
//! its tensors.

use super::live::{Live, Replay};
use crate::trace::format::Api;
use crate::trace::reader::TraceReader;
use serde::Serialize;
use std::collections::BTreeMap;

/// Libraries known by name: a part of their file name, and the owner shown.
const KNOWN: &[(&str, &str)] = &[
    ("libc10_cuda", "PyTorch"),
    ("libtorch", "PyTorch"),
    ("libnccl", "NCCL"),
    ("libcublasLt", "cuBLASLt"),
    ("libcublas", "cuBLAS"),
    ("libcudnn", "cuDNN"),
    ("libcufft", "cuFFT"),
    ("libcusparse", "cuSPARSE"),
    ("libcurand", "cuRAND"),
    ("triton", "Triton"),
    ("xla_extension", "XLA"),
    ("jaxlib", "XLA"),
    ("cupy", "CuPy"),
    ("_ctypes", "the program (Python ctypes)"),
    ("libffi", "the program (Python ctypes)"),
    ("libcudart", "the CUDA runtime"),
    ("libcuda.so", "the CUDA driver"),
];

/// The owner of a live allocation.
pub fn owner_of(reader: &TraceReader, l: &Live) -> String {
    if l.api == Api::Torch as u8 {
        return "PyTorch tensors".to_string();
    }
    let [first, next] = l.caller;
    if first == 0 {
        return "not recorded".to_string();
    }
    let path = |ip: u64| reader.module_of(ip).map(|(_, p)| p.to_string());
    let mut lib = path(first);
    // The CUDA runtime calling the driver for someone: that someone.
    if next != 0 && lib.as_deref().is_some_and(is_cuda) {
        lib = path(next).or(lib);
    }
    name(lib.as_deref().unwrap_or(""), &reader.info().program)
}

fn is_cuda(path: &str) -> bool {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.starts_with("libcudart") || file.starts_with("libcuda.so")
}

/// The owner a library's path names: a known library, the program itself, or the file name.
fn name(path: &str, program: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    if file.is_empty() || file == program {
        return "the program".to_string();
    }
    KNOWN
        .iter()
        .find(|(part, _)| file.contains(part))
        .map_or_else(|| file.to_string(), |(_, owner)| owner.to_string())
}

/// Bytes one owner holds on one device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OwnerBytes {
    pub device: u8,
    pub owner: String,
    pub bytes: u64,
    pub allocations: u64,
}

/// What each owner holds per device now: the live allocations by owner, and the framework's
/// cache beyond its tensors (`PyTorch's cache, unused`), largest first on each device.
pub fn held_by_owner(reader: &TraceReader, rp: &Replay) -> Vec<OwnerBytes> {
    let mut by: BTreeMap<(u8, String), (u64, u64)> = BTreeMap::new();
    for l in rp.all_live() {
        let e = by.entry((l.device, owner_of(reader, l))).or_default();
        e.0 = e.0.saturating_add(l.size);
        e.1 += 1;
    }
    if rp.tensors {
        for (&d, &reserved) in &rp.reserved {
            let tensors = rp.tensor_bytes.get(&d).map_or(0, |t| t.0);
            let unused = reserved.saturating_sub(tensors);
            if unused > 0 {
                by.insert((d, "PyTorch's cache, unused".to_string()), (unused, 0));
            }
        }
    }
    let mut out: Vec<OwnerBytes> = by
        .into_iter()
        .map(|((device, owner), (bytes, allocations))| OwnerBytes {
            device,
            owner,
            bytes,
            allocations,
        })
        .collect();
    out.sort_by(|a, b| a.device.cmp(&b.device).then(b.bytes.cmp(&a.bytes)));
    out
}
