//! Who owns device memory: the library whose code asked CUDA for it, named from the module in
//! which the caller's return address lies (the trace's `Caller` records), or the framework for
//! its tensors.

use super::kinds::Kind;
use super::live::{Live, Replay};
use crate::trace::format::{Api, RecordKind};
use crate::trace::reader::TraceTables;
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
/// Tensors the program let go of whose memory other streams still use until their events
/// complete (PyTorch counts them allocated no longer, and frees them at a later request).
pub const IN_USE_ELSEWHERE: &str = "PyTorch tensors let go of, in use on other streams";

pub fn owner_of(tables: &TraceTables, l: &Live) -> String {
    if l.api == Api::Torch as u8 {
        return "PyTorch tensors".to_string();
    }
    let [first, next] = l.caller;
    if first == 0 {
        return "not recorded".to_string();
    }
    let path = |ip: u64| tables.module_of(ip).map(|(_, p)| p.to_string());
    let mut lib = path(first);
    // The CUDA runtime calling the driver for someone: that someone.
    if next != 0 && lib.as_deref().is_some_and(is_cuda) {
        lib = path(next).or(lib);
    }
    name(lib.as_deref().unwrap_or(""), &tables.info().program)
}

fn is_cuda(path: &str) -> bool {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.starts_with("libcudart") || file.starts_with("libcuda.so")
}

/// The owner a library's path names: a known library, the program itself, the Python package
/// an extension module belongs to (CuPy's calls come from `cupy_backends/cuda/api/runtime.cpython-312-x86_64-linux-gnu.so`),
/// or the file name.
fn name(path: &str, program: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    if file.is_empty() || file == program {
        return "the program".to_string();
    }
    if let Some(owner) = known(file) {
        return owner.to_string();
    }
    match python_package(path) {
        Some(package) => known(package).map_or_else(|| package.to_string(), str::to_string),
        None => file.to_string(),
    }
}

fn known(name: &str) -> Option<&'static str> {
    KNOWN
        .iter()
        .find(|(part, _)| name.contains(part))
        .map(|&(_, owner)| owner)
}

/// The top-level package of a file installed under `site-packages` or `dist-packages` (not a
/// file lying there itself).
fn python_package(path: &str) -> Option<&str> {
    ["/site-packages/", "/dist-packages/"]
        .iter()
        .find_map(|marker| {
            let rest = &path[path.rfind(marker)? + marker.len()..];
            let (package, _) = rest.split_once('/')?;
            (!package.is_empty()).then_some(package)
        })
}

/// Bytes one owner holds on one device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct OwnerBytes {
    pub device: u8,
    pub owner: String,
    pub bytes: u64,
    pub allocations: u64,
}

/// The part of NVML's figure CUDA's default pool (`cudaMallocAsync`) reserves beyond what its
/// allocations use.
pub const CUDA_POOL_UNUSED: &str = "CUDA's stream-ordered pool, unused";
/// The same for the memory CUDA keeps for graphs' allocations (beyond those the trace holds).
pub const CUDA_GRAPH_UNUSED: &str = "CUDA's graph memory, unused";
/// What the pools the program created (`cudaMemPoolCreate`) reserve beyond their allocations.
pub const CREATED_POOLS_UNUSED: &str = "the program's CUDA pools, unused";

/// What each owner holds per device now: the live allocations by owner, and the framework's
/// cache beyond its tensors (`PyTorch's cache, unused`), largest first on each device.
pub fn held_by_owner(tables: &TraceTables, rp: &Replay) -> Vec<OwnerBytes> {
    held_by_owner_kinds(tables, rp, &|_, _| None, &|_| false)
}

/// [`held_by_owner`], PyTorch's tensors split by kind where `kind` knows a tensor's (by its
/// address): `PyTorch tensors: activations`, ..., listed first on each device in the kinds'
/// order; those `let_go` says the program let go of while other streams use them, apart
/// ([`IN_USE_ELSEWHERE`]).
pub fn held_by_owner_kinds(
    tables: &TraceTables,
    rp: &Replay,
    kind: &dyn Fn(u64, &Live) -> Option<Kind>,
    let_go: &dyn Fn(u64) -> bool,
) -> Vec<OwnerBytes> {
    let mut by: BTreeMap<(u8, String), (u64, u64)> = BTreeMap::new();
    let all = rp
        .live
        .iter()
        .map(|(&p, l)| (p, l))
        .chain(rp.physical.values().map(|l| (0, l)));
    for (p, l) in all {
        let torch = l.api == Api::Torch as u8;
        let owner = match kind(p, l) {
            _ if torch && let_go(p) => IN_USE_ELSEWHERE.to_string(),
            Some(k) if torch => tensors_of_kind(k),
            _ => owner_of(tables, l),
        };
        let e = by.entry((l.device, owner)).or_default();
        e.0 = e.0.saturating_add(l.size);
        e.1 += 1;
    }
    if rp.tensors.recorded() {
        for (&d, &reserved) in &rp.reserved {
            let tensors = rp.tensors.live_on(d);
            let unused = reserved.saturating_sub(tensors);
            if unused > 0 {
                by.insert((d, "PyTorch's cache, unused".to_string()), (unused, 0));
            }
        }
    }
    // CUDA's own pools reserve in chunks: what their allocations leave unused. The default
    // pool says what its allocations use. Graph memory counts a chunk as used once anything
    // lives in it, so its allocations are the stream-ordered ones the trace holds beyond the
    // default pool's (never more: pools the program makes itself would only lower this).
    for (&(d, pool), &(reserved, used)) in &rp.facts.cuda_pools {
        let (name, unused) = match pool {
            0 => (CUDA_POOL_UNUSED, reserved.saturating_sub(used)),
            2 => (CREATED_POOLS_UNUSED, reserved.saturating_sub(used)),
            _ => {
                let stream_ordered: u64 = rp
                    .all_live()
                    .filter(|l| l.device == d && l.kind == RecordKind::AllocAsync as u8)
                    .fold(0, |a, l| a.saturating_add(l.size));
                let pools_used = [0, 2]
                    .iter()
                    .filter_map(|&p| rp.facts.cuda_pools.get(&(d, p)))
                    .fold(0u64, |a, p| a.saturating_add(p.1));
                let in_graphs = stream_ordered.saturating_sub(pools_used);
                (CUDA_GRAPH_UNUSED, reserved.saturating_sub(in_graphs))
            }
        };
        if unused > 0 {
            by.insert((d, name.to_string()), (unused, 0));
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
    let rank = |o: &OwnerBytes| {
        Kind::ALL
            .iter()
            .position(|&k| o.owner == tensors_of_kind(k))
            .unwrap_or(Kind::ALL.len())
    };
    out.sort_by(|a, b| {
        a.device
            .cmp(&b.device)
            .then(rank(a).cmp(&rank(b)))
            .then(b.bytes.cmp(&a.bytes))
    });
    out
}

/// The owner's name of PyTorch's tensors of kind `k`.
pub fn tensors_of_kind(k: Kind) -> String {
    format!("PyTorch tensors: {}", k.name())
}

#[cfg(test)]
mod tests {
    use super::name;

    #[test]
    fn a_library_is_named_by_its_file_then_its_python_package_then_its_file_name() {
        let site = "/opt/venv/lib/python3.12/site-packages";
        assert_eq!(
            name(&format!("{site}/torch/lib/libc10_cuda.so"), "python3"),
            "PyTorch"
        );
        assert_eq!(
            name(
                &format!("{site}/nvidia/cublas/lib/libcublas.so.13"),
                "python3"
            ),
            "cuBLAS"
        );
        // An extension module takes its package's name, known or not.
        assert_eq!(
            name(
                &format!("{site}/cupy_backends/cuda/api/runtime.cpython-312-x86_64-linux-gnu.so"),
                "python3"
            ),
            "CuPy"
        );
        assert_eq!(
            name(
                "/usr/lib/python3/dist-packages/mylib/_ext.cpython-312-x86_64-linux-gnu.so",
                "python3"
            ),
            "mylib"
        );
        assert_eq!(name("/usr/lib/libfoo.so.1", "python3"), "libfoo.so.1");
        assert_eq!(name(&format!("{site}/solo.so"), "python3"), "solo.so");
        assert_eq!(name("/usr/bin/train", "train"), "the program");
    }
}
