//! `gpushim fit` where PyTorch's reductions change their way at a larger batch: a bias's
//! gradient summed within thread blocks over the few rows of the run's batch is summed
//! through a staging buffer and a semaphore at more (`src/report/fit/latent.rs`). The kinds
//! program with biases (`KINDS_BIAS`: 192 rows a sample of 4,096 outputs, on a simulated
//! device of 8 multiprocessors) asks none at batches 1 to 5 and one a layer a step from 6 on
//! (8 MiB, the device's cap, while the activations are live).

use crate::common::*;
use crate::fit::{json, replayed};
use serde_json::Value;
use std::path::Path;

/// The kinds program with biases (`KINDS_BIAS` set to `bias`: "1", "16"; none where empty) at
/// `batch`, 3 steps, on a simulated device of 8 multiprocessors ("16": 132, where the staging
/// buffers are not capped at these batches); its trace.
fn biased(dir: &Path, batch: u64, bias: &str) -> std::path::PathBuf {
    let t = dir.join(format!("b{batch}-{bias}.trace"));
    let multiprocessors = if bias == "16" { "132" } else { "8" };
    let mut env = vec![
        ("KINDS_BATCH", batch.to_string()),
        ("GPUSHIM_SIM_MULTIPROCESSORS", multiprocessors.to_string()),
    ];
    if !bias.is_empty() {
        env.push(("KINDS_BIAS", bias.to_string()));
    }
    assert_ok(&kinds_program(&t, 3, false, env));
    t
}

/// Peak reserved and allocated of row `row` of setting `k`.
fn peaks(fit: &Value, k: usize, row: usize) -> (u64, u64) {
    let r = &fit["settings"][k]["rows"][row];
    (
        r["peak_reserved_bytes"].as_u64().unwrap(),
        r["peak_allocated_bytes"].as_u64().unwrap(),
    )
}

/// `fit` from the run at batch 1 at `batches` against the runs at those batches, with
/// `KINDS_BIAS=bias`: every row's peaks equal under both settings; the fit.
fn fits_the_runs(dir: &Path, bias: &str, batches: &[u64]) -> Value {
    let small = biased(dir, 1, bias);
    let reals: Vec<_> = batches.iter().map(|&b| biased(dir, b, bias)).collect();
    let list = batches
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let t = small.to_str().unwrap();
    let fit = json(&["fit", t, "--at", "1", "--batch", &list, "--json"]);
    for k in 0..2 {
        let setting = fit["settings"][k]["setting"].as_str().unwrap();
        for (row, real) in reals.iter().enumerate() {
            let (reserved, allocated, _) = replayed(real, setting, None);
            assert_eq!(
                peaks(&fit, k, row),
                (reserved, allocated),
                "{bias}: {setting:?}, row {row}: {fit}"
            );
        }
    }
    fit
}

/// From the run at batch 1 (no staging buffer asked), the peaks at 4, 8 and 16 equal those of
/// the runs at those batches, both settings: none at 4, one a layer from 6 on (capped); the
/// text says how many sums and from which batch; a program without biases is told none.
/// Without the latent sums the rows at 8 and 16 come out low (checked by taking them out).
#[test]
fn a_bias_summed_within_blocks_at_the_runs_batch_asks_its_staging_buffer_at_more() {
    let dir = tempdir("fit-latent");
    let fit = fits_the_runs(&dir, "1", &[4, 8, 16]);
    // Two layers a step, three steps.
    assert_eq!(fit["latent_reductions"]["count"], 6, "{fit}");
    assert_eq!(fit["latent_reductions"]["from_batch"], 6, "{fit}");
    let t = dir.join("b1-1.trace");
    let text = gpushim_text(&["fit", t.to_str().unwrap(), "--at", "1", "--batch", "4"]);
    assert_ok(&text);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(
            "6 sums of a bias's gradient made within thread blocks at batch 1 ask PyTorch's \
             reduction a staging buffer and a semaphore from batch 6 on"
        ),
        "{text}"
    );
    // No bias, no latent sum.
    let plain = biased(&dir, 1, "");
    let fit = json(&["fit", plain.to_str().unwrap(), "--at", "1", "--json"]);
    assert!(fit.get("latent_reductions").is_none(), "{fit}");
}

/// The same under autocast: the node's gradients in 16 bits (half a parameter's size), the
/// bias's elements told by its parameter's size: from batch 3 on, to the byte at 2, 4 and 8,
/// on a device large enough that the buffers grow with the rows (fails with the elements
/// taken as 4 bytes: half the buffer).
#[test]
fn a_16_bit_bias_gradient_is_summed_as_its_elements_say() {
    let dir = tempdir("fit-latent16");
    let fit = fits_the_runs(&dir, "16", &[2, 4, 8]);
    assert_eq!(fit["latent_reductions"]["count"], 6, "{fit}");
    assert_eq!(fit["latent_reductions"]["from_batch"], 3, "{fit}");
}
