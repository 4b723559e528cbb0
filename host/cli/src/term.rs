//! Plugin text on a terminal. Names, descriptions and observations come
//! from a stranger's code; written raw, an ESC or OSC sequence among them
//! could clear the screen, set the window title or worse, and a Unicode
//! direction control (U+202E, right-to-left override) or an invisible
//! format character could make a board or a message read differently from
//! what it is. Every line the CLI shows a person goes through [`escape`]
//! (or an [`Escaping`] writer): such characters become visible `\u{..}`
//! escapes, while newlines and tabs stay, so grids still render. JSON
//! output needs none of this: it keeps the text exact, and serde escapes
//! control characters itself.

use std::borrow::Cow;
use std::io::{self, Write};

/// Whether `c` would be interpreted by a terminal rather than shown, or
/// changes how the text around it reads without being seen itself.
fn is_hidden(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t') || is_invisible_format(c)
}

/// Unicode format characters (category Cf) that reorder or hide text: the
/// bidirectional marks, embeddings, overrides and isolates; zero-width
/// spaces and joiners; invisible operators; the byte-order mark; the
/// interlinear annotation marks; and the tag characters, which can carry a
/// whole hidden ASCII message. Zero-width joiners are escaped too, at the
/// cost of showing an emoji sequence as its parts: a board is not the place
/// for them, and they can hide a difference between two names.
fn is_invisible_format(c: char) -> bool {
    matches!(c,
        '\u{ad}' | '\u{61c}' | '\u{180e}'
        | '\u{200b}'..='\u{200f}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2060}'..='\u{2064}'
        | '\u{2066}'..='\u{206f}'
        | '\u{feff}'
        | '\u{fff9}'..='\u{fffb}'
        | '\u{e0000}'..='\u{e007f}')
}

/// `s` with every control character but `\n` and `\t`, and every
/// invisible format character, written as `\u{..}`.
///
/// `"a\x1b]0;title\x07b"` becomes `a\u{1b}]0;title\u{7}b`, and a
/// right-to-left override `\u{202e}` (see the tests).
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_hidden) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(s.chars().map(|c| if is_hidden(c) { format!("\\u{{{:x}}}", c as u32) } else { c.to_string() }).collect())
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

    #[test]
    fn direction_controls_and_invisible_characters_are_shown_as_escapes() {
        // "abc" shown right to left would read "cba" with the override raw.
        assert_eq!(escape("x\u{202e}abc\u{202c}"), "x\\u{202e}abc\\u{202c}");
        assert_eq!(escape("\u{2066}a\u{2069}\u{200f}"), "\\u{2066}a\\u{2069}\\u{200f}");
        assert_eq!(escape("ad\u{200b}min\u{feff}"), "ad\\u{200b}min\\u{feff}");
        // A tag character (hidden ASCII) is escaped; a plain letter,
        // accented or not, or a grid symbol is not.
        assert_eq!(escape("\u{e0041}"), "\\u{e0041}");
        assert!(matches!(escape("é #.ç ← █"), Cow::Borrowed(_)));
    }
}
