//! Plugin text on a terminal. Names, descriptions and observations come
//! from a stranger's code; written raw, an ESC or OSC sequence among them
//! could clear the screen, set the window title or worse. Every line the
//! CLI shows a person goes through [`escape`] (or an [`Escaping`] writer):
//! control characters become visible `\u{..}` escapes, while newlines and
//! tabs stay, so grids still render. JSON output needs none of this: serde
//! escapes control characters itself.

use std::borrow::Cow;
use std::io::{self, Write};

/// Whether `c` would be interpreted by a terminal rather than shown.
fn is_control(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

/// `s` with every control character but `\n` and `\t` written as `\u{..}`.
///
/// `"a\x1b]0;title\x07b"` becomes `a\u{1b}]0;title\u{7}b` (see the tests).
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_control) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(s.chars().map(|c| if is_control(c) { format!("\\u{{{:x}}}", c as u32) } else { c.to_string() }).collect())
}

/// A writer that [`escape`]s what goes through it (`play`'s output).
pub struct Escaping<W: Write>(pub W);

impl<W: Write> Write for Escaping<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write_all(escape(&String::from_utf8_lossy(buf)).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// Run `work` with a spinner on stderr saying `message` (hidden when
/// stderr is not a terminal).
pub fn with_spinner<T>(message: &str, work: impl FnOnce() -> T) -> T {
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.set_message(message.to_string());
    spinner.enable_steady_tick(std::time::Duration::from_millis(120));
    let out = work();
    spinner.finish_and_clear();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_sequences_become_visible_and_grids_keep_their_lines() {
        assert_eq!(escape("a\x1b]0;pwned\x07b\n#.\t#"), "a\\u{1b}]0;pwned\\u{7}b\n#.\t#");
        assert_eq!(escape("\x1b[2J\u{9b}31m\r"), "\\u{1b}[2J\\u{9b}31m\\u{d}");
        assert!(matches!(escape("plain\ntext"), Cow::Borrowed(_)));
        let mut out = Escaping(Vec::new());
        writeln!(out, "x\x1b[2Jy").unwrap();
        assert_eq!(String::from_utf8(out.0).unwrap(), "x\\u{1b}[2Jy\n");
    }
}
