//! The model's chat template (Jinja), rendered as Hugging Face's
//! `apply_chat_template` renders it: blocks trimmed and left-stripped, the
//! special tokens and `add_generation_prompt` in scope, Python's string
//! methods available, `raise_exception` raising.

use anyhow::{Context, Result};
use minijinja::{Environment, Error, ErrorKind, context};
use ragen_agent::Role;
use serde::Serialize;

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
    /// it ends with the header of the assistant's next turn.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let template = self.env.get_template("chat").expect("added in new");
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos,
                eos_token => self.eos,
            })
            .context("the model's chat template failed to render the conversation")
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
}
