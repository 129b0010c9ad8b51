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

/// Bytes (a path, a program name) shown on one line: printable ASCII and valid UTF-8 as they
/// are, control characters, backslashes and invalid bytes as `\xNN`, so a newline in a file
/// name cannot split a message. Allocates nothing.
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
}
