//! The run's batch as its command line says it.

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

/// The run's batch as its command line gave it (`--batch-size 8`, `--batch_size=8`, `-b 8`,
/// `batch_size=8`), with the words that said it; `None` when no flag of a batch is there
/// or two disagree.
pub fn batch_from_cmdline(cmdline: &[String]) -> Option<(u64, String)> {
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
        BATCH_FLAGS.contains(&f.as_str()) || BATCH_FLAGS.contains(&last.as_str())
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
    use super::batch_from_cmdline;

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
}
