//! Agent definitions: `AgentCatalog` loads them from a workspace folder and resolves a task's agent
//! (with its per-task overrides) into the `AgentSpec` a turn runs.
//!
//! Folder layout:
//! - `AGENTS.md`: the main agent; its subagents default to every file in `subagents/`;
//! - `subagents/*.md`: agents the main agent may spawn (also submittable by name);
//! - `skills/*/SKILL.md`: skills (see `skills`).
//!
//! Each `.md` file is optional TOML front matter between `+++` lines (`name`, `description`,
//! `model`, `tools`, `subagents`, `max_iterations`) followed by the system prompt. Without a folder
//! the bundled example workspace is used, so a fresh cluster answers offline.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use crate::agent::skills::SkillCatalog;
use crate::protocol::{validate_token, AgentOverrides, AgentSpec, Failure, FailureKind};

/// Iteration limit when a definition sets none.
pub const DEFAULT_MAX_ITERATIONS: u32 = 8;
/// Highest iteration limit a definition or override may ask for.
pub const MAX_ITERATIONS_CAP: u32 = 64;

const BUNDLED_MAIN: &str = include_str!("../../../examples/workspace/AGENTS.md");
const BUNDLED_SUBAGENTS: [(&str, &str); 1] = [(
    "researcher.md",
    include_str!("../../../examples/workspace/subagents/researcher.md"),
)];
const BUNDLED_SKILLS: [(&str, &str); 1] = [(
    "note-taking",
    include_str!("../../../examples/workspace/skills/note-taking/SKILL.md"),
)];

/// Why definitions could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum DefinitionError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: bad front matter: {message}")]
    FrontMatter { path: String, message: String },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FrontMatter {
    name: Option<String>,
    #[serde(default)]
    description: String,
    #[serde(default)]
    model: String,
    tools: Option<Vec<String>>,
    subagents: Option<Vec<String>>,
    max_iterations: Option<u32>,
}

/// All agents a lead can run, plus the skills catalog.
#[derive(Debug, Clone, Default)]
pub struct AgentCatalog {
    /// Shared with every turn that runs an agent as defined (no overrides).
    agents: BTreeMap<String, Arc<AgentSpec>>,
    skills: SkillCatalog,
}

impl AgentCatalog {
    /// The bundled example workspace.
    pub fn bundled() -> Result<Self, DefinitionError> {
        let subagents = BUNDLED_SUBAGENTS
            .iter()
            .map(|(name, text)| (name.to_string(), text.to_string()))
            .collect();
        let skills = SkillCatalog::from_documents(
            BUNDLED_SKILLS
                .iter()
                .map(|(n, t)| (n.to_string(), t.to_string())),
        )?;
        Self::assemble(("AGENTS.md".into(), BUNDLED_MAIN.into()), subagents, skills)
    }

    /// Loads a workspace folder.
    pub fn load_dir(dir: &Path) -> Result<Self, DefinitionError> {
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|source| DefinitionError::Read {
                path: path.display().to_string(),
                source,
            })
        };
        let main = dir.join("AGENTS.md");
        let main = (main.display().to_string(), read(&main)?);
        let mut subagents = Vec::new();
        let sub_dir = dir.join("subagents");
        if sub_dir.is_dir() {
            let entries = std::fs::read_dir(&sub_dir).map_err(|source| DefinitionError::Read {
                path: sub_dir.display().to_string(),
                source,
            })?;
            let mut paths: Vec<_> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "md"))
                .collect();
            paths.sort();
            for path in paths {
                subagents.push((path.display().to_string(), read(&path)?));
            }
        }
        let skills = SkillCatalog::load_dir(&dir.join("skills"))?;
        Self::assemble(main, subagents, skills)
    }

    fn assemble(
        main: (String, String),
        subagents: Vec<(String, String)>,
        skills: SkillCatalog,
    ) -> Result<Self, DefinitionError> {
        let mut agents = BTreeMap::new();
        let mut sub_names = Vec::new();
        let mut sub_lists = Vec::new();
        for (path, text) in &subagents {
            let (spec, subs) = parse(path, text, "")?;
            sub_names.push(spec.name.clone());
            sub_lists.push((spec.name.clone(), subs.unwrap_or_default()));
            agents.insert(spec.name.clone(), spec);
        }
        let (main_spec, main_subs) = parse(&main.0, &main.1, "assistant")?;
        sub_lists.push((main_spec.name.clone(), main_subs.unwrap_or(sub_names)));
        agents.insert(main_spec.name.clone(), main_spec);
        // Resolve subagent names into specs (one level: a child's own children are resolved too,
        // but without their children, which keeps specs finite).
        let flat = agents.clone();
        for (name, subs) in sub_lists {
            let mut resolved = Vec::new();
            for sub in subs {
                let child = flat.get(&sub).ok_or_else(|| DefinitionError::Invalid {
                    path: name.clone(),
                    message: format!("unknown subagent {sub:?}"),
                })?;
                resolved.push(child.clone());
            }
            if let Some(agent) = agents.get_mut(&name) {
                agent.subagents = resolved;
            }
        }
        let agents = agents
            .into_iter()
            .map(|(name, spec)| (name, Arc::new(spec)))
            .collect();
        Ok(Self { agents, skills })
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.agents.keys().map(String::as_str)
    }

    pub fn skills(&self) -> &SkillCatalog {
        &self.skills
    }

    /// The spec a task runs: the named agent (shared) or, with overrides, a copy with the task's
    /// overrides applied.
    pub fn resolve(
        &self,
        name: &str,
        overrides: Option<&AgentOverrides>,
    ) -> Result<Arc<AgentSpec>, Failure> {
        let defined = self.agents.get(name).ok_or_else(|| {
            let known: Vec<_> = self.names().collect();
            Failure::new(
                FailureKind::UnknownAgent,
                format!("unknown agent {name:?}; known agents: {}", known.join(", ")),
            )
        })?;
        let Some(o) = overrides else {
            return Ok(defined.clone());
        };
        let mut spec = AgentSpec::clone(defined);
        if let Some(prompt) = &o.system_prompt {
            spec.system_prompt = prompt.clone();
        }
        if let Some(model) = &o.model {
            spec.model = model.clone();
        }
        if let Some(tools) = &o.tools {
            spec.tools = tools.clone();
        }
        if let Some(max) = o.max_iterations {
            if max == 0 || max > MAX_ITERATIONS_CAP {
                return Err(Failure::new(
                    FailureKind::InvalidInput,
                    format!("max_iterations must be 1..={MAX_ITERATIONS_CAP}"),
                ));
            }
            spec.max_iterations = max;
        }
        Ok(Arc::new(spec))
    }
}

/// Parses one definition file; returns the spec and its declared subagent names (if any).
fn parse(
    path: &str,
    text: &str,
    default_name: &str,
) -> Result<(AgentSpec, Option<Vec<String>>), DefinitionError> {
    let (front, body) = split_front_matter(text);
    let front: FrontMatter = match front {
        Some(f) => toml::from_str(f).map_err(|e| DefinitionError::FrontMatter {
            path: path.to_owned(),
            message: e.to_string(),
        })?,
        None => FrontMatter::default(),
    };
    let file_stem = Path::new(path)
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or(default_name);
    let name = front.name.unwrap_or_else(|| {
        if default_name.is_empty() {
            file_stem.to_owned()
        } else {
            default_name.to_owned()
        }
    });
    let invalid = |message: String| DefinitionError::Invalid {
        path: path.to_owned(),
        message,
    };
    validate_token("agent name", &name).map_err(|f| invalid(f.message))?;
    let max_iterations = front.max_iterations.unwrap_or(DEFAULT_MAX_ITERATIONS);
    if max_iterations == 0 || max_iterations > MAX_ITERATIONS_CAP {
        return Err(invalid(format!(
            "max_iterations must be 1..={MAX_ITERATIONS_CAP}"
        )));
    }
    let spec = AgentSpec {
        name,
        description: front.description,
        system_prompt: body.trim().to_owned(),
        model: front.model,
        tools: front.tools.unwrap_or_else(|| vec!["*".into()]),
        subagents: Vec::new(),
        max_iterations,
    };
    Ok((spec, front.subagents))
}

/// Splits `+++`-delimited front matter from the body.
pub(crate) fn split_front_matter(text: &str) -> (Option<&str>, &str) {
    let trimmed = text.trim_start();
    if let Some(rest) = trimmed.strip_prefix("+++") {
        if let Some(end) = rest.find("\n+++") {
            let front = &rest[..end];
            let body = rest[end + 4..].trim_start_matches(['\r', '\n']);
            return (Some(front), body);
        }
    }
    (None, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_workspace_loads_with_its_subagent() {
        let catalog = AgentCatalog::bundled().expect("bundled workspace is valid");
        let main = catalog.resolve("assistant", None).expect("main agent");
        assert!(main.subagents.iter().any(|s| s.name == "researcher"));
        assert!(!main.system_prompt.is_empty());
        assert!(catalog.resolve("researcher", None).is_ok());
    }

    #[test]
    fn unknown_agents_and_bad_overrides_are_clear_failures() {
        let catalog = AgentCatalog::bundled().expect("bundled workspace is valid");
        let err = catalog.resolve("nobody", None).expect_err("unknown");
        assert_eq!(err.kind, FailureKind::UnknownAgent);
        assert!(err.message.contains("assistant"));
        let bad = AgentOverrides {
            max_iterations: Some(0),
            ..Default::default()
        };
        assert_eq!(
            catalog.resolve("assistant", Some(&bad)).map_err(|f| f.kind),
            Err(FailureKind::InvalidInput)
        );
    }

    #[test]
    fn overrides_apply() {
        let catalog = AgentCatalog::bundled().expect("bundled workspace is valid");
        let o = AgentOverrides {
            system_prompt: Some("be brief".into()),
            tools: Some(vec!["read_file".into()]),
            max_iterations: Some(2),
            model: Some("m".into()),
        };
        let spec = catalog.resolve("assistant", Some(&o)).expect("resolves");
        assert_eq!(spec.system_prompt, "be brief");
        assert_eq!(spec.tools, ["read_file"]);
        assert_eq!(spec.max_iterations, 2);
        assert_eq!(spec.model, "m");
    }

    #[test]
    fn front_matter_is_parsed_and_errors_name_the_file() {
        let (spec, subs) = parse(
            "x/helper.md",
            "+++\ndescription = \"d\"\ntools = [\"a\"]\nsubagents = []\n+++\nYou help.",
            "",
        )
        .expect("parses");
        assert_eq!(spec.name, "helper");
        assert_eq!(spec.tools, ["a"]);
        assert_eq!(spec.system_prompt, "You help.");
        assert_eq!(subs, Some(vec![]));
        let err = parse("x/bad.md", "+++\nnope = 1\n+++\nhi", "").expect_err("unknown field");
        assert!(err.to_string().contains("x/bad.md"));
    }
}
