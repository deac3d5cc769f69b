//! Which traffic limits a model call is under: the defaults every model gets
//! (`SKEIN_MODEL_MAX_CONCURRENCY`, `SKEIN_MODEL_TOKENS_PER_MINUTE`), a model's own limits and a
//! tenant's limits from the file `SKEIN_MODEL_LIMITS` names:
//!
//! ```toml
//! [models."gpt-4o"]          # replaces the defaults for this model
//! max_concurrency = 8
//! tokens_per_minute = 400000
//!
//! [tenants.acme]             # caps tenant acme on each model, within the model's limits
//! max_concurrency = 2
//! tokens_per_minute = 50000
//! ```
//!
//! A model of a named provider (`anthropic:claude-sonnet-4-5`, see `agent::model::providers`)
//! without an entry of its own here has its provider's `limits`, if the providers file gives
//! some, else the defaults; when the file names a `default` provider with `limits`, those are the
//! defaults (names without a prefix go to it).
//!
//! 0 turns a limit off; unknown keys are refused, so a misspelt key fails at start.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::limits::TrafficLimits;
use crate::agent::model::providers::PROVIDER_SEPARATOR;

/// The limits of every model and tenant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrafficPolicy {
    pub defaults: TrafficLimits,
    pub models: BTreeMap<String, TrafficLimits>,
    /// The limits of each model of a named provider, by provider name (a provider without
    /// limits of its own is absent: its models have the defaults).
    pub providers: BTreeMap<String, TrafficLimits>,
    /// The providers file's `default` provider, whose limits (if any) apply to names without a
    /// provider's prefix.
    pub default_provider: Option<String>,
    /// Every named provider, to tell a provider's prefix from a colon in a model's own name.
    pub named_providers: std::collections::BTreeSet<String>,
    pub tenants: BTreeMap<String, TrafficLimits>,
}

/// The limits one call is under: its model's, and its tenant's on that model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallLimits {
    pub model: TrafficLimits,
    pub tenant: TrafficLimits,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default)]
    models: BTreeMap<String, LimitsEntry>,
    #[serde(default)]
    tenants: BTreeMap<String, LimitsEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsEntry {
    #[serde(default)]
    max_concurrency: u32,
    #[serde(default)]
    tokens_per_minute: u64,
}

impl From<LimitsEntry> for TrafficLimits {
    fn from(entry: LimitsEntry) -> Self {
        TrafficLimits {
            max_concurrency: entry.max_concurrency,
            tokens_per_minute: entry.tokens_per_minute,
        }
    }
}

impl TrafficPolicy {
    /// The defaults of `SKEIN_MODEL_*` and the file `SKEIN_MODEL_LIMITS` names, if any.
    pub fn from_config(model: &crate::config::ModelConfig) -> Result<Self, String> {
        let defaults = TrafficLimits::from_config(model);
        let mut policy = match &model.limits_file {
            Some(path) => Self::from_file(defaults, path)?,
            None => Self {
                defaults,
                ..Self::default()
            },
        };
        if let Some(path) = &model.providers_file {
            let file = crate::agent::model::providers::ProvidersFile::read(path)?;
            policy.providers = file.limits();
            policy.named_providers = file.providers.keys().cloned().collect();
            policy.default_provider = file.default;
        }
        Ok(policy)
    }

    /// `defaults` with the limits of a TOML file.
    pub fn from_file(defaults: TrafficLimits, path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("model limits file {}: {e}", path.display()))?;
        Self::parse(defaults, &text)
            .map_err(|e| format!("model limits file {}: {e}", path.display()))
    }

    /// `defaults` with the limits of TOML `text`.
    pub fn parse(defaults: TrafficLimits, text: &str) -> Result<Self, String> {
        let file: PolicyFile = toml::from_str(text).map_err(|e| e.to_string())?;
        for tenant in file.tenants.keys() {
            crate::protocol::validate_token("tenant", tenant).map_err(|f| f.message)?;
        }
        if let Some(empty) = file.models.keys().find(|m| m.trim().is_empty()) {
            return Err(format!("a model name is empty: {empty:?}"));
        }
        Ok(Self {
            defaults,
            providers: BTreeMap::new(),
            default_provider: None,
            named_providers: Default::default(),
            models: file
                .models
                .into_iter()
                .map(|(k, v)| (k, v.into()))
                .collect(),
            tenants: file
                .tenants
                .into_iter()
                .map(|(k, v)| (k, v.into()))
                .collect(),
        })
    }

    /// Whether no call is ever limited.
    pub fn is_off(&self) -> bool {
        self.defaults.is_off()
            && self.models.values().all(TrafficLimits::is_off)
            && self.providers.values().all(TrafficLimits::is_off)
            && self.tenants.values().all(TrafficLimits::is_off)
    }

    /// The limits a call of `tenant` on `model` is under.
    pub fn for_call(&self, model: &str, tenant: &str) -> CallLimits {
        CallLimits {
            model: self
                .models
                .get(model)
                .or_else(|| {
                    let provider = match model.split_once(PROVIDER_SEPARATOR) {
                        Some((prefix, _)) if self.named_providers.contains(prefix) => prefix,
                        // A name without a provider's prefix goes to the default provider.
                        _ => self.default_provider.as_deref()?,
                    };
                    self.providers.get(provider)
                })
                .copied()
                .unwrap_or(self.defaults),
            tenant: self.tenants.get(tenant).copied().unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULTS: TrafficLimits = TrafficLimits {
        max_concurrency: 4,
        tokens_per_minute: 0,
    };

    #[test]
    fn a_model_replaces_the_defaults_and_a_tenant_caps_itself() {
        let policy = TrafficPolicy::parse(
            DEFAULTS,
            r#"
            [models."gpt-4o"]
            max_concurrency = 8
            tokens_per_minute = 400000
            [tenants.acme]
            max_concurrency = 2
            "#,
        )
        .expect("a valid file");
        let gpt = policy.for_call("gpt-4o", "acme");
        assert_eq!(gpt.model.max_concurrency, 8);
        assert_eq!(gpt.model.tokens_per_minute, 400_000);
        assert_eq!(gpt.tenant.max_concurrency, 2);
        let other = policy.for_call("llama3", "globex");
        assert_eq!(other.model, DEFAULTS);
        assert!(other.tenant.is_off());
        assert!(!policy.is_off());
    }

    #[test]
    fn a_named_provider_s_models_have_its_limits_unless_the_file_names_them() {
        let mut policy = TrafficPolicy::parse(
            DEFAULTS,
            "[models.\"anthropic:claude-opus-4\"]\nmax_concurrency = 1\n",
        )
        .expect("a valid file");
        let providers = crate::agent::model::providers::ProvidersFile::parse(
            "[providers.anthropic]\nkind = \"anthropic\"\nlimits = { max_concurrency = 3 }\n",
        )
        .expect("a valid providers file");
        policy.providers = providers.limits();
        policy.named_providers = providers.providers.keys().cloned().collect();
        assert_eq!(
            policy
                .for_call("anthropic:claude-sonnet-4-5", "acme")
                .model
                .max_concurrency,
            3
        );
        assert_eq!(
            policy
                .for_call("anthropic:claude-opus-4", "acme")
                .model
                .max_concurrency,
            1,
            "the model's own entry wins"
        );
        assert_eq!(policy.for_call("llama3:8b", "acme").model, DEFAULTS);
        assert_eq!(policy.for_call("claude-sonnet-4-5", "acme").model, DEFAULTS);
    }

    #[test]
    fn mistakes_in_the_file_are_refused_with_what_is_wrong() {
        let misspelt = TrafficPolicy::parse(DEFAULTS, "[tenants.acme]\nmax_concurency = 2\n");
        assert!(misspelt
            .expect_err("a misspelt key")
            .contains("max_concurency"));
        let bad_tenant = TrafficPolicy::parse(DEFAULTS, "[tenants.\"a:b\"]\nmax_concurrency = 2\n");
        assert!(bad_tenant
            .expect_err("a bad tenant name")
            .contains("tenant"));
        let negative = TrafficPolicy::parse(DEFAULTS, "[models.m]\nmax_concurrency = -1\n");
        assert!(negative.is_err());
    }

    #[test]
    fn a_policy_of_zeros_is_off() {
        let policy = TrafficPolicy::parse(
            TrafficLimits::default(),
            "[models.m]\nmax_concurrency = 0\n[tenants.acme]\ntokens_per_minute = 0\n",
        )
        .expect("valid");
        assert!(policy.is_off());
    }
}
