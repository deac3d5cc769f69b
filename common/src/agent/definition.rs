//! Agent definitions: `AgentCatalog` loads them from a workspace folder and resolves a task's agent
//! (with its per-task overrides) into the `AgentSpec` a turn runs.
//!
//! Folder layout:
//! - `AGENTS.md`: the main agent; its subagents default to every file in `subagents/`;
//! - `subagents/*.md`: agents the main agent may spawn (also submittable by name);
//! - `skills/*/SKILL.md`: skills (see `skills`);
//! - `permissions.toml` (optional): permission rules for every agent of the folder, with the keys
//!   of a `[permissions]` table at its top level, plus the folder's approver rules
//!   (`self_approval` and `[[approvers]]`, see `permissions::ApproverPolicy`), which only this
//!   file may hold.
//!
//! Each `.md` file is optional TOML front matter between `+++` lines (`name`, `description`,
//! `model` (a name, `provider:name` for a named provider, or a `[model]` table of `provider` and
//! `name`), `fallback_models`, `context_tokens`, `tools`, `subagents`, `max_iterations`, `skills`,
//! `planning` (offer the plan tools), `max_parallel_steps`, `max_concurrency` (most runs of the
//! agent as a subagent at once across the cluster), a `[budget]` table with `max_total_tokens` and `max_cost_usd` (the default budget of a task
//! the agent runs), `output_schema` (see below) and a `[permissions]` table with
//! `mode`, `allow`, `ask`, `deny` and `approval_timeout_ms` or `approval_timeout = "10m"`)
//! followed by the system prompt.
//!
//! `output_schema` makes the agent's final answer a structured answer (see
//! `agent::structured`): either the path of a JSON file holding the JSON Schema, relative to the
//! definition file (`output_schema = "schemas/answer.json"`; only in a folder, not in the bundled
//! workspace), or the schema itself as a TOML table (`[output_schema]` with `type = "object"`,
//! `[output_schema.properties.city]`, …). The schema is named `answer`; it is checked when the
//! folder loads (an object at its root, only keywords the validator checks), and a submission's
//! own schema replaces it. Without a folder the bundled example workspace is used, so a
//! fresh cluster answers offline.
//!
//! Invariants: a loaded catalog holds only agents whose permission rules all compile and whose
//! `skills` all exist, and approver rules that all compile; an agent's permissions are the folder's merged with its own
//! (`permissions::merge`); a task's overrides can only tighten them (`permissions::tighten`), and
//! the tightening reaches the subagents the task may spawn; an agent's `[budget]` limits are
//! positive, and a task's budget can only lower them.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use crate::agent::permissions::{
    merge, restrict, tighten, ApproverEntry, ApproverPolicy, CompiledPolicy,
};
use crate::agent::skills::SkillCatalog;
use crate::protocol::{
    validate_token, AgentOverrides, AgentSpec, Budget, Failure, FailureKind, OutputSchema,
    PermissionMode, PermissionPolicy,
};

/// Iteration limit when a definition sets none.
pub const DEFAULT_MAX_ITERATIONS: u32 = 8;
/// Most plan steps an agent may run at once (`max_parallel_steps`).
pub const MAX_PARALLEL_STEPS_CAP: u32 = 64;
/// Highest iteration limit a definition or override may ask for.
pub const MAX_ITERATIONS_CAP: u32 = 64;
/// Highest cluster-wide cap on an agent's runs at once (`max_concurrency`).
pub const MAX_CONCURRENCY_CAP: u32 = 10_000;

/// The smallest `context_tokens` an agent may declare: room for a prompt, a summary and an answer.
pub const MIN_CONTEXT_TOKENS: u64 = 1_024;

/// Checks an agent spec that arrived in a message (a subagent task) as its definition would have
/// been checked when loaded: a valid name, `max_iterations` within 1..=`MAX_ITERATIONS_CAP`, tool
/// and skill names that are plain names or patterns, `max_concurrency` within
/// 1..=`MAX_CONCURRENCY_CAP`, and subagents nested no deeper than `nesting_left` more levels.
pub fn check_spec(spec: &AgentSpec, nesting_left: u32) -> Result<(), Failure> {
    let invalid = |message: String| {
        Failure::new(
            FailureKind::InvalidInput,
            format!("agent {:?}: {message}", spec.name),
        )
    };
    validate_token("agent name", &spec.name).map_err(|f| invalid(f.message))?;
    if spec.max_iterations == 0 || spec.max_iterations > MAX_ITERATIONS_CAP {
        return Err(invalid(format!(
            "max_iterations must be 1..={MAX_ITERATIONS_CAP}"
        )));
    }
    let names = spec.tools.iter().chain(spec.skills.iter().flatten());
    if let Some(bad) = names.into_iter().find(|n| {
        n.is_empty()
            || n.len() > 128
            || !n
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '*' | '.'))
    }) {
        return Err(invalid(format!(
            "{bad:?} is not a tool or skill name (letters, digits, _ - . and * patterns)"
        )));
    }
    if spec
        .context_tokens
        .is_some_and(|tokens| tokens < MIN_CONTEXT_TOKENS)
    {
        return Err(invalid(format!(
            "context_tokens must be at least {MIN_CONTEXT_TOKENS}"
        )));
    }
    if spec
        .max_parallel_steps
        .is_some_and(|n| n == 0 || n > MAX_PARALLEL_STEPS_CAP)
    {
        return Err(invalid(format!(
            "max_parallel_steps must be 1..={MAX_PARALLEL_STEPS_CAP}"
        )));
    }
    check_max_concurrency(spec.max_concurrency).map_err(invalid)?;
    if let Some(schema) = &spec.output_schema {
        schema
            .compile()
            .map_err(|e| invalid(format!("output_schema: {e}")))?;
    }
    if let Some(budget) = &spec.budget {
        budget.check().map_err(|f| invalid(f.message))?;
    }
    if !spec.subagents.is_empty() && nesting_left == 0 {
        return Err(invalid("its subagents nest deeper than allowed".into()));
    }
    spec.subagents
        .iter()
        .try_for_each(|child| check_spec(child, nesting_left.saturating_sub(1)))
}

/// `max_concurrency`, when set, lies in 1..=[`MAX_CONCURRENCY_CAP`].
fn check_max_concurrency(max: Option<u32>) -> Result<(), String> {
    match max {
        Some(n) if n == 0 || n > MAX_CONCURRENCY_CAP => {
            Err(format!("max_concurrency must be 1..={MAX_CONCURRENCY_CAP}"))
        }
        _ => Ok(()),
    }
}

/// The folder-wide permission rules file at the root of an agents folder.
pub const PERMISSIONS_FILE: &str = "permissions.toml";

/// Why a front matter may not hold approver rules.
const APPROVERS_IN_FRONT_MATTER: &str = "approver rules (self_approval, [[approvers]]) belong in \
     the folder's permissions.toml, not in an agent's front matter";

/// Deepest subagent nesting: a user's agent is depth 0, its subagents depth 1, theirs depth 2.
pub const MAX_NESTING: u32 = 2;

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
    /// A model name (`"gpt-4o"`, `"anthropic:claude-sonnet-4-5"`) or a `[model]` table with
    /// `provider` and `name`.
    #[serde(default)]
    model: ModelChoice,
    tools: Option<Vec<String>>,
    subagents: Option<Vec<String>>,
    max_iterations: Option<u32>,
    /// Skills the agent may load; absent allows all.
    skills: Option<Vec<String>>,
    /// The model's context size in tokens.
    context_tokens: Option<u64>,
    /// Models tried in order when `model` keeps failing.
    #[serde(default)]
    fallback_models: Vec<String>,
    #[serde(default)]
    permissions: PermissionsTable,
    /// The agent's default budget for a task (see [`AgentCatalog::budget`]).
    budget: Option<Budget>,
    /// Offers the plan tools.
    #[serde(default)]
    planning: bool,
    /// Most plan steps run at once.
    max_parallel_steps: Option<u32>,
    /// Most runs of this agent as a subagent at once across the cluster.
    max_concurrency: Option<u32>,
    /// The JSON Schema its answer must match: a file's path, or the schema as a table.
    output_schema: Option<toml::Value>,
    /// Read only to refuse it with [`APPROVERS_IN_FRONT_MATTER`].
    self_approval: Option<toml::Value>,
    /// Read only to refuse it with [`APPROVERS_IN_FRONT_MATTER`].
    approvers: Option<toml::Value>,
}

/// The `model` of a front matter: a name, or a table naming the provider apart.
#[derive(Debug, Default, Deserialize)]
#[serde(transparent)]
struct ModelChoice(Option<toml::Value>);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelTable {
    /// A provider of `SKEIN_PROVIDERS`; absent for the default provider.
    provider: Option<String>,
    name: String,
}

impl ModelChoice {
    /// The model's name as the runtime routes it (`provider:name`).
    fn into_name(self) -> Result<String, String> {
        match self.0 {
            None => Ok(String::new()),
            Some(toml::Value::String(name)) => Ok(name),
            Some(table @ toml::Value::Table(_)) => {
                let ModelTable { provider, name } = table
                    .try_into()
                    .map_err(|e: toml::de::Error| format!("[model]: {}", e.message()))?;
                if name.trim().is_empty() {
                    return Err("[model] has an empty name".into());
                }
                match provider {
                    None => Ok(name),
                    Some(provider) => {
                        validate_token("[model] provider", &provider).map_err(|f| f.message)?;
                        Ok(format!(
                            "{provider}{}{name}",
                            crate::agent::model::providers::PROVIDER_SEPARATOR
                        ))
                    }
                }
            }
            Some(other) => Err(format!(
                "model must be a name or a [model] table of provider and name, not {}",
                other.type_str()
            )),
        }
    }
}

/// A `[permissions]` table of a front matter, or the whole of `permissions.toml`: the keys of
/// [`PermissionPolicy`], plus `approval_timeout` as a humantime string (`"10m"`), plus the approver
/// rules that only `permissions.toml` may hold.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PermissionsTable {
    mode: Option<PermissionMode>,
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    ask: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
    approval_timeout_ms: Option<u64>,
    approval_timeout: Option<String>,
    /// `permissions.toml` only: whether a person may answer calls of tasks they submitted.
    self_approval: Option<bool>,
    /// `permissions.toml` only: who may answer which calls.
    #[serde(default)]
    approvers: Vec<ApproverEntry>,
}

impl PermissionsTable {
    /// The policy this table declares, once its timeout is read and every rule compiles. Approver
    /// rules are refused: [`parse_folder_permissions`] takes them out of the one table that may
    /// hold them before calling this.
    fn into_policy(self, path: &str) -> Result<PermissionPolicy, DefinitionError> {
        let invalid = |message: String| DefinitionError::Invalid {
            path: path.to_owned(),
            message,
        };
        if self.self_approval.is_some() || !self.approvers.is_empty() {
            return Err(invalid(format!("permissions: {APPROVERS_IN_FRONT_MATTER}")));
        }
        let approval_timeout_ms = match (self.approval_timeout_ms, self.approval_timeout) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "permissions: set approval_timeout or approval_timeout_ms, not both".into(),
                ))
            }
            (ms, None) => ms,
            (None, Some(text)) => {
                let duration = humantime::parse_duration(&text)
                    .map_err(|e| invalid(format!("permissions: approval_timeout {text:?}: {e}")))?;
                Some(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
            }
        };
        if approval_timeout_ms == Some(0) {
            return Err(invalid(
                "permissions: the approval timeout must be positive".into(),
            ));
        }
        let policy = PermissionPolicy {
            mode: self.mode,
            allow: self.allow,
            ask: self.ask,
            deny: self.deny,
            approval_timeout_ms,
        };
        CompiledPolicy::compile(&policy).map_err(|e| invalid(format!("permissions: {e}")))?;
        Ok(policy)
    }
}

/// All agents a lead can run, plus the skills catalog.
#[derive(Debug, Clone, Default)]
pub struct AgentCatalog {
    /// Shared with every turn that runs an agent as defined (no overrides).
    agents: BTreeMap<String, Arc<AgentSpec>>,
    skills: SkillCatalog,
    /// The `[budget]` of the agents that declare one.
    budgets: BTreeMap<String, Budget>,
    /// Who may answer which calls (`permissions.toml`).
    approvers: ApproverPolicy,
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
        Self::assemble(
            ("AGENTS.md".into(), BUNDLED_MAIN.into()),
            subagents,
            skills,
            &PermissionPolicy::default(),
            false,
        )
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
        let folder_file = dir.join(PERMISSIONS_FILE);
        let folder = if folder_file.is_file() {
            parse_folder_permissions(&folder_file.display().to_string(), &read(&folder_file)?)?
        } else {
            FolderPermissions::default()
        };
        let catalog = Self::assemble(main, subagents, skills, &folder.policy, true)?;
        Ok(Self {
            approvers: folder.approvers,
            ..catalog
        })
    }

    fn assemble(
        main: (String, String),
        subagents: Vec<(String, String)>,
        skills: SkillCatalog,
        folder_permissions: &PermissionPolicy,
        on_disk: bool,
    ) -> Result<Self, DefinitionError> {
        let shared = Shared {
            skills: &skills,
            folder_permissions,
            on_disk,
        };
        let mut agents = BTreeMap::new();
        let mut budgets = BTreeMap::new();
        let mut sub_names = Vec::new();
        let mut sub_lists = Vec::new();
        for (path, text) in &subagents {
            let (spec, subs) = parse(path, text, "", &shared)?;
            if let Some(budget) = declared_budget(path, text)? {
                budgets.insert(spec.name.clone(), budget);
            }
            sub_names.push(spec.name.clone());
            sub_lists.push((spec.name.clone(), subs.unwrap_or_default()));
            agents.insert(spec.name.clone(), spec);
        }
        let (main_spec, main_subs) = parse(&main.0, &main.1, "assistant", &shared)?;
        if let Some(budget) = declared_budget(&main.0, &main.1)? {
            budgets.insert(main_spec.name.clone(), budget);
        }
        sub_lists.push((main_spec.name.clone(), main_subs.unwrap_or(sub_names)));
        agents.insert(main_spec.name.clone(), main_spec);
        let sub_lists: BTreeMap<String, Vec<String>> = sub_lists.into_iter().collect();
        for (name, subs) in &sub_lists {
            if let Some(sub) = subs.iter().find(|sub| !agents.contains_key(*sub)) {
                return Err(DefinitionError::Invalid {
                    path: name.clone(),
                    message: format!("unknown subagent {sub:?}"),
                });
            }
        }
        // Every agent carries its subagents, theirs in turn, down to the deepest nesting a
        // turn may reach: specs stay finite even where definitions name each other.
        let agents = agents
            .keys()
            .filter_map(|name| {
                let spec = with_subagents(name, MAX_NESTING, &agents, &sub_lists)?;
                Some((name.clone(), Arc::new(spec)))
            })
            .collect();
        Ok(Self {
            agents,
            skills,
            budgets,
            approvers: ApproverPolicy::default(),
        })
    }

    /// The default budget agent `name` declares (`[budget]`), if any: a task's own budget is
    /// held to it (`TaskSubmission::budget_scope`). It applies when the agent runs a user's task;
    /// a subagent's calls draw from the budget of the task that spawned it.
    pub fn budget(&self, name: &str) -> Option<&Budget> {
        self.budgets.get(name)
    }

    /// Who may answer which calls that wait for a person: the folder's `permissions.toml`
    /// (`self_approval`, `[[approvers]]`), or the default (anyone who may approve, any call).
    pub fn approvers(&self) -> &ApproverPolicy {
        &self.approvers
    }

    /// Names of every agent, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.agents.keys().map(String::as_str)
    }

    /// The skills of the folder.
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
        if let Some(limits) = &o.permissions {
            spec.permissions = tighten(&spec.permissions, limits)?;
            for child in &mut spec.subagents {
                restrict_tree(child, limits);
            }
        }
        Ok(Arc::new(spec))
    }
}

/// `spec` answering in `schema` (a submission's own output schema, which replaces the agent's),
/// or `spec` as it is when the submission has none.
pub fn with_output_schema(spec: Arc<AgentSpec>, schema: Option<&OutputSchema>) -> Arc<AgentSpec> {
    match schema {
        Some(schema) if spec.output_schema.as_ref() != Some(schema) => {
            let mut spec = AgentSpec::clone(&spec);
            spec.output_schema = Some(schema.clone());
            Arc::new(spec)
        }
        _ => spec,
    }
}

/// Applies a task's (already accepted) tightening to a subagent and the subagents below it, so a
/// task cannot reach through a child what it refused itself.
fn restrict_tree(spec: &mut AgentSpec, limits: &PermissionPolicy) {
    spec.permissions = restrict(&spec.permissions, limits);
    for child in &mut spec.subagents {
        restrict_tree(child, limits);
    }
}

/// What every definition file of a folder is checked and merged against.
struct Shared<'a> {
    skills: &'a SkillCatalog,
    folder_permissions: &'a PermissionPolicy,
    /// The definitions' paths are files on disk, so an `output_schema` may name a file beside
    /// them (not in the bundled workspace).
    on_disk: bool,
}

/// What `permissions.toml` declares.
#[derive(Debug, Default)]
struct FolderPermissions {
    /// Merged into every agent of the folder.
    policy: PermissionPolicy,
    approvers: ApproverPolicy,
}

/// Parses `permissions.toml`: a `[permissions]` table's keys at the top level, plus
/// `self_approval` and `[[approvers]]`.
fn parse_folder_permissions(path: &str, text: &str) -> Result<FolderPermissions, DefinitionError> {
    let mut table: PermissionsTable =
        toml::from_str(text).map_err(|e| DefinitionError::Invalid {
            path: path.to_owned(),
            message: format!("bad TOML: {e}"),
        })?;
    let entries = std::mem::take(&mut table.approvers);
    let approvers = ApproverPolicy::compile(table.self_approval.take(), &entries).map_err(|e| {
        DefinitionError::Invalid {
            path: path.to_owned(),
            message: e.to_string(),
        }
    })?;
    Ok(FolderPermissions {
        policy: table.into_policy(path)?,
        approvers,
    })
}

/// Parses one definition file; returns the spec and its declared subagent names (if any).
fn parse(
    path: &str,
    text: &str,
    default_name: &str,
    shared: &Shared<'_>,
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
    if let Some(unknown) = front
        .skills
        .iter()
        .flatten()
        .find(|s| shared.skills.get(s).is_none())
    {
        let known: Vec<_> = shared.skills.names().collect();
        return Err(invalid(format!(
            "unknown skill {unknown:?}; known skills: {}",
            known.join(", ")
        )));
    }
    if front
        .context_tokens
        .is_some_and(|tokens| tokens < MIN_CONTEXT_TOKENS)
    {
        return Err(invalid(format!(
            "context_tokens must be at least {MIN_CONTEXT_TOKENS}"
        )));
    }
    if let Some(bad) = front.fallback_models.iter().find(|m| m.trim().is_empty()) {
        return Err(invalid(format!(
            "fallback_models has an empty name: {bad:?}"
        )));
    }
    if front
        .max_parallel_steps
        .is_some_and(|n| n == 0 || n > MAX_PARALLEL_STEPS_CAP)
    {
        return Err(invalid(format!(
            "max_parallel_steps must be 1..={MAX_PARALLEL_STEPS_CAP}"
        )));
    }
    check_max_concurrency(front.max_concurrency).map_err(invalid)?;
    if front.self_approval.is_some() || front.approvers.is_some() {
        return Err(invalid(APPROVERS_IN_FRONT_MATTER.into()));
    }
    let model = front.model.into_name().map_err(invalid)?;
    let own = front.permissions.into_policy(path)?;
    let output_schema = front
        .output_schema
        .map(|declared| output_schema(path, declared, shared.on_disk))
        .transpose()?;
    let spec = AgentSpec {
        name,
        description: front.description,
        system_prompt: body.trim().to_owned(),
        model,
        tools: front.tools.unwrap_or_else(|| vec!["*".into()]),
        subagents: Vec::new(),
        max_iterations,
        permissions: merge(shared.folder_permissions, &own),
        skills: front.skills,
        context_tokens: front.context_tokens,
        fallback_models: front.fallback_models,
        planning: front.planning,
        max_parallel_steps: front.max_parallel_steps,
        max_concurrency: front.max_concurrency,
        budget: front.budget.filter(|b| !b.is_empty()),
        output_schema,
    };
    Ok((spec, front.subagents))
}

/// The output schema a front matter declares (a file's path, or a table), checked.
fn output_schema(
    path: &str,
    declared: toml::Value,
    on_disk: bool,
) -> Result<OutputSchema, DefinitionError> {
    let invalid = |message: String| DefinitionError::Invalid {
        path: path.to_owned(),
        message: format!("output_schema: {message}"),
    };
    let schema = match declared {
        toml::Value::String(file) => {
            if !on_disk {
                return Err(invalid(format!(
                    "{file:?} names a file, which only an agents folder can hold"
                )));
            }
            let file = Path::new(path)
                .parent()
                .unwrap_or_else(|| Path::new("."))
                .join(file);
            let text = std::fs::read_to_string(&file).map_err(|source| DefinitionError::Read {
                path: file.display().to_string(),
                source,
            })?;
            serde_json::from_str(&text)
                .map_err(|e| invalid(format!("{} is not JSON: {e}", file.display())))?
        }
        table @ toml::Value::Table(_) => serde_json::to_value(table)
            .map_err(|e| invalid(format!("the table is not a JSON Schema: {e}")))?,
        other => {
            return Err(invalid(format!(
                "must be a file's path or a table, not a value of type {}",
                other.type_str()
            )))
        }
    };
    let schema = OutputSchema::new(schema);
    schema.compile().map_err(invalid)?;
    Ok(schema)
}

/// The `[budget]` table of a definition file's front matter (`max_total_tokens`,
/// `max_cost_usd`), checked.
fn declared_budget(path: &str, text: &str) -> Result<Option<Budget>, DefinitionError> {
    let Some(front) = split_front_matter(text).0 else {
        return Ok(None);
    };
    let front: FrontMatter = toml::from_str(front).map_err(|e| DefinitionError::FrontMatter {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    let Some(budget) = front.budget.filter(|b| !b.is_empty()) else {
        return Ok(None);
    };
    budget.check().map_err(|f| DefinitionError::Invalid {
        path: path.to_owned(),
        message: f.message,
    })?;
    Ok(Some(budget))
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

/// The spec named `name` with its subagents resolved `levels` deep (none below that); every
/// name was checked to be defined.
fn with_subagents(
    name: &str,
    levels: u32,
    agents: &BTreeMap<String, AgentSpec>,
    sub_lists: &BTreeMap<String, Vec<String>>,
) -> Option<AgentSpec> {
    let mut spec = agents.get(name)?.clone();
    spec.subagents = match (levels, sub_lists.get(name)) {
        (0, _) | (_, None) => Vec::new(),
        (_, Some(subs)) => subs
            .iter()
            .filter_map(|sub| with_subagents(sub, levels - 1, agents, sub_lists))
            .collect(),
    };
    Some(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_skills() -> SkillCatalog {
        SkillCatalog::default()
    }

    fn notes_skill() -> SkillCatalog {
        SkillCatalog::from_documents([(
            "notes".to_string(),
            "+++\ndescription = \"keep notes\"\n+++\nWrite them down.".to_string(),
        )])
        .expect("valid skill")
    }

    fn parse_alone(
        path: &str,
        text: &str,
        skills: &SkillCatalog,
    ) -> Result<(AgentSpec, Option<Vec<String>>), DefinitionError> {
        let folder_permissions = PermissionPolicy::default();
        let shared = Shared {
            skills,
            folder_permissions: &folder_permissions,
            on_disk: false,
        };
        parse(path, text, "", &shared)
    }

    /// A folder under the system temp dir, removed when dropped.
    struct TempFolder(std::path::PathBuf);

    impl TempFolder {
        fn new(label: &str) -> Self {
            let dir = std::env::temp_dir()
                .join(format!("skein-definition-{label}-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(dir.join("subagents")).expect("create temp folder");
            Self(dir)
        }

        fn write(&self, relative: &str, text: &str) {
            let path = self.0.join(relative);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).expect("create parent");
            }
            std::fs::write(path, text).expect("write file");
        }
    }

    impl Drop for TempFolder {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_model_table_names_its_provider_and_a_string_is_taken_whole() {
        let skills = no_skills();
        let (spec, _) = parse_alone(
            "a.md",
            "+++\n[model]\nprovider = \"claude\"\nname = \"claude-sonnet-4-5\"\n+++\nHi.",
            &skills,
        )
        .expect("a model table");
        assert_eq!(spec.model, "claude:claude-sonnet-4-5");
        let (spec, _) = parse_alone("a.md", "+++\nmodel = \"llama3:8b\"\n+++\nHi.", &skills)
            .expect("a model name");
        assert_eq!(spec.model, "llama3:8b");
        let (spec, _) = parse_alone("a.md", "+++\n[model]\nname = \"gpt-4o\"\n+++\nHi.", &skills)
            .expect("a table without a provider");
        assert_eq!(spec.model, "gpt-4o");
        for (text, expected) in [
            (
                "+++\n[model]\nprovider = \"a:b\"\nname = \"m\"\n+++\nHi.",
                "provider",
            ),
            (
                "+++\n[model]\nprovider = \"a\"\nname = \" \"\n+++\nHi.",
                "empty name",
            ),
            (
                "+++\n[model]\nname = \"m\"\nfallback_models = []\n+++\nHi.",
                "unknown field `fallback_models`",
            ),
            ("+++\nmodel = 4\n+++\nHi.", "not integer"),
        ] {
            let error = parse_alone("a.md", text, &skills).expect_err(text);
            assert!(error.to_string().contains(expected), "{text}: {error}");
        }
    }

    #[test]
    fn bundled_workspace_loads_with_its_subagent() {
        let catalog = AgentCatalog::bundled().expect("bundled workspace is valid");
        let main = catalog.resolve("assistant", None).expect("main agent");
        assert!(main.subagents.iter().any(|s| s.name == "researcher"));
        assert!(!main.system_prompt.is_empty());
        assert!(catalog.resolve("researcher", None).is_ok());
    }

    #[test]
    fn subagents_nest_to_the_deepest_allowed_level_even_when_they_name_each_other() {
        let folder = TempFolder::new("nesting");
        folder.write("AGENTS.md", "+++\nsubagents = [\"planner\"]\n+++\nLead.");
        folder.write(
            "subagents/planner.md",
            "+++\nsubagents = [\"researcher\"]\n+++\nPlan.",
        );
        folder.write(
            "subagents/researcher.md",
            "+++\nsubagents = [\"planner\"]\n+++\nResearch.",
        );
        let catalog = AgentCatalog::load_dir(&folder.0).expect("folder loads");
        let main = catalog.resolve("assistant", None).expect("main agent");
        let planner = &main.subagents[0];
        assert_eq!(planner.name, "planner");
        let researcher = &planner.subagents[0];
        assert_eq!(researcher.name, "researcher", "depth 2 is resolved");
        assert!(
            researcher.subagents.is_empty(),
            "nothing below the deepest level: {researcher:?}"
        );
        check_spec(&main, MAX_NESTING).expect("the resolved spec passes the worker's check");
        let unknown = TempFolder::new("nesting-unknown");
        unknown.write("AGENTS.md", "+++\nsubagents = [\"ghost\"]\n+++\nLead.");
        let err = AgentCatalog::load_dir(&unknown.0).expect_err("unknown subagent");
        assert!(err.to_string().contains("ghost"), "{err}");
    }

    #[test]
    fn a_spec_in_a_message_holds_its_context_size_to_what_a_definition_may_declare() {
        let catalog = AgentCatalog::bundled().expect("bundled workspace is valid");
        let mut main = AgentSpec::clone(&catalog.resolve("assistant", None).expect("main agent"));
        main.context_tokens = Some(MIN_CONTEXT_TOKENS);
        check_spec(&main, MAX_NESTING).expect("the smallest allowed context passes");
        main.subagents[0].context_tokens = Some(0);
        let refused = check_spec(&main, MAX_NESTING).expect_err("a subagent's context of 0");
        assert_eq!(refused.kind, FailureKind::InvalidInput);
        assert!(refused.message.contains("context_tokens"), "{refused:?}");
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
            permissions: None,
        };
        let spec = catalog.resolve("assistant", Some(&o)).expect("resolves");
        assert_eq!(spec.system_prompt, "be brief");
        assert_eq!(spec.tools, ["read_file"]);
        assert_eq!(spec.max_iterations, 2);
        assert_eq!(spec.model, "m");
    }

    #[test]
    fn front_matter_is_parsed_and_errors_name_the_file() {
        let (spec, subs) = parse_alone(
            "x/helper.md",
            "+++\ndescription = \"d\"\ntools = [\"a\"]\nsubagents = []\n+++\nYou help.",
            &no_skills(),
        )
        .expect("parses");
        assert_eq!(spec.name, "helper");
        assert_eq!(spec.tools, ["a"]);
        assert_eq!(spec.system_prompt, "You help.");
        assert_eq!(subs, Some(vec![]));
        assert_eq!(spec.permissions, PermissionPolicy::default());
        assert_eq!(spec.skills, None);
        let err = parse_alone("x/bad.md", "+++\nnope = 1\n+++\nhi", &no_skills())
            .expect_err("unknown field");
        assert!(err.to_string().contains("x/bad.md"));
    }

    #[test]
    fn max_concurrency_is_read_and_held_to_its_range() {
        let (spec, _) = parse_alone(
            "x/solo.md",
            "+++\nmax_concurrency = 3\n+++\nAlone.",
            &no_skills(),
        )
        .expect("parses");
        assert_eq!(spec.max_concurrency, Some(3));
        check_spec(&spec, 0).expect("a cap in range passes the worker's check");
        for bad in ["0", "10001"] {
            let text = format!("+++\nmax_concurrency = {bad}\n+++\nAlone.");
            let err = parse_alone("x/solo.md", &text, &no_skills()).expect_err("out of range");
            assert!(err.to_string().contains("max_concurrency"), "{err}");
        }
        let mut forged = spec;
        forged.max_concurrency = Some(0);
        let refused = check_spec(&forged, 0).expect_err("a cap of 0 in a message");
        assert!(refused.message.contains("max_concurrency"), "{refused:?}");
        let (unset, _) = parse_alone("x/free.md", "+++\n+++\nFree.", &no_skills()).expect("parses");
        assert_eq!(unset.max_concurrency, None);
        assert!(!serde_json::to_string(&unset)
            .expect("encodes")
            .contains("max_concurrency"));
    }

    #[test]
    fn front_matter_permissions_are_parsed() {
        let text =
            "+++\n[permissions]\nmode = \"accept_edits\"\nallow = [\"write_file(notes/**)\"]\n\
                    ask = [\"shell\"]\ndeny = [\"http_fetch(http://**)\"]\n\
                    approval_timeout = \"10m\"\n+++\nYou help.";
        let (spec, _) = parse_alone("x/helper.md", text, &no_skills()).expect("parses");
        assert_eq!(
            spec.permissions,
            PermissionPolicy {
                mode: Some(PermissionMode::AcceptEdits),
                allow: vec!["write_file(notes/**)".into()],
                ask: vec!["shell".into()],
                deny: vec!["http_fetch(http://**)".into()],
                approval_timeout_ms: Some(600_000),
            }
        );
        let ms = "+++\n[permissions]\napproval_timeout_ms = 2500\n+++\nhi";
        let (spec, _) = parse_alone("x/ms.md", ms, &no_skills()).expect("parses");
        assert_eq!(spec.permissions.approval_timeout_ms, Some(2500));
        for bad in [
            "+++\n[permissions]\napproval_timeout_ms = 1\napproval_timeout = \"1s\"\n+++\nhi",
            "+++\n[permissions]\napproval_timeout = \"soon\"\n+++\nhi",
            "+++\n[permissions]\napproval_timeout_ms = 0\n+++\nhi",
            "+++\n[permissions]\nmode = \"lenient\"\n+++\nhi",
        ] {
            let err = parse_alone("x/timeout.md", bad, &no_skills()).expect_err(bad);
            assert!(err.to_string().contains("x/timeout.md"), "{err}");
        }
    }

    #[test]
    fn a_bad_rule_names_its_file_and_itself() {
        let text = "+++\n[permissions]\ndeny = [\"write_file(notes/**\"]\n+++\nhi";
        let err = parse_alone("x/careless.md", text, &no_skills()).expect_err("bad rule");
        assert!(matches!(err, DefinitionError::Invalid { .. }), "{err}");
        let message = err.to_string();
        assert!(message.contains("x/careless.md"), "{message}");
        assert!(message.contains("\"write_file(notes/**\""), "{message}");
    }

    #[test]
    fn skills_are_listed_and_must_exist() {
        let text = "+++\nskills = [\"notes\"]\n+++\nhi";
        let (spec, _) = parse_alone("x/writer.md", text, &notes_skill()).expect("known skill");
        assert_eq!(spec.skills, Some(vec!["notes".to_string()]));
        let text = "+++\nskills = [\"notes\", \"cooking\"]\n+++\nhi";
        let err = parse_alone("x/writer.md", text, &notes_skill()).expect_err("unknown skill");
        let message = err.to_string();
        assert!(message.contains("x/writer.md"), "{message}");
        assert!(message.contains("\"cooking\""), "{message}");
        let (spec, _) = parse_alone("x/all.md", "hi", &notes_skill()).expect("no list");
        assert_eq!(spec.skills, None);
    }

    #[test]
    fn folder_permissions_are_merged_into_every_agent() {
        let folder = TempFolder::new("merge");
        folder.write(
            PERMISSIONS_FILE,
            "mode = \"dont_ask\"\ndeny = [\"write_file(secrets/**)\"]\napproval_timeout = \"30s\"\n",
        );
        folder.write(
            "AGENTS.md",
            "+++\nname = \"lead\"\nskills = [\"notes\"]\n[permissions]\nmode = \"accept_edits\"\n\
             deny = [\"shell\"]\n+++\nYou lead.",
        );
        folder.write("subagents/helper.md", "You help.");
        folder.write(
            "skills/notes/SKILL.md",
            "+++\ndescription = \"keep notes\"\n+++\nWrite them down.",
        );
        let catalog = AgentCatalog::load_dir(&folder.0).expect("folder loads");
        let lead = catalog.resolve("lead", None).expect("lead");
        assert_eq!(lead.permissions.mode, Some(PermissionMode::AcceptEdits));
        assert_eq!(lead.permissions.deny, ["write_file(secrets/**)", "shell"]);
        assert_eq!(lead.permissions.approval_timeout_ms, Some(30_000));
        assert_eq!(lead.skills, Some(vec!["notes".to_string()]));
        let helper = catalog.resolve("helper", None).expect("helper");
        assert_eq!(helper.permissions.mode, Some(PermissionMode::DontAsk));
        assert_eq!(helper.permissions.deny, ["write_file(secrets/**)"]);
        assert_eq!(lead.subagents[0].permissions, helper.permissions);

        folder.write(PERMISSIONS_FILE, "ask = [\"shell(\"]\n");
        let err = AgentCatalog::load_dir(&folder.0).expect_err("bad folder rule");
        let message = err.to_string();
        assert!(message.contains(PERMISSIONS_FILE), "{message}");
        assert!(message.contains("\"shell(\""), "{message}");
        folder.write(PERMISSIONS_FILE, "allow = [\"read_file\"]\nunknown = 1\n");
        let err = AgentCatalog::load_dir(&folder.0).expect_err("unknown key");
        assert!(err.to_string().contains(PERMISSIONS_FILE), "{err}");
    }

    #[test]
    fn folder_approver_rules_load_into_the_catalog() {
        use crate::principals::{Principal, Role};

        let bundled = AgentCatalog::bundled().expect("bundled workspace is valid");
        assert!(bundled.approvers().self_approval());
        assert!(bundled.approvers().rules().is_empty());

        let folder = TempFolder::new("approvers");
        folder.write("AGENTS.md", "You lead.");
        let plain = AgentCatalog::load_dir(&folder.0).expect("folder without permissions.toml");
        assert!(plain.approvers().self_approval());
        assert!(plain.approvers().rules().is_empty());

        folder.write(
            PERMISSIONS_FILE,
            "allow = [\"read_file\"]\nself_approval = false\n\n\
             [[approvers]]\ncalls = \"shell(rm *)\"\nby = [\"olga\", \"role:operate\"]\n\
             tenant = \"acme\"\n\n\
             [[approvers]]\ncalls = \"*\"\nby = [\"role:approve\"]\n",
        );
        let catalog = AgentCatalog::load_dir(&folder.0).expect("folder loads");
        let approvers = catalog.approvers();
        assert!(!approvers.self_approval());
        let rules = approvers.rules();
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0].calls().text(), "shell(rm *)");
        assert_eq!(rules[0].tenant(), Some("acme"));
        assert_eq!(rules[1].tenant(), None);
        let lead = catalog.resolve("assistant", None).expect("main agent");
        assert_eq!(
            lead.permissions.allow,
            ["read_file"],
            "the policy keys still apply"
        );

        let bob = Principal {
            name: "bob".into(),
            tenant: "acme".into(),
            roles: vec![Role::Approve],
        };
        let rm = serde_json::json!({"command": "rm -rf build"});
        let refused = approvers
            .may_answer("acme", &bob, "sam", "shell", &rm)
            .expect_err("rule 1 wants olga or an operator");
        assert!(refused.contains("approver rule 1"), "{refused}");
        assert_eq!(
            approvers.may_answer("globex", &bob, "sam", "shell", &rm),
            Ok(())
        );
        let own = approvers
            .may_answer("globex", &bob, "bob", "shell", &rm)
            .expect_err("self_approval = false");
        assert!(own.contains("self_approval = false"), "{own}");
    }

    #[test]
    fn a_bad_approver_rule_names_permissions_toml_and_its_number() {
        let folder = TempFolder::new("approvers-bad");
        folder.write("AGENTS.md", "You lead.");
        for (bad, needle) in [
            ("calls = \"shell(\"\nby = [\"olga\"]", "\"shell(\""),
            ("calls = \"shell\"\nby = []", "by is empty"),
            ("calls = \"shell\"\nby = [\"role:root\"]", "\"role:root\""),
            (
                "calls = \"shell\"\nby = [\"olga\"]\ntenant = \"a b\"",
                "tenant",
            ),
            ("calls = \"shell\"\nby = [\"olga\"]\nwho = 1", "who"),
        ] {
            let text = format!(
                "[[approvers]]\ncalls = \"*\"\nby = [\"role:approve\"]\n\n[[approvers]]\n{bad}\n"
            );
            folder.write(PERMISSIONS_FILE, &text);
            let message = AgentCatalog::load_dir(&folder.0)
                .expect_err(bad)
                .to_string();
            assert!(message.contains(PERMISSIONS_FILE), "{message}");
            assert!(message.contains(needle), "{message}");
            if needle != "who" {
                assert!(message.contains("approver rule 2"), "{message}");
            }
        }
    }

    #[test]
    fn approver_rules_in_a_front_matter_are_refused() {
        for text in [
            "+++\n[permissions]\nself_approval = false\n+++\nhi",
            "+++\n[[permissions.approvers]]\ncalls = \"*\"\nby = [\"olga\"]\n+++\nhi",
            "+++\nself_approval = false\n+++\nhi",
            "+++\n[[approvers]]\ncalls = \"*\"\nby = [\"olga\"]\n+++\nhi",
        ] {
            let err = parse_alone("x/eager.md", text, &no_skills()).expect_err(text);
            let message = err.to_string();
            assert!(message.contains("x/eager.md"), "{message}");
            assert!(
                message.contains("belong in the folder's permissions.toml"),
                "{message}"
            );
        }
    }

    #[test]
    fn overrides_tighten_permissions_and_refuse_loosening() {
        let folder = TempFolder::new("tighten");
        folder.write(
            "AGENTS.md",
            "+++\nname = \"lead\"\n[permissions]\nmode = \"default\"\nallow = [\"read_file\"]\n\
             approval_timeout_ms = 60000\n+++\nYou lead.",
        );
        folder.write(
            "subagents/helper.md",
            "+++\n[permissions]\nmode = \"bypass\"\n+++\nYou help.",
        );
        let catalog = AgentCatalog::load_dir(&folder.0).expect("folder loads");
        let tighter = AgentOverrides {
            permissions: Some(PermissionPolicy {
                mode: Some(PermissionMode::ReadOnly),
                deny: vec!["http_fetch".into()],
                approval_timeout_ms: Some(5_000),
                ..PermissionPolicy::default()
            }),
            ..Default::default()
        };
        let spec = catalog.resolve("lead", Some(&tighter)).expect("tightens");
        assert_eq!(spec.permissions.mode, Some(PermissionMode::ReadOnly));
        assert_eq!(spec.permissions.allow, ["read_file"]);
        assert_eq!(spec.permissions.deny, ["http_fetch"]);
        assert_eq!(spec.permissions.approval_timeout_ms, Some(5_000));
        // The subagents it may spawn are held to the same limits.
        let helper = &spec.subagents[0];
        assert_eq!(helper.permissions.mode, Some(PermissionMode::ReadOnly));
        assert_eq!(helper.permissions.deny, ["http_fetch"]);
        // The defined agent is unchanged.
        let defined = catalog.resolve("lead", None).expect("as defined");
        assert_eq!(defined.permissions.mode, Some(PermissionMode::Default));

        for (looser, needle) in [
            (
                PermissionPolicy {
                    mode: Some(PermissionMode::Bypass),
                    ..PermissionPolicy::default()
                },
                "from default to bypass",
            ),
            (
                PermissionPolicy {
                    allow: vec!["shell".into()],
                    ..PermissionPolicy::default()
                },
                "cannot add allow rules",
            ),
            (
                PermissionPolicy {
                    ask: vec!["shell(".into()],
                    ..PermissionPolicy::default()
                },
                "\"shell(\"",
            ),
        ] {
            let o = AgentOverrides {
                permissions: Some(looser),
                ..Default::default()
            };
            let err = catalog.resolve("lead", Some(&o)).expect_err(needle);
            assert_eq!(err.kind, FailureKind::InvalidInput);
            assert!(err.message.contains(needle), "{}", err.message);
        }
    }

    #[test]
    fn an_agent_may_declare_a_default_budget() {
        let main = (
            "AGENTS.md".to_string(),
            "+++\n[budget]\nmax_total_tokens = 5000\nmax_cost_usd = 2\n+++\nHello".to_string(),
        );
        let sub = ("subagents/r.md".to_string(), "Research.".to_string());
        let catalog = AgentCatalog::assemble(
            main,
            vec![sub],
            no_skills(),
            &PermissionPolicy::default(),
            false,
        )
        .expect("valid definitions");
        assert_eq!(
            catalog.budget("assistant"),
            Some(&Budget {
                max_total_tokens: Some(5000),
                max_cost_usd: Some(2.0),
            })
        );
        assert_eq!(catalog.budget("r"), None);

        for (text, error) in [
            (
                "+++\n[budget]\nmax_total_tokens = 0\n+++\nHi",
                "max_total_tokens",
            ),
            (
                "+++\n[budget]\nmax_cost_usd = -1.5\n+++\nHi",
                "max_cost_usd",
            ),
            ("+++\n[budget]\ntokens = 10\n+++\nHi", "tokens"),
        ] {
            let main = ("AGENTS.md".to_string(), text.to_string());
            let refused = AgentCatalog::assemble(
                main,
                Vec::new(),
                no_skills(),
                &PermissionPolicy::default(),
                false,
            )
            .expect_err(text);
            assert!(refused.to_string().contains(error), "{refused}");
        }
    }

    #[test]
    fn an_output_schema_is_a_table_or_a_file_beside_the_definition() {
        let table = "+++\n[output_schema]\ntype = \"object\"\nrequired = [\"city\"]\n\
                     [output_schema.properties.city]\ntype = \"string\"\n+++\nAnswer in JSON.";
        let (spec, _) = parse_alone("x/geo.md", table, &no_skills()).expect("parses");
        let schema = spec.output_schema.clone().expect("declared");
        assert_eq!(schema.name, "answer");
        assert_eq!(
            schema.schema,
            serde_json::json!({
                "type": "object",
                "required": ["city"],
                "properties": {"city": {"type": "string"}},
            })
        );
        check_spec(&spec, 0).expect("a worker takes it");

        let folder = TempFolder::new("output-schema");
        folder.write(
            "subagents/schemas/answer.json",
            r#"{"type": "object", "properties": {"n": {"type": "integer"}}}"#,
        );
        folder.write(
            "subagents/counter.md",
            "+++\noutput_schema = \"schemas/answer.json\"\n+++\nCount.",
        );
        folder.write("AGENTS.md", "You lead.");
        let catalog = AgentCatalog::load_dir(&folder.0).expect("folder loads");
        let counter = catalog.resolve("counter", None).expect("counter");
        assert_eq!(
            counter
                .output_schema
                .as_ref()
                .map(|s| s.schema["properties"]["n"]["type"].clone()),
            Some(serde_json::json!("integer"))
        );
        let lead = catalog.resolve("assistant", None).expect("main agent");
        assert!(lead.output_schema.is_none());
        assert_eq!(
            lead.subagents[0].output_schema, counter.output_schema,
            "the spec a worker gets carries it"
        );

        // A submission's own schema replaces the agent's; none leaves it.
        let own = OutputSchema::new(serde_json::json!({"type": "object"}));
        let replaced = with_output_schema(counter.clone(), Some(&own));
        assert_eq!(replaced.output_schema.as_ref(), Some(&own));
        assert!(Arc::ptr_eq(
            &with_output_schema(counter.clone(), None),
            &counter
        ));

        // What cannot be checked, or read, is refused naming the file.
        folder.write(
            "subagents/schemas/answer.json",
            r#"{"type": "object", "properties": {"n": {"type": "integer", "format": "int32", "if": {}}}}"#,
        );
        let message = AgentCatalog::load_dir(&folder.0)
            .expect_err("unknown keyword")
            .to_string();
        assert!(message.contains("counter.md"), "{message}");
        assert!(
            message.contains("output_schema: at #/properties/n/if"),
            "{message}"
        );
        folder.write("subagents/schemas/answer.json", "{not json");
        let message = AgentCatalog::load_dir(&folder.0)
            .expect_err("not JSON")
            .to_string();
        assert!(message.contains("is not JSON"), "{message}");
        folder.write(
            "subagents/counter.md",
            "+++\noutput_schema = \"schemas/missing.json\"\n+++\nCount.",
        );
        let message = AgentCatalog::load_dir(&folder.0)
            .expect_err("no file")
            .to_string();
        assert!(message.contains("missing.json"), "{message}");

        for (text, needle) in [
            (
                "+++\noutput_schema = \"a.json\"\n+++\nhi",
                "only an agents folder",
            ),
            (
                "+++\noutput_schema = 3\n+++\nhi",
                "not a value of type integer",
            ),
            (
                "+++\n[output_schema]\ntype = \"array\"\n+++\nhi",
                "root must be an object",
            ),
        ] {
            let message = parse_alone("x/bad.md", text, &no_skills())
                .expect_err(text)
                .to_string();
            assert!(message.contains("x/bad.md"), "{message}");
            assert!(message.contains(needle), "{message}");
        }

        let mut forged = spec;
        forged.output_schema = Some(OutputSchema::new(
            serde_json::json!({"type": "object", "$ref": "#"}),
        ));
        let refused = check_spec(&forged, 0).expect_err("a looping schema in a message");
        assert!(refused.message.contains("output_schema"), "{refused:?}");
    }
}
