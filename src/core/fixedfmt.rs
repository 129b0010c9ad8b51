//! Formatting into a fixed stack buffer, for messages written where allocating is not allowed
//! (inside `dlsym`, hooks, fork handlers).

use core::fmt;

/// A `fmt::Write` sink over a fixed array; text past its capacity is cut, never allocated.
pub struct FixedBuf<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> Default for FixedBuf<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> FixedBuf<N> {
    pub const fn new() -> Self {
        FixedBuf {
            buf: [0; N],
            len: 0,
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    pub fn push_bytes(&mut self, b: &[u8]) {
        let n = b.len().min(N - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&b[..n]);
        self.len += n;
    }

    /// Writes the buffer to standard error in one `write` call, so lines from several threads
    /// do not interleave.
    pub fn write_stderr(&self) {
        // SAFETY: the pointer and length describe initialized bytes of `buf`.
        unsafe { libc::write(2, self.buf.as_ptr().cast(), self.len) };
    }
}

impl<const N: usize> fmt::Write for FixedBuf<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push_bytes(s.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::fmt::Write;

    #[test]
    fn text_past_the_capacity_is_cut() {
        let mut b = FixedBuf::<8>::new();
        write!(b, "{}-{}", 1234, 56789).unwrap();
        assert_eq!(b.as_bytes(), b"1234-567");
    }
}

/// Whether `c` changes how the text around it reads without being seen itself: the
/// bidirectional embeddings, overrides, isolates and marks (U+202E shows a name reversed),
/// zero-width characters, word joiners, line and paragraph separators, the byte-order mark,
/// the soft hyphen, interlinear annotations and tag characters (Unicode's format characters
/// and separators that text shows nothing for). Shown as escapes wherever a string from a
/// trace or a file is shown, so two names that read the same are the same.
pub fn hidden(c: char) -> bool {
    matches!(
        c as u32,
        0xad | 0x61c
            | 0x180e
            | 0x200b..=0x200f
            | 0x2028..=0x202e
            | 0x2060..=0x2064
            | 0x2066..=0x206f
            | 0xfeff
            | 0xfff9..=0xfffb
            | 0xe0001
            | 0xe0020..=0xe007f
    )
}

/// Bytes (a path, a program name) shown on one line: printable ASCII and valid UTF-8 as they
/// are, control characters, backslashes and invalid bytes as `\xNN`, characters that change
/// how text reads unseen ([`hidden`]) as `\u{202e}`, so a newline in a file name cannot split
/// a message and a direction override cannot reverse it. Allocates nothing.
pub struct Escaped<'a>(pub &'a [u8]);

impl core::fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        for chunk in self.0.utf8_chunks() {
            for c in chunk.valid().chars() {
                if c.is_control() || c == '\\' {
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        write!(f, "\\x{b:02x}")?;
                    }
                } else if hidden(c) {
                    write!(f, "\\u{{{:x}}}", c as u32)?;
                } else {
                    write!(f, "{c}")?;
                }
            }
            for b in chunk.invalid() {
                write!(f, "\\x{b:02x}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod escaped_tests {
    use super::Escaped;

    #[test]
    fn control_characters_and_bad_bytes_are_escaped_and_the_rest_kept() {
        let s = format!("{}", Escaped(b"/tmp/a\nb\\c/\xffd\xc3\xa9.trace"));
        assert_eq!(s, "/tmp/a\\x0ab\\x5cc/\\xffd\u{e9}.trace");
        assert!(!s.contains('\n'));
    }

    #[test]
    fn direction_overrides_and_zero_width_characters_are_shown_as_escapes() {
        // "evil\u{202e}txt.exe" reads "evilexe.txt" raw; a zero-width space hides in a name.
        let s = format!(
            "{}",
            Escaped("evil\u{202e}txt.exe a\u{200b}b \u{2066}i\u{2069}".as_bytes())
        );
        assert_eq!(s, "evil\\u{202e}txt.exe a\\u{200b}b \\u{2066}i\\u{2069}");
        // An escape sequence and the four characters that spell one differ.
        assert_ne!(
            format!("{}", Escaped(b"\x1b")),
            format!("{}", Escaped(b"\\x1b"))
        );
        assert!(!super::hidden('a') && !super::hidden('\u{e9}') && super::hidden('\u{feff}'));
    }
}
