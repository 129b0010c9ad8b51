//! Traces in the viewers people already use, one file per format: Perfetto / Chrome JSON
//! ([`perfetto`]), PyTorch's memory_viz pickle and page ([`memory_viz`]), RMM's replay CSV
//! ([`rmm`]); the pictures: a timeline of live and reserved memory ([`plot`]) and a flame graph
//! of live bytes by stack ([`flamegraph`]), as SVG or PNG ([`png`]).

mod flamegraph;
mod memory_viz;
pub use memory_viz::MOST_HISTORY_BYTES;
mod page;
mod perfetto;
mod plot;
mod png;
mod rmm;
mod series;
mod stacked;
mod ticks;

pub use flamegraph::flamegraph_svg;
pub use memory_viz::memory_viz;
pub use page::page_html;
pub use perfetto::perfetto;
pub use plot::plot_svg;
pub use png::svg_to_png;
pub use rmm::rmm_csv;
pub use stacked::{StackBy, kind_color, stacked_svg};

use crate::trace::reader::{ReadError, TraceReader};

/// Why an export or a picture could not be made.
#[derive(Debug)]
pub enum ExportError {
    /// The trace could not be read.
    Read(ReadError),
    /// The output could not be written.
    Write(std::io::Error),
    /// A pickle protocol memory_viz cannot take (2, 3 and 4 are offered).
    Protocol(u8),
    /// The snapshot could not be pickled (the library's words).
    Pickle(String),
    /// The SVG could not be read for rendering (the library's words).
    Svg(String),
    /// No image of this width and height can be made.
    ImageSize(u32, u32),
    /// The PNG could not be encoded (the library's words).
    Png(String),
}

impl std::fmt::Display for ExportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExportError::Read(e) => e.fmt(f),
            ExportError::Write(e) => write!(f, "cannot write the output: {e}"),
            ExportError::Protocol(p) => write!(f, "pickle protocol {p} is not offered (2, 3 or 4)"),
            ExportError::Pickle(e) => write!(f, "cannot pickle the snapshot: {e}"),
            ExportError::Svg(e) => write!(f, "cannot read the SVG: {e}"),
            ExportError::ImageSize(w, h) => write!(f, "cannot make a {w}x{h} image"),
            ExportError::Png(e) => write!(f, "cannot encode the PNG: {e}"),
        }
    }
}

impl std::error::Error for ExportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ExportError::Read(e) => Some(e),
            ExportError::Write(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ReadError> for ExportError {
    fn from(e: ReadError) -> Self {
        ExportError::Read(e)
    }
}

impl From<std::io::Error> for ExportError {
    fn from(e: std::io::Error) -> Self {
        ExportError::Write(e)
    }
}

/// What an export wrote: its items (events, rows or segments), and of each trace it read, the
/// oldest records its ring's checkpoint summarized (0: every record in full).
#[derive(Debug)]
pub struct Written {
    pub items: u64,
    pub summarized: Vec<(std::path::PathBuf, u64)>,
    /// Events of the memory-viz history left out, the oldest (past `--max-entries`).
    pub dropped: u64,
    /// Events of the memory-viz history left out, the oldest, because the newer ones' stacks
    /// fill [`memory_viz::MOST_HISTORY_BYTES`] already.
    pub dropped_for_bytes: u64,
}

/// Where each trace starts on a shared clock: its offset from the earliest start (wall clock at
/// `CLOCK_REALTIME`), and the name of its series ("device 0", or "rank 1 device 0" with
/// several traces).
/// Each trace's header alone is read for it (the traces are then read once each).
fn aligned(
    paths: &[std::path::PathBuf],
) -> Result<Vec<(u64, String, crate::trace::reader::TraceInfo)>, ReadError> {
    let infos = paths
        .iter()
        .map(TraceReader::header)
        .collect::<Result<Vec<_>, ReadError>>()?;
    let t0 = infos.iter().map(|i| i.start_realtime_ns).min().unwrap_or(0);
    Ok(infos
        .into_iter()
        .enumerate()
        .map(|(n, i)| {
            let who = if paths.len() == 1 {
                String::new()
            } else if i.rank >= 0 {
                format!("rank {} ", i.rank)
            } else {
                // The file's name says which run it is; its position in the list does not.
                let file = paths[n]
                    .file_name()
                    .map(|f| crate::files::shown(std::path::Path::new(f)).to_string())
                    .unwrap_or_else(|| format!("trace {}", n + 1));
                format!("{file} ")
            };
            (i.start_realtime_ns - t0, who, i)
        })
        .collect())
}

/// The attributes that keep a line of SVG text of `font_size` within `room` pixels: none when it
/// fits (judged at 0.6 of the font size a character, about what sans-serif and monospace fonts
/// take), else a `textLength` that squeezes it in, so a long title or range name is never cut
/// at the picture's edge.
fn fitted(text: &str, font_size: f64, room: f64) -> String {
    let wide = text.chars().count() as f64 * font_size * 0.6;
    if wide <= room {
        String::new()
    } else {
        format!(r#" textLength="{room:.0}" lengthAdjust="spacingAndGlyphs""#)
    }
}

/// `text` in at most `max` characters: whole, or cut after its last whole frame (` < `) or
/// word that fits, with an ellipsis, never in the middle of a name.
pub(crate) fn shortened(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let head: String = text.chars().take(max.saturating_sub(2)).collect();
    let cut = head
        .rfind(" < ")
        .or_else(|| head.rfind(' '))
        .unwrap_or(head.len());
    format!("{} \u{2026}", head[..cut].trim_end())
}

/// Text for SVG or HTML, in an element or a double-quoted attribute (the only kind written):
/// markup characters as entities, and control characters (a newline in a file name, an escape
/// sequence in a symbol) and characters that change how text reads unseen (a direction
/// override) written as visible escapes (`\x0a`, `\u{202e}`: an entity would still act), so
/// a string from a trace neither adds markup, starts a line of its own, nor reads reversed.
pub(crate) fn xml(s: &str) -> String {
    crate::trace::reader::visible(s)
        .replace('\0', "\\x00")
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_line_too_long_for_its_room_is_squeezed_in_and_a_short_one_left_alone() {
        assert_eq!(super::fitted("a title", 15.0, 980.0), "");
        let long = "x".repeat(200);
        assert_eq!(
            super::fitted(&long, 15.0, 980.0),
            r#" textLength="980" lengthAdjust="spacingAndGlyphs""#
        );
    }

    #[test]
    fn export_errors_are_typed_and_a_bad_protocol_is_refused_before_reading() {
        let absent = std::path::Path::new("/nonexistent/gpushim/absent.trace");
        let mut sink = Vec::new();
        let e = super::memory_viz(absent, &mut sink, (5, 10), &Default::default()).unwrap_err();
        assert!(matches!(e, super::ExportError::Protocol(5)), "{e:?}");
        assert!(e.to_string().contains("(2, 3 or 4)"), "{e}");
        let e = super::memory_viz(absent, &mut sink, (4, 10), &Default::default()).unwrap_err();
        assert!(matches!(e, super::ExportError::Read(_)), "{e:?}");
        assert!(std::error::Error::source(&e).is_some());
        let e = super::svg_to_png("this is not an SVG").unwrap_err();
        assert!(matches!(e, super::ExportError::Svg(_)), "{e:?}");
        assert!(e.to_string().starts_with("cannot read the SVG: "), "{e}");
    }

    use super::ticks::{nice_step, tick_label};

    #[test]
    fn png_text_is_drawn_with_the_built_in_fonts() {
        // The same picture with and without its text must differ, whatever fonts the machine
        // has (the GPU machine has none).
        let with = r#"<svg xmlns="http://www.w3.org/2000/svg" width="80" height="20" font-family="sans-serif"><rect width="80" height="20" fill="white"/><text x="4" y="14">memory</text></svg>"#;
        let without = with.replace("memory", "");
        let a = super::svg_to_png(with).unwrap();
        let b = super::svg_to_png(&without).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn ticks_are_round_numbers() {
        assert_eq!(nice_step(0.87), 1.0);
        assert_eq!(nice_step(1.3), 2.0);
        assert_eq!(nice_step(0.22), 0.25);
        assert_eq!(nice_step(870.0), 1000.0);
        assert_eq!(nice_step(3.1), 5.0);
        assert_eq!(tick_label(7.5, 2.5), "7.5");
        assert_eq!(tick_label(0.75, 0.25), "0.75");
        assert_eq!(tick_label(400.0, 200.0), "400");
    }
}

#[cfg(test)]
mod shortened_tests {
    #[test]
    fn a_long_boundary_is_cut_between_frames_never_inside_a_name() {
        let text =
            "detected period: each allocation from a.py:1 in f < b.py:2 in g < module.py:9 in h";
        assert_eq!(super::shortened(text, 200), text);
        let short = super::shortened(text, 70);
        assert_eq!(
            short,
            "detected period: each allocation from a.py:1 in f < b.py:2 in g \u{2026}"
        );
        assert!(short.chars().count() <= 70);
    }
}
