//! The flame graph picture: bytes live at the peak by stack (SVG).

use super::xml;
use crate::report::Peak;
use crate::report::kinds::Kind;
use crate::report::units::human_bytes;
use std::collections::BTreeMap;
use std::fmt::Write as _;

#[derive(Default)]
struct Node {
    bytes: u64,
    /// Bytes by kind ([`Kind::ALL`]'s order; the last: not a tensor).
    kinds: [u64; Kind::ALL.len() + 1],
    children: BTreeMap<String, Node>,
}

impl Node {
    fn add(&mut self, bytes: u64, kind: Option<Kind>) {
        self.bytes = self.bytes.saturating_add(bytes);
        let k = &mut self.kinds[kind.map_or(Kind::ALL.len(), |k| k as usize)];
        *k = k.saturating_add(bytes);
    }

    /// The kind most of its bytes are (`None`: not PyTorch's tensors).
    fn kind(&self) -> Option<Kind> {
        let (i, _) = self
            .kinds
            .iter()
            .enumerate()
            .max_by_key(|&(i, b)| (*b, std::cmp::Reverse(i)))?;
        Kind::ALL.get(i).copied()
    }
}

/// A flame graph of the live bytes at a peak: outermost frames at the bottom, width by bytes;
/// `by_kind` colours each frame by the kind most of its bytes are (PyTorch's tensors), with a
/// legend, else by a hue from its name.
pub fn flamegraph_svg(peak: &Peak, title: &str, by_kind: bool) -> String {
    let mut root = Node::default();
    for (frames, bytes, kind) in &peak.stacks {
        root.add(*bytes, *kind);
        let mut n = &mut root;
        for f in frames.iter().rev() {
            n = n.children.entry(f.clone()).or_default();
            n.add(*bytes, *kind);
        }
    }
    fn depth(n: &Node) -> usize {
        1 + n.children.values().map(depth).max().unwrap_or(0)
    }
    const W: f64 = 1200.0;
    const ROW: f64 = 18.0;
    let rows = depth(&root);
    let legend = if by_kind { 22.0 } else { 0.0 };
    let h = ROW * rows as f64 + 60.0 + legend;
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
    if by_kind {
        let mut x = 10.0;
        for (k, color) in Kind::ALL
            .iter()
            .map(|&k| (k.name(), super::kind_color(k)))
            .chain([("not a tensor", "#86bcb6")])
        {
            let _ = writeln!(
                s,
                r##"<rect x="{x:.1}" y="32" width="11" height="11" fill="{color}" stroke="#999" stroke-width="0.5"/><text x="{:.1}" y="42" font-family="sans-serif">{k}</text>"##,
                x + 15.0
            );
            x += 30.0 + k.len() as f64 * 7.0;
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
        by_kind,
    );
    s.push_str("</svg>\n");
    s
}

/// One frame's box, then its callees' above it, each as wide as its share of the bytes.
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
    by_kind: bool,
) {
    const ROW: f64 = 18.0;
    if w < 0.5 {
        return;
    }
    let y = h - 10.0 - ROW * (level as f64 + 1.0);
    let fill = if by_kind {
        n.kind().map_or("#86bcb6", super::kind_color).to_string()
    } else {
        format!("hsl({},85%,60%)", 20 + (name.len() * 37 % 40))
    };
    let label = format!(
        "{name} ({}, {:.1}%)",
        human_bytes(n.bytes),
        100.0 * n.bytes as f64 / total.max(1) as f64
    );
    let _ = writeln!(
        s,
        r#"<g><title>{}</title><rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{}" fill="{fill}" stroke="white"/>"#,
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
        draw(s, child, c, cx, cw, level + 1, h, total, by_kind);
        cx += cw;
    }
}
