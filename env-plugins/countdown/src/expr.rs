//! Scoring an answer as the reference's `compute_score` does.
//!
//! The reference extracts the numbers with `re.findall(r"\d+", ...)`,
//! compares them (sorted) with the puzzle's, and then evaluates the text
//! with Python's `eval` after checking it only holds `[\d+\-*/().\s]`. This
//! module reproduces that without Python: [`numbers_in`] is the regex, and
//! [`evaluate`] is a small parser for exactly the Python expressions those
//! characters can spell (integers and decimals, unary `+`/`-`, `+ - * /`,
//! `//`, `**`, parentheses), evaluated in `f64` as Python does. Anything
//! Python's `eval` would reject (a syntax error, a leading zero such as
//! `07`, division by zero) is `None`.

/// Every maximal run of ASCII digits, as a number (`re.findall(r"\d+")`).
/// A run too long for `u64` counts as `u64::MAX`, which matches no puzzle.
pub fn numbers_in(text: &str) -> Vec<u64> {
    let mut out = Vec::new();
    let mut current: Option<u64> = None;
    for c in text.chars() {
        match c.to_digit(10) {
            Some(d) if c.is_ascii_digit() => {
                current = Some(current.unwrap_or(0).checked_mul(10).and_then(|v| v.checked_add(d as u64)).unwrap_or(u64::MAX));
            }
            _ => out.extend(current.take()),
        }
    }
    out.extend(current);
    out
}

/// The value Python's `eval` gives `text`, if `text` holds only
/// `[\d+\-*/().\s]` and evaluates to a number.
pub fn evaluate(text: &str) -> Option<f64> {
    if text.trim().is_empty() || !text.chars().all(|c| c.is_ascii_digit() || "+-*/(). \t\n\r\x0b\x0c".contains(c)) {
        return None;
    }
    let tokens = tokenize(text)?;
    let mut p = Parser { tokens: &tokens, at: 0 };
    let value = p.sum()?;
    (p.at == tokens.len() && value.is_finite()).then_some(value)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Tok {
    Num(f64),
    Plus,
    Minus,
    Star,
    Slash,
    /// `//`
    FloorDiv,
    /// `**`
    Pow,
    Open,
    Close,
}

fn tokenize(text: &str) -> Option<Vec<Tok>> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() || c == 0x0b {
            i += 1;
            continue;
        }
        if c.is_ascii_digit() || c == b'.' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.') {
                i += 1;
            }
            let lit = &text[start..i];
            // Python: `07` is a syntax error, `0`, `00`, `0.7` and `7.` are not.
            let int_part = lit.split('.').next().unwrap_or("");
            if !lit.contains('.') && int_part.len() > 1 && int_part.starts_with('0') && int_part.bytes().any(|d| d != b'0') {
                return None;
            }
            if lit == "." || lit.matches('.').count() > 1 {
                return None;
            }
            out.push(Tok::Num(lit.parse().ok()?));
            continue;
        }
        let two = b.get(i + 1).copied();
        let (tok, len) = match (c, two) {
            (b'*', Some(b'*')) => (Tok::Pow, 2),
            (b'/', Some(b'/')) => (Tok::FloorDiv, 2),
            (b'+', _) => (Tok::Plus, 1),
            (b'-', _) => (Tok::Minus, 1),
            (b'*', _) => (Tok::Star, 1),
            (b'/', _) => (Tok::Slash, 1),
            (b'(', _) => (Tok::Open, 1),
            (b')', _) => (Tok::Close, 1),
            _ => return None,
        };
        out.push(tok);
        i += len;
    }
    Some(out)
}

/// Python's grammar for these tokens: sum → term (('+'|'-') term)*,
/// term → factor (('*'|'/'|'//') factor)*, factor → ('+'|'-') factor | power,
/// power → atom ('**' factor)?, atom → number | '(' sum ')'.
struct Parser<'a> {
    tokens: &'a [Tok],
    at: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<Tok> {
        self.tokens.get(self.at).copied()
    }

    fn sum(&mut self) -> Option<f64> {
        let mut v = self.term()?;
        while let Some(op @ (Tok::Plus | Tok::Minus)) = self.peek() {
            self.at += 1;
            let r = self.term()?;
            v = if op == Tok::Plus { v + r } else { v - r };
        }
        Some(v)
    }

    fn term(&mut self) -> Option<f64> {
        let mut v = self.factor()?;
        while let Some(op @ (Tok::Star | Tok::Slash | Tok::FloorDiv)) = self.peek() {
            self.at += 1;
            let r = self.factor()?;
            v = match op {
                Tok::Star => v * r,
                _ if r == 0.0 => return None, // ZeroDivisionError
                Tok::Slash => v / r,
                _ => (v / r).floor(),
            };
        }
        Some(v)
    }

    fn factor(&mut self) -> Option<f64> {
        match self.peek()? {
            Tok::Plus => {
                self.at += 1;
                self.factor()
            }
            Tok::Minus => {
                self.at += 1;
                Some(-self.factor()?)
            }
            _ => self.power(),
        }
    }

    fn power(&mut self) -> Option<f64> {
        let base = self.atom()?;
        if self.peek() == Some(Tok::Pow) {
            self.at += 1;
            let exp = self.factor()?;
            // Python: 0 ** -1 raises; a negative base to a fractional
            // power gives a complex number, not a float.
            if (base == 0.0 && exp < 0.0) || (base < 0.0 && exp.fract() != 0.0) {
                return None;
            }
            return Some(base.powf(exp));
        }
        Some(base)
    }

    fn atom(&mut self) -> Option<f64> {
        match self.peek()? {
            Tok::Num(v) => {
                self.at += 1;
                Some(v)
            }
            Tok::Open => {
                self.at += 1;
                let v = self.sum()?;
                (self.peek() == Some(Tok::Close)).then(|| self.at += 1)?;
                Some(v)
            }
            _ => None,
        }
    }
}

/// The reference's reward for `answer` on a puzzle: 0 unless the answer's
/// numbers, sorted, are the puzzle's, sorted; then 1.0 if it evaluates to
/// the target (within 1e-5), else `format_score` (it does not evaluate,
/// or to another value).
pub fn score(answer: &str, numbers: &[u64], target: u64, format_score: f64) -> f64 {
    let mut used = numbers_in(answer);
    let mut given = numbers.to_vec();
    used.sort_unstable();
    given.sort_unstable();
    if used != given {
        return 0.0;
    }
    match evaluate(answer) {
        Some(v) if (v - target as f64).abs() < 1e-5 => 1.0,
        _ => format_score,
    }
}
