//! The model's chat template (Jinja), rendered as Hugging Face's
//! `apply_chat_template` renders it: blocks trimmed and left-stripped, the
//! special tokens and `add_generation_prompt` in scope, Python's string
//! methods available, `raise_exception` raising.
//!
//! A template is code from a model file, so a render is bounded: in
//! instructions ([`TEMPLATE_FUEL`]: an endless or enormous loop runs out),
//! in nesting ([`TEMPLATE_RECURSION`]: a macro calling itself stops), and
//! in output ([`output_limit`]: a loop printing a huge string stops at
//! the limit instead of filling memory). minijinja itself refuses a string
//! repeated past 100 MB. What none of these bound is a string doubled a few
//! dozen times through a `namespace` (each doubling is one instruction):
//! minijinja has no allocation limit, so such a template can still exhaust
//! memory.

use anyhow::{Context, Result, bail};
use minijinja::{Environment, Error, ErrorKind, context};
use ragen_agent::Role;
use serde::Serialize;
use std::io;

/// Instructions one render may run: far above what any chat template
/// needs for a conversation (a few dozen per message), far below an
/// endless loop's.
pub const TEMPLATE_FUEL: u64 = 2_000_000;

/// How deep macros and includes may nest in a render.
pub const TEMPLATE_RECURSION: usize = 64;

/// The most a render may write for `messages`: 64 KiB of the template's
/// own text plus 16 times the messages' bytes (the conversation is written
/// once, with headers around each message).
pub fn output_limit(messages: &[ChatMessage]) -> usize {
    let bytes: usize = messages.iter().map(|m| m.role.len() + m.content.len()).sum();
    (64 << 10) + 16 * bytes
}

/// A writer that refuses to hold more than `limit` bytes.
struct Bounded {
    out: Vec<u8>,
    limit: usize,
}

impl io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.out.len() + buf.len() > self.limit {
            return Err(io::Error::other("over the output limit"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One message as templates read it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        let role = match role {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        };
        Self { role: role.into(), content: content.into() }
    }
}

/// A compiled chat template and the special tokens it may name.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos: String,
    eos: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("template", &self.source()).finish()
    }
}

impl ChatTemplate {
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_recursion_limit(TEMPLATE_RECURSION);
        env.add_function("raise_exception", |message: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_template_owned("chat", source.to_string()).context("the model's chat template does not compile")?;
        Ok(Self { env, source: source.to_string(), bos: bos.into(), eos: eos.into() })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// The conversation as the model reads it; with `add_generation_prompt`
    /// it ends with the header of the assistant's next turn. A render that
    /// runs out of fuel, nests too deep or writes past [`output_limit`] is
    /// an error naming the bound.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let template = self.env.get_template("chat").expect("added in new");
        let limit = output_limit(messages);
        let mut out = Bounded { out: Vec::new(), limit };
        let rendered = template.render_captured_to(
            context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos,
                eos_token => self.eos,
            },
            &mut out,
        );
        match rendered {
            Ok(_) => Ok(String::from_utf8(out.out).context("the model's chat template wrote text that is not UTF-8")?),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => bail!(
                "the model's chat template ran more than {TEMPLATE_FUEL} instructions for {} messages: it loops without end or far too long; fix the template in the model file",
                messages.len()
            ),
            Err(e) if e.kind() == ErrorKind::WriteFailure => bail!(
                "the model's chat template wrote more than {limit} bytes for {} messages: it repeats text without bound; fix the template in the model file",
                messages.len()
            ),
            Err(e) => Err(e).context("the model's chat template failed to render the conversation"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn chatml_renders_with_the_generation_prompt() {
        let t = ChatTemplate::new(CHATML, "<|im_start|>", "<|im_end|>").unwrap();
        let text = t.render(&[ChatMessage::new(Role::User, "hi")], true).unwrap();
        assert_eq!(text, "<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn python_string_methods_and_raise_exception_work() {
        let t = ChatTemplate::new(
            "{{ messages[0]['content'].strip() }}{% if messages|length > 1 %}{{ raise_exception('one only') }}{% endif %}",
            "",
            "",
        )
        .unwrap();
        assert_eq!(t.render(&[ChatMessage::new(Role::User, "  x ")], false).unwrap(), "x");
        let two = [ChatMessage::new(Role::User, "a"), ChatMessage::new(Role::User, "b")];
        assert!(format!("{:#}", t.render(&two, false).unwrap_err()).contains("one only"));
    }

    /// What a hostile template gets: each bound stops it with an error
    /// naming it, in well under a second, and memory stays small.
    #[test]
    fn a_template_that_loops_recurses_or_floods_is_stopped() {
        let hi = [ChatMessage::new(Role::User, "hi")];
        let error = |source: &str| {
            let t = ChatTemplate::new(source, "", "").unwrap();
            format!("{:#}", t.render(&hi, true).unwrap_err())
        };
        // A loop of 10^10 iterations runs out of fuel.
        let endless = error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
        assert!(endless.contains("ran more than 2000000 instructions"), "{endless}");
        // A macro that calls itself stops at the nesting limit.
        let deep = error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
        assert!(deep.contains("recursion"), "{deep}");
        // A 1 MB string printed a thousand times stops at the output limit.
        let flood = error("{% set s = 'x' * 1000000 %}{% for i in range(1000) %}{{ s }}{% endfor %}");
        assert!(flood.contains("wrote more than 65632 bytes"), "{flood}");
        // A string repeated past minijinja's own cap is refused.
        let huge = error("{{ 'x' * 1000000000000 }}");
        assert!(huge.contains("too large"), "{huge}");
        // A long conversation through a real template stays well within every bound.
        let t = ChatTemplate::new(CHATML, "", "").unwrap();
        let long: Vec<ChatMessage> =
            (0..200).map(|i| ChatMessage::new(Role::User, "a message of some length ".repeat(i % 20 + 1))).collect();
        assert!(t.render(&long, true).unwrap().ends_with("<|im_start|>assistant\n"));
    }
}
