//! Skills: named bodies of know-how, disclosed progressively. The catalog (name and description of
//! each skill an agent may use) is in the system prompt; the `load_skill` tool returns a skill's
//! body and the list of its resource files; a loaded skill's body stays in the prompt for the rest
//! of the session.
//!
//! A skill is a folder `skills/<name>/`: `SKILL.md` (TOML front matter with `description` between
//! `+++` lines, then the body) plus any resource files beside it (templates, references, scripts).
//! Resource files are copied into the session's workspace under `skills/<name>/` when the skill is
//! loaded, where the workspace tools read them. Resources are text, at most
//! [`MAX_RESOURCE_BYTES`] each and [`MAX_RESOURCES`] per skill; larger or binary files are refused
//! when the folder is loaded.

use std::path::Path;

use serde::Deserialize;

use crate::agent::definition::{split_front_matter, DefinitionError};
use crate::protocol::{SkillDocument, SkillResource};

/// Largest resource file of a skill.
pub const MAX_RESOURCE_BYTES: usize = 256 * 1024;
/// Most resource files of one skill.
pub const MAX_RESOURCES: usize = 32;

/// One skill (the wire type: a subagent task carries the skills its agent may load).
pub type Skill = SkillDocument;

impl SkillDocument {
    /// Where a resource file of this skill lives in a session's workspace.
    pub fn workspace_path(&self, resource: &str) -> String {
        format!("skills/{}/{resource}", self.name)
    }
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
    /// Parses `(name, document)` pairs (skills without resource files).
    pub fn from_documents(
        docs: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, DefinitionError> {
        Self::from_parts(
            docs.into_iter()
                .map(|(name, text)| (name, text, Vec::new())),
        )
    }

    /// The skills a subagent task carried.
    pub fn from_skills(mut skills: Vec<Skill>) -> Self {
        skills.sort_by(|a, b| a.name.cmp(&b.name));
        Self { skills }
    }

    /// The skills an agent may load (those it lists, or all), to travel with its task.
    pub fn documents(&self, listed: Option<&[String]>) -> Vec<Skill> {
        self.skills
            .iter()
            .filter(|s| listed.is_none_or(|l| l.contains(&s.name)))
            .cloned()
            .collect()
    }

    fn from_parts(
        parts: impl IntoIterator<Item = (String, String, Vec<SkillResource>)>,
    ) -> Result<Self, DefinitionError> {
        let mut skills = Vec::new();
        for (name, text, resources) in parts {
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
                resources,
            });
        }
        skills.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Self { skills })
    }

    /// Loads `dir/*/SKILL.md` and the resource files beside each; a missing folder is an empty
    /// catalog.
    pub fn load_dir(dir: &Path) -> Result<Self, DefinitionError> {
        if !dir.is_dir() {
            return Ok(Self::default());
        }
        let mut parts = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| read_err(dir, e))? {
            let entry = entry.map_err(|e| read_err(dir, e))?;
            let folder = entry.path();
            let file = folder.join("SKILL.md");
            if file.is_file() {
                let text = std::fs::read_to_string(&file).map_err(|e| read_err(&file, e))?;
                let mut resources = Vec::new();
                collect_resources(&folder, &folder, &mut resources)?;
                resources.sort();
                parts.push((
                    entry.file_name().to_string_lossy().into_owned(),
                    text,
                    resources,
                ));
            }
        }
        Self::from_parts(parts)
    }

    pub fn get(&self, name: &str) -> Option<&Skill> {
        self.skills.iter().find(|s| s.name == name)
    }

    /// Names of every skill.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.skills.iter().map(|s| s.name.as_str())
    }

    /// Names of the skills an agent may load: those it lists (`skills = [...]`), or all.
    pub fn allowed(&self, listed: Option<&[String]>) -> Vec<String> {
        self.skills
            .iter()
            .filter(|s| listed.is_none_or(|l| l.contains(&s.name)))
            .map(|s| s.name.clone())
            .collect()
    }

    /// The catalog as shown in the system prompt; `None` when the agent may load no skill.
    pub fn prompt_section(&self, listed: Option<&[String]>) -> Option<String> {
        let mut visible = self
            .skills
            .iter()
            .filter(|s| listed.is_none_or(|l| l.contains(&s.name)))
            .peekable();
        visible.peek()?;
        let mut text =
            String::from("Skills available (load one with the load_skill tool when it applies):\n");
        for skill in visible {
            for part in ["- ", &skill.name, ": ", &skill.description, "\n"] {
                text.push_str(part);
            }
        }
        Some(text)
    }

    /// The bodies of the skills loaded so far (that the agent may use), for the system prompt.
    pub fn loaded_section(&self, loaded: &[&str], listed: Option<&[String]>) -> Option<String> {
        let mut text = String::new();
        for skill in &self.skills {
            let allowed = listed.is_none_or(|l| l.contains(&skill.name));
            if allowed && loaded.contains(&skill.name.as_str()) {
                for part in ["Skill ", &skill.name, " (loaded):\n", &skill.body, "\n\n"] {
                    text.push_str(part);
                }
            }
        }
        (!text.is_empty()).then_some(text)
    }

    /// What `load_skill` returns: the body and where its resource files are.
    pub fn load_text(&self, name: &str) -> Option<String> {
        let skill = self.get(name)?;
        let mut text = skill.body.clone();
        if !skill.resources.is_empty() {
            text.push_str("\n\nResource files (read them with the workspace tools):\n");
            for resource in &skill.resources {
                text.push_str(&format!(
                    "- {} ({} bytes)\n",
                    skill.workspace_path(&resource.path),
                    resource.content.len()
                ));
            }
        }
        Some(text)
    }
}

fn read_err(path: &Path, source: std::io::Error) -> DefinitionError {
    DefinitionError::Read {
        path: path.display().to_string(),
        source,
    }
}

/// Adds the text files under `dir` (but `root/SKILL.md`) to `out`, paths relative to `root`.
fn collect_resources(
    root: &Path,
    dir: &Path,
    out: &mut Vec<SkillResource>,
) -> Result<(), DefinitionError> {
    let invalid = |path: &Path, message: String| DefinitionError::Invalid {
        path: path.display().to_string(),
        message,
    };
    for entry in std::fs::read_dir(dir).map_err(|e| read_err(dir, e))? {
        let path = entry.map_err(|e| read_err(dir, e))?.path();
        let kind = std::fs::symlink_metadata(&path).map_err(|e| read_err(&path, e))?;
        if kind.is_dir() {
            collect_resources(root, &path, out)?;
            continue;
        }
        if !kind.is_file() || path == root.join("SKILL.md") {
            continue;
        }
        if kind.len() as usize > MAX_RESOURCE_BYTES {
            return Err(invalid(
                &path,
                format!("skill resources are at most {MAX_RESOURCE_BYTES} bytes"),
            ));
        }
        let text = std::fs::read_to_string(&path)
            .map_err(|_| invalid(&path, "skill resources must be UTF-8 text".into()))?;
        let relative = path
            .strip_prefix(root)
            .map_err(|_| invalid(&path, "outside its skill folder".into()))?
            .to_string_lossy()
            .replace('\\', "/");
        out.push(SkillResource {
            path: relative,
            content: text,
        });
        if out.len() > MAX_RESOURCES {
            return Err(invalid(
                root,
                format!("a skill has at most {MAX_RESOURCES} resource files"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> SkillCatalog {
        SkillCatalog::from_documents([
            (
                "notes".to_string(),
                "+++\ndescription = \"keep notes\"\n+++\nWrite them down.".to_string(),
            ),
            (
                "review".to_string(),
                "+++\ndescription = \"review code\"\n+++\nRead twice.".to_string(),
            ),
        ])
        .expect("valid")
    }

    #[test]
    fn catalog_lists_names_and_descriptions() {
        let catalog = catalog();
        let section = catalog.prompt_section(None).expect("skills");
        assert!(section.contains("- notes: keep notes"));
        assert!(section.contains("load_skill"));
        assert_eq!(
            catalog.get("notes").map(|s| s.body.as_str()),
            Some("Write them down.")
        );
        assert!(SkillCatalog::default().prompt_section(None).is_none());
    }

    #[test]
    fn an_agent_sees_only_the_skills_it_lists() {
        let catalog = catalog();
        let only_review = ["review".to_string()];
        let section = catalog.prompt_section(Some(&only_review)).expect("one");
        assert!(section.contains("review") && !section.contains("notes"));
        assert_eq!(catalog.allowed(Some(&only_review)), ["review"]);
        assert!(catalog.prompt_section(Some(&[])).is_none());
        let loaded = catalog
            .loaded_section(&["notes", "review"], Some(&only_review))
            .expect("review loaded");
        assert!(loaded.contains("Read twice.") && !loaded.contains("Write them down."));
    }

    #[test]
    fn resources_are_loaded_and_listed_with_their_workspace_paths() {
        let dir = std::env::temp_dir().join(format!("skein-skills-{}", uuid::Uuid::new_v4()));
        let skill = dir.join("report");
        std::fs::create_dir_all(skill.join("templates")).expect("mkdir");
        std::fs::write(
            skill.join("SKILL.md"),
            "+++\ndescription = \"write reports\"\n+++\nUse the template.",
        )
        .expect("write");
        std::fs::write(skill.join("templates/weekly.md"), "# Week").expect("write");
        let catalog = SkillCatalog::load_dir(&dir).expect("loads");
        let report = catalog.get("report").expect("report");
        assert_eq!(
            report.resources,
            [SkillResource {
                path: "templates/weekly.md".into(),
                content: "# Week".into()
            }]
        );
        let text = catalog.load_text("report").expect("loads");
        assert!(text.starts_with("Use the template."));
        assert!(text.contains("skills/report/templates/weekly.md (6 bytes)"));
        std::fs::remove_dir_all(&dir).ok();
    }
}
