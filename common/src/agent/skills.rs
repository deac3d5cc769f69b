//! Skills: named bodies of know-how. The catalog (name and description of each) is shown in the
//! system prompt; a skill's body is for loading on demand.
//!
//! A skill is `skills/<name>/SKILL.md`: TOML front matter (`description`) between `+++` lines, then
//! the body.

use std::path::Path;

use serde::Deserialize;

use crate::agent::definition::{split_front_matter, DefinitionError};

/// One skill.
#[derive(Debug, Clone, PartialEq)]
pub struct Skill {
    pub name: String,
    pub description: String,
    pub body: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SkillFront {
    #[serde(default)]
    description: String,
}

/// The skills a lead knows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SkillCatalog {
    skills: Vec<Skill>,
}

impl SkillCatalog {
    /// Parses `(name, document)` pairs.
    pub fn from_documents(
        docs: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, DefinitionError> {
        let mut skills = Vec::new();
        for (name, text) in docs {
            let (front, body) = split_front_matter(&text);
            let front: SkillFront = match front {
                Some(f) => toml::from_str(f).map_err(|e| DefinitionError::FrontMatter {
                    path: format!("skills/{name}/SKILL.md"),
                    message: e.to_string(),
                })?,
                None => SkillFront::default(),
            };
            skills.push(Skill {
                name,
                description: front.description,
                body: body.trim().to_owned(),
            });
        }
        skills.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Self { skills })
    }

    /// Loads `dir/*/SKILL.md`; a missing folder is an empty catalog.
    pub fn load_dir(dir: &Path) -> Result<Self, DefinitionError> {
        if !dir.is_dir() {
            return Ok(Self::default());
        }
        let read_err = |path: &Path, source| DefinitionError::Read {
            path: path.display().to_string(),
            source,
        };
        let mut docs = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| read_err(dir, e))? {
            let entry = entry.map_err(|e| read_err(dir, e))?;
            let file = entry.path().join("SKILL.md");
            if file.is_file() {
                let text = std::fs::read_to_string(&file).map_err(|e| read_err(&file, e))?;
                docs.push((entry.file_name().to_string_lossy().into_owned(), text));
            }
        }
        Self::from_documents(docs)
    }

    pub fn get(&self, name: &str) -> Option<&Skill> {
        self.skills.iter().find(|s| s.name == name)
    }

    /// The catalog as shown in the system prompt; `None` when there are no skills.
    pub fn prompt_section(&self) -> Option<String> {
        if self.skills.is_empty() {
            return None;
        }
        let mut text = String::from("Skills available (ask for one by name when it applies):\n");
        for skill in &self.skills {
            text.push_str(&format!("- {}: {}\n", skill.name, skill.description));
        }
        Some(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_lists_names_and_descriptions() {
        let catalog = SkillCatalog::from_documents([(
            "notes".to_string(),
            "+++\ndescription = \"keep notes\"\n+++\nWrite them down.".to_string(),
        )])
        .expect("valid");
        let section = catalog.prompt_section().expect("one skill");
        assert!(section.contains("- notes: keep notes"));
        assert_eq!(
            catalog.get("notes").map(|s| s.body.as_str()),
            Some("Write them down.")
        );
        assert!(SkillCatalog::default().prompt_section().is_none());
    }
}
