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

static WORKING: std::sync::OnceLock<indicatif::ProgressBar> = std::sync::OnceLock::new();

/// The hook for long work after the read: a spinner on stderr with what is under way (the
/// reading bar cleared first).
pub fn show_working(line: &str) {
    let spinner = WORKING.get_or_init(|| {
        if let Some(bar) = PROGRESS_BAR.get() {
            bar.finish_and_clear();
        }
        let s = indicatif::ProgressBar::new_spinner();
        s.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        s.enable_steady_tick(std::time::Duration::from_millis(120));
        s
    });
    spinner.set_message(line.to_string());
}

/// Clears the bar and the spinner, if shown.
pub fn finish() {
    if let Some(bar) = PROGRESS_BAR.get() {
        bar.finish_and_clear();
    }
    if let Some(s) = WORKING.get() {
        s.finish_and_clear();
    }
}
