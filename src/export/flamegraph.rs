//! The flame graph picture: bytes live at the peak by stack (SVG).

use super::xml;
use crate::report::Peak;
use crate::report::units::human_bytes;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// A flame graph of the live bytes at a peak: outermost frames at the bottom, width by bytes.
pub fn flamegraph_svg(peak: &Peak, title: &str) -> String {
    #[derive(Default)]
    struct Node {
        bytes: u64,
        children: BTreeMap<String, Node>,
    }
    let mut root = Node::default();
    for (frames, bytes) in &peak.stacks {
        root.bytes += bytes;
        let mut n = &mut root;
        for f in frames.iter().rev() {
            n = n.children.entry(f.clone()).or_default();
            n.bytes += bytes;
        }
    }
    fn depth(n: &Node) -> usize {
        1 + n.children.values().map(depth).max().unwrap_or(0)
    }
    const W: f64 = 1200.0;
    const ROW: f64 = 18.0;
    let rows = depth(&root);
    let h = ROW * rows as f64 + 60.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" font-family="monospace" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="20" font-family="sans-serif" font-size="15" text-anchor="middle"{}>{}</text>"#,
        W / 2.0,
        super::fitted(title, 15.0, W - 20.0),
        xml(title)
    );
    #[allow(clippy::too_many_arguments)]
    fn draw(
        s: &mut String,
        name: &str,
        n: &Node,
        x: f64,
        w: f64,
        level: usize,
        h: f64,
        total: u64,
    ) {
        const ROW: f64 = 18.0;
        if w < 0.5 {
            return;
        }
        let y = h - 10.0 - ROW * (level as f64 + 1.0);
        let hue = 20 + (name.len() * 37 % 40);
        let label = format!(
            "{name} ({}, {:.1}%)",
            human_bytes(n.bytes),
            100.0 * n.bytes as f64 / total.max(1) as f64
        );
        let _ = writeln!(
            s,
            r#"<g><title>{}</title><rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{}" fill="hsl({hue},85%,60%)" stroke="white"/>"#,
            xml(&label),
            w,
            ROW - 1.0
        );
        let chars = ((w - 6.0) / 6.6) as usize;
        if chars > 3 {
            let text: String = if label.chars().count() > chars {
                label
                    .chars()
                    .take(chars.saturating_sub(2))
                    .collect::<String>()
                    + ".."
            } else {
                label.clone()
            };
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
                x + 3.0,
                y + 12.5,
                xml(&text)
            );
        }
        s.push_str("</g>\n");
        let mut cx = x;
        for (child, c) in &n.children {
            let cw = w * c.bytes as f64 / n.bytes.max(1) as f64;
            draw(s, child, c, cx, cw, level + 1, h, total);
            cx += cw;
        }
    }
    let total = root.bytes;
    draw(
        &mut s,
        &format!("all live at the peak, device {}", peak.device),
        &root,
        10.0,
        W - 20.0,
        0,
        h,
        total,
    );
    s.push_str("</svg>\n");
    s
}
