//! The system prompt, assembled from sections with priorities (lower first). The agent's own
//! prompt, the subagent roster, the skills catalog and the session context are sections; hooks may
//! transform the assembled text.

/// One part of the system prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptSection {
    pub name: &'static str,
    pub priority: u8,
    pub text: String,
}

/// Well-known section priorities.
pub mod priority {
    pub const AGENT: u8 = 0;
    pub const SUBAGENTS: u8 = 20;
    pub const SKILLS: u8 = 30;
    /// The session's plan, when its agent plans.
    pub const PLAN: u8 = 40;
    /// The session's summary of its compacted history.
    pub const SUMMARY: u8 = 80;
    pub const CONTEXT: u8 = 90;
}

/// Sections being gathered for one model call.
#[derive(Debug, Clone, Default)]
pub struct SystemPrompt {
    sections: Vec<PromptSection>,
}

impl SystemPrompt {
    pub fn add(&mut self, name: &'static str, priority: u8, text: impl Into<String>) {
        let text = text.into();
        if !text.trim().is_empty() {
            self.sections.push(PromptSection {
                name,
                priority,
                text,
            });
        }
    }

    /// The sections joined in priority order (stable for equal priorities).
    pub fn render(mut self) -> String {
        const BETWEEN: &str = "\n\n";
        self.sections.sort_by_key(|s| s.priority);
        let len = self
            .sections
            .iter()
            .map(|s| s.text.trim().len() + BETWEEN.len())
            .sum();
        let mut text = String::with_capacity(len);
        for (i, section) in self.sections.iter().enumerate() {
            if i > 0 {
                text.push_str(BETWEEN);
            }
            text.push_str(section.text.trim());
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_by_priority_and_skips_empty_sections() {
        let mut prompt = SystemPrompt::default();
        prompt.add("late", 90, "C");
        prompt.add("first", 0, "A");
        prompt.add("empty", 10, "  ");
        prompt.add("mid", 20, "B");
        assert_eq!(prompt.render(), "A\n\nB\n\nC");
    }
}
