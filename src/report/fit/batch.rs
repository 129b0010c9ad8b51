//! The run's batch and sequence length as its command line says them.

/// The flags a training script's batch size goes by, as their spelling folds (lower case,
/// `-` and `_` dropped): argparse's and HuggingFace's usual names, Lightning's, Megatron's.
const BATCH_FLAGS: [&str; 9] = [
    "batchsize",
    "bs",
    "b",
    "perdevicetrainbatchsize",
    "trainbatchsize",
    "microbatchsize",
    "trainmicrobatchsizepergpu",
    "batch",
    "localbatchsize",
];

/// The flags a sequence length goes by, folded as [`BATCH_FLAGS`]: argparse's usual names,
/// HuggingFace's (`--max_seq_length`, `--block_size`), nanoGPT's (`block_size=1024`).
const SEQ_FLAGS: [&str; 10] = [
    "seqlen",
    "seqlength",
    "sequencelength",
    "maxseqlength",
    "maxseqlen",
    "maxlength",
    "blocksize",
    "contextlength",
    "ctxlen",
    "maxsourcelength",
];

/// The run's batch as its command line gave it (`--batch-size 8`, `--batch_size=8`, `-b 8`,
/// `batch_size=8`), with the words that said it; `None` when no flag of a batch is there
/// or two disagree.
pub fn batch_from_cmdline(cmdline: &[String]) -> Option<(u64, String)> {
    value_from_cmdline(cmdline, &BATCH_FLAGS)
}

/// The run's sequence length as its command line gave it (`--seq-len 512`,
/// `--max_seq_length=512`, `block_size=1024`), with the words that said it.
pub fn seq_from_cmdline(cmdline: &[String]) -> Option<(u64, String)> {
    value_from_cmdline(cmdline, &SEQ_FLAGS)
}

/// The value of the flags `flags` (folded) on `cmdline`, with the words that said it; `None`
/// when none is there or two disagree.
fn value_from_cmdline(cmdline: &[String], flags: &[&str]) -> Option<(u64, String)> {
    let fold = |s: &str| -> String {
        s.trim_start_matches('-')
            .chars()
            .filter(|c| *c != '-' && *c != '_' && *c != '.')
            .flat_map(char::to_lowercase)
            .collect()
    };
    let is_flag = |name: &str| {
        let f = fold(name);
        // Hydra-style keys name the batch last: data.batch_size=8.
        let last = name.rsplit('.').next().map(fold).unwrap_or_default();
        flags.contains(&f.as_str()) || flags.contains(&last.as_str())
    };
    let mut found: Option<(u64, String)> = None;
    // The program's own words: past the interpreter and its script (argv[0] and, for python,
    // the script or `-m module`).
    for (i, word) in cmdline.iter().enumerate().skip(1) {
        let (name, value) = match word.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (word.as_str(), None),
        };
        let dashed = name.starts_with('-');
        // A bare `b=8` or `bs=8` is too loose to believe; a dashed flag or a longer key is not.
        if !is_flag(name) || (!dashed && (value.is_none() || fold(name).len() < 4)) {
            continue;
        }
        let (value, said) = match value {
            Some(v) => (v, word.clone()),
            None => match cmdline.get(i + 1) {
                Some(v) => (v.clone(), format!("{word} {v}")),
                None => continue,
            },
        };
        let Ok(n) = value.trim().parse::<u64>() else {
            continue;
        };
        if n == 0 {
            continue;
        }
        match &found {
            Some((m, _)) if *m != n => return None,
            Some(_) => {}
            None => found = Some((n, said)),
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::{batch_from_cmdline, seq_from_cmdline};

    fn words(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_string).collect()
    }

    #[test]
    fn the_batch_is_read_from_the_usual_flags() {
        for (line, want) in [
            ("python train.py --batch-size 8", Some(8)),
            ("python train.py --batch_size=16 --lr 0.1", Some(16)),
            ("python -m trainer --per_device_train_batch_size 4", Some(4)),
            ("torchrun train.py -b 32", Some(32)),
            ("python train.py data.batch_size=12", Some(12)),
            ("python train.py --bs 8 --batch-size 8", Some(8)),
            // Two that disagree, none, a value that is no number, a loose short key.
            ("python train.py --bs 8 --batch-size 16", None),
            ("python train.py --epochs 3", None),
            ("python train.py --batch-size auto", None),
            ("python train.py b=8", None),
            ("python train.py --batch-size", None),
        ] {
            assert_eq!(
                batch_from_cmdline(&words(line)).map(|(n, _)| n),
                want,
                "{line}"
            );
        }
        assert_eq!(
            batch_from_cmdline(&words("python train.py --batch-size 8")).map(|(_, s)| s),
            Some("--batch-size 8".to_string())
        );
    }

    #[test]
    fn the_sequence_length_is_read_from_the_usual_flags() {
        for (line, want) in [
            ("python train.py --seq-len 512 --batch-size 8", Some(512)),
            ("python run_clm.py --block_size 1024", Some(1024)),
            ("python train.py --max_seq_length=384", Some(384)),
            ("python train.py block_size=256", Some(256)),
            ("python train.py --batch-size 8", None),
            ("python train.py --seq-len 512 --max-length 1024", None),
        ] {
            assert_eq!(
                seq_from_cmdline(&words(line)).map(|(n, _)| n),
                want,
                "{line}"
            );
        }
    }
}
