//! The progress bar on long reads.

static PROGRESS_BAR: std::sync::OnceLock<indicatif::ProgressBar> = std::sync::OnceLock::new();

/// The reader's progress hook: a bar on stderr once a trace has millions of records.
pub fn show_progress(done: u64, total: u64) {
    let bar = PROGRESS_BAR.get_or_init(|| {
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} reading {human_pos}/{human_len} records [{bar:30}] {percent}% ({eta} left)",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar
    });
    bar.set_length(total);
    bar.set_position(done);
}

/// Clears the bar, if one was shown.
pub fn finish() {
    if let Some(bar) = PROGRESS_BAR.get() {
        bar.finish_and_clear();
    }
}
