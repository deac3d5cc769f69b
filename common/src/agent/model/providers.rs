//! Several model providers in one process: the default one `SKEIN_MODEL_*` configures and the
//! named ones of the file `SKEIN_PROVIDERS` names, chosen per call by the model's name.
//!
//! A model name `NAME:MODEL` whose `NAME` is a provider of the file is `MODEL` on that provider
//! (`anthropic:claude-sonnet-4-5`); any other name is a model of the default provider, colons and
//! all (`llama3:8b` on an Ollama server). Agents pick a provider this way in `model` and
//! `fallback_models`, so fallbacks may cross providers. Traffic limits and budgets see the whole
//! name, so each provider's models are limited and priced on their own.
//!
//! ```toml
//! default = "openai"            # optional: the provider of names without a prefix
//!
//! [providers.anthropic]
//! kind = "anthropic"            # openai | azure | anthropic | scripted
//! api_key_env = "ANTHROPIC_API_KEY"
//! headers = { "anthropic-beta" = "token-efficient-tools-2025-02-19" }
//! max_output_tokens = 8192
//! limits = { max_concurrency = 8, tokens_per_minute = 400000 }
//!
//! [providers.azure]
//! kind = "azure"
//! base_url = "https://acme.openai.azure.com"
//! api_key_file = "/run/secrets/azure-openai-key"
//! ```
//!
//! The same document may be JSON. Keys come from an environment variable or a file, never from
//! the file itself; unknown keys are refused, so a misspelt setting fails at start.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::stream::BoxStream;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;

use super::{ModelChunk, ModelClient, ModelError, ModelRequest, ModelResponse, Provider};
use crate::agent::middleware::TrafficLimits;
use crate::config::ModelConfig;

/// What separates a provider's name from its model's in a model name.
pub const PROVIDER_SEPARATOR: char = ':';

/// The providers a process may call: the default one and the named ones.
#[derive(Clone)]
pub struct Providers {
    default: Provider,
    named: Arc<BTreeMap<String, Provider>>,
}

impl std::fmt::Debug for Providers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Providers")
            .field("default", &self.default.label())
            .field("named", &self.named.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl From<Provider> for Providers {
    fn from(default: Provider) -> Self {
        Self {
            default,
            named: Arc::default(),
        }
    }
}

impl Providers {
    /// The default provider of `cfg` and the named ones of its providers file, if any.
    pub fn from_config(cfg: &ModelConfig) -> Result<Self, ModelError> {
        let Some(path) = &cfg.providers_file else {
            return Provider::from_config(cfg).map(Self::from);
        };
        let file = ProvidersFile::read(path).map_err(ModelError::Misconfigured)?;
        let named = file
            .providers
            .iter()
            .map(|(name, entry)| {
                let provider = entry.build(cfg).map_err(|error| {
                    ModelError::Misconfigured(format!(
                        "provider {name:?} of {}: {error}",
                        path.display()
                    ))
                })?;
                Ok((name.clone(), provider))
            })
            .collect::<Result<BTreeMap<_, _>, ModelError>>()?;
        let default = match &file.default {
            Some(name) => named[name].clone(),
            None => Provider::from_config(cfg)?,
        };
        Ok(Self {
            default,
            named: Arc::new(named),
        })
    }

    /// The provider a call of `model` goes to, and the model's name as that provider knows it.
    pub fn route<'m>(&self, model: &'m str) -> (&Provider, &'m str) {
        match split_model(model) {
            Some((name, bare)) => match self.named.get(name) {
                Some(provider) => (provider, bare),
                None => (&self.default, model),
            },
            None => (&self.default, model),
        }
    }

    /// The label of the provider a call of `model` goes to (`openai`, `anthropic`, ...).
    pub fn label_for(&self, model: &str) -> &'static str {
        self.route(model).0.label()
    }

    /// The label of the default provider.
    pub fn default_label(&self) -> &'static str {
        self.default.label()
    }

    /// Each named provider with its label, for telemetry.
    pub fn labels(&self) -> BTreeMap<String, &'static str> {
        self.named
            .iter()
            .map(|(name, provider)| (name.clone(), provider.label()))
            .collect()
    }
}

/// `NAME:MODEL` split at its first separator, when `NAME` could be a provider's name.
fn split_model(model: &str) -> Option<(&str, &str)> {
    let (name, bare) = model.split_once(PROVIDER_SEPARATOR)?;
    (is_provider_name(name) && !bare.is_empty()).then_some((name, bare))
}

fn is_provider_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= crate::protocol::MAX_TOKEN_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl ModelClient for Providers {
    async fn complete(&self, mut request: ModelRequest) -> Result<ModelResponse, ModelError> {
        let (provider, bare) = self.route(&request.model);
        if bare.len() != request.model.len() {
            request.model = bare.to_owned();
        }
        provider.complete(request).await
    }

    async fn stream(
        &self,
        mut request: ModelRequest,
    ) -> Result<BoxStream<'static, Result<ModelChunk, ModelError>>, ModelError> {
        let (provider, bare) = self.route(&request.model);
        if bare.len() != request.model.len() {
            request.model = bare.to_owned();
        }
        provider.stream(request).await
    }
}

/// The providers file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProvidersFile {
    /// The provider of model names without a prefix; absent for the `SKEIN_MODEL_*` one.
    #[serde(default)]
    pub default: Option<String>,
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderEntry>,
}

/// One named provider.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderEntry {
    /// `openai` (any OpenAI-compatible server), `azure`, `anthropic` or `scripted`.
    pub kind: String,
    /// The API's base URL; absent for the kind's own (OpenAI's, Anthropic's).
    #[serde(default)]
    pub base_url: Option<String>,
    /// The environment variable holding the API key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// The file holding the API key.
    #[serde(default)]
    pub api_key_file: Option<PathBuf>,
    /// Azure OpenAI's `api-version`.
    #[serde(default)]
    pub api_version: Option<String>,
    /// `auto`, `max_tokens` or `max_completion_tokens` (OpenAI-compatible kinds).
    #[serde(default)]
    pub max_tokens_field: Option<String>,
    /// Headers sent with every request (an `anthropic-beta`, an `OpenAI-Organization`, a
    /// gateway's routing header).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Longest a call may take (`"90s"`); absent for `SKEIN_MODEL_TIMEOUT`.
    #[serde(default)]
    pub timeout: Option<String>,
    /// The answer bound when no budget sets one (Anthropic's API needs one).
    #[serde(default)]
    pub max_output_tokens: Option<u64>,
    /// Tokens an `anthropic` provider's model may think with (see `SKEIN_MODEL_THINKING_BUDGET`);
    /// absent or 0 for none.
    #[serde(default)]
    pub thinking_budget: Option<u64>,
    /// Whether the provider's models take images (see `SKEIN_MODEL_IMAGES`); absent for yes.
    #[serde(default)]
    pub images: Option<bool>,
    /// Scenario file of a `scripted` provider.
    #[serde(default)]
    pub scenario: Option<PathBuf>,
    /// Traffic limits of each of the provider's models that `SKEIN_MODEL_LIMITS` does not name.
    #[serde(default)]
    pub limits: Option<ProviderLimits>,
}

/// A provider's traffic limits per model; 0 turns one off.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderLimits {
    #[serde(default)]
    pub max_concurrency: u32,
    #[serde(default)]
    pub tokens_per_minute: u64,
}

impl From<ProviderLimits> for TrafficLimits {
    fn from(limits: ProviderLimits) -> Self {
        TrafficLimits {
            max_concurrency: limits.max_concurrency,
            tokens_per_minute: limits.tokens_per_minute,
        }
    }
}

impl ProvidersFile {
    /// Reads and checks the file at `path` (JSON when it starts with `{`, TOML otherwise).
    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("providers file {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("providers file {}: {e}", path.display()))
    }

    /// Parses and checks `text`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: ProvidersFile = if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| e.to_string())?
        } else {
            toml::from_str(text).map_err(|e| e.to_string())?
        };
        for (name, entry) in &file.providers {
            if !is_provider_name(name) {
                return Err(format!(
                    "provider name {name:?}: use letters, digits, '-' and '_'"
                ));
            }
            entry
                .check()
                .map_err(|e| format!("provider {name:?}: {e}"))?;
        }
        if let Some(default) = &file.default {
            if !file.providers.contains_key(default) {
                return Err(format!(
                    "default provider {default:?} is not one of the file's providers"
                ));
            }
        }
        Ok(file)
    }

    /// Each provider's traffic limits, by the prefix its models' names carry.
    pub fn limits(&self) -> BTreeMap<String, TrafficLimits> {
        self.providers
            .iter()
            .filter_map(|(name, entry)| Some((name.clone(), entry.limits?.into())))
            .collect()
    }
}

const KINDS: [&str; 4] = ["openai", "azure", "anthropic", "scripted"];

impl ProviderEntry {
    fn check(&self) -> Result<(), String> {
        if !KINDS.contains(&self.kind.as_str()) {
            return Err(format!(
                "unknown kind {:?} (use {})",
                self.kind,
                KINDS.join(", ")
            ));
        }
        if self.kind == "azure" && self.base_url.is_none() {
            return Err("an azure provider needs its resource's base_url".into());
        }
        if self.api_key_env.is_some() && self.api_key_file.is_some() {
            return Err("give api_key_env or api_key_file, not both".into());
        }
        if let Some(timeout) = &self.timeout {
            humantime::parse_duration(timeout).map_err(|e| format!("timeout {timeout:?}: {e}"))?;
        }
        if self.thinking_budget.is_some_and(|b| b > 0) && self.kind != "anthropic" {
            return Err(format!(
                "thinking_budget is read by the anthropic kind only, not {:?}",
                self.kind
            ));
        }
        self.header_map()?;
        Ok(())
    }

    /// The API key, from its variable or file; an unset variable is an error, so a provider
    /// never goes out without the key it was given.
    pub fn api_key(&self) -> Result<Option<String>, String> {
        let key = match (&self.api_key_env, &self.api_key_file) {
            (Some(var), _) => Some(std::env::var(var).map_err(|_| {
                format!("api_key_env names {var}, which is not set (or not UTF-8)")
            })?),
            (None, Some(path)) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| format!("api_key_file {}: {e}", path.display()))?
                    .trim_end_matches(['\r', '\n'])
                    .to_owned(),
            ),
            (None, None) => None,
        };
        if let Some(key) = &key {
            crate::agent::middleware::Redactor::check(key).map_err(|e| format!("API key: {e}"))?;
        }
        Ok(key)
    }

    fn header_map(&self) -> Result<HeaderMap, String> {
        let mut headers = HeaderMap::new();
        for (name, value) in &self.headers {
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("header name {name:?} is not a valid HTTP header name"))?;
            let value = HeaderValue::from_str(value)
                .map_err(|_| format!("header {name:?} holds characters a header cannot carry"))?;
            headers.insert(header, value);
        }
        Ok(headers)
    }

    /// The provider this entry describes; what it leaves out comes from `defaults` (timeout,
    /// answer bound), never its key or URL.
    fn build(&self, defaults: &ModelConfig) -> Result<Provider, String> {
        let mut cfg = defaults.clone();
        cfg.provider = self.kind.clone();
        cfg.base_url = self
            .base_url
            .clone()
            .unwrap_or_else(|| super::openai::DEFAULT_BASE_URL.to_owned());
        if let Some(version) = &self.api_version {
            cfg.api_version = version.clone();
        }
        cfg.max_tokens_field = self
            .max_tokens_field
            .clone()
            .unwrap_or_else(|| "auto".to_owned());
        if let Some(timeout) = &self.timeout {
            cfg.timeout = humantime::parse_duration(timeout)
                .map_err(|e| format!("timeout {timeout:?}: {e}"))?;
        }
        if let Some(max) = self.max_output_tokens {
            cfg.max_output_tokens = max;
        }
        cfg.scenario = self.scenario.clone();
        cfg.thinking_budget = self.thinking_budget.unwrap_or(0);
        cfg.images = self.images.unwrap_or(true);
        let provider = Provider::from_settings(&cfg, self.api_key()?).map_err(|e| e.to_string())?;
        let headers = self.header_map()?;
        if headers.is_empty() {
            return Ok(provider);
        }
        provider.with_headers(headers).map_err(|e| e.to_string())
    }
}

/// The API keys of the providers file's providers, for the redaction layer to mask.
pub fn provider_secrets(cfg: &ModelConfig) -> Vec<String> {
    let Some(path) = &cfg.providers_file else {
        return Vec::new();
    };
    let Ok(file) = ProvidersFile::read(path) else {
        return Vec::new();
    };
    file.providers
        .values()
        .filter_map(|entry| entry.api_key().ok().flatten())
        .collect()
}

#[cfg(test)]
mod tests;
