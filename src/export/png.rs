//! SVG pictures rendered to PNG, text drawn with built-in fonts.

/// Renders one of our SVGs to PNG (twice the SVG's size, on white) with the DejaVu fonts
/// built into the command, so the picture reads the same on a machine without fonts.
pub fn svg_to_png(svg: &str) -> Result<Vec<u8>, super::ExportError> {
    use super::ExportError;
    use resvg::{tiny_skia, usvg};
    let mut opt = usvg::Options::default();
    let db = opt.fontdb_mut();
    db.load_font_data(dejavu::sans::regular().to_vec());
    db.load_font_data(dejavu::sans_mono::regular().to_vec());
    db.set_sans_serif_family("DejaVu Sans");
    db.set_serif_family("DejaVu Sans");
    db.set_monospace_family("DejaVu Sans Mono");
    opt.font_family = "DejaVu Sans".to_string();
    let tree = usvg::Tree::from_str(svg, &opt).map_err(|e| ExportError::Svg(e.to_string()))?;
    let scale = 2.0;
    let size = tree.size().to_int_size();
    let (w, h) = (
        (size.width() as f32 * scale).ceil() as u32,
        (size.height() as f32 * scale).ceil() as u32,
    );
    let mut pixmap = tiny_skia::Pixmap::new(w, h).ok_or(ExportError::ImageSize(w, h))?;
    pixmap.fill(tiny_skia::Color::WHITE);
    resvg::render(
        &tree,
        tiny_skia::Transform::from_scale(scale, scale),
        &mut pixmap.as_mut(),
    );
    pixmap
        .encode_png()
        .map_err(|e| ExportError::Png(e.to_string()))
}
