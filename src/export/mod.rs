//! Traces in the viewers people already use, one file per format: Perfetto / Chrome JSON
//! ([`perfetto`]), PyTorch's memory_viz pickle and page ([`memory_viz`]), RMM's replay CSV
//! ([`rmm`]); the pictures: a timeline of live and reserved memory ([`plot`]) and a flame graph
//! of live bytes by stack ([`flamegraph`]), as SVG or PNG ([`png`]); and live bytes by site
//! ([`sites`]).

mod flamegraph;
mod memory_viz;
mod perfetto;
mod plot;
mod png;
mod rmm;
mod sites;

pub use flamegraph::flamegraph_svg;
pub use memory_viz::{memory_viz, memory_viz_html};
pub use perfetto::perfetto;
pub use plot::plot_svg;
pub use png::svg_to_png;
pub use rmm::rmm_csv;
pub use sites::live_by_site;

use crate::trace::reader::{ReadError, ReadOptions, TraceReader};

/// Live and reserved memory per device over time, with the NVTX ranges of the most frequent
/// name shaded, as an SVG line chart with labelled axes.
/// Where each trace starts on a shared clock: its offset from the earliest start (wall clock at
/// `CLOCK_REALTIME`), and the name of its series ("device 0", or "rank 1 device 0" with
/// several traces).
fn aligned(
    paths: &[std::path::PathBuf],
    opts: &ReadOptions,
) -> Result<Vec<(u64, String, crate::trace::reader::TraceInfo)>, ReadError> {
    let infos = paths
        .iter()
        .map(|p| Ok(TraceReader::open_with(p, opts)?.info().clone()))
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
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_else(|| format!("trace {}", n + 1));
                format!("{file} ")
            };
            (i.start_realtime_ns - t0, who, i)
        })
        .collect())
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::plot::{nice_step, tick_label};

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
