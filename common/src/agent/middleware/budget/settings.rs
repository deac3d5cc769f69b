//! What the budget layer is configured with: model prices, the bound of a call's answer, and the
//! tenants' daily budgets; and the estimate of a request's size (what an answer without reported
//! usage is charged; the reservation holds the prompt's bound, `sizing::prompt_bound`).
//!
//! Invariants: settings that passed [`BudgetSettings::from_config`] hold only finite,
//! non-negative prices and positive or absent limits; a price or tenant setting is JSON, given
//! inline (it starts with `{`) or as the path of a file that holds it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::agent::model::ModelRequest;
use crate::config::ModelConfig;
use crate::protocol::budget::{usd_to_nanos, MAX_BUDGET_TOKENS, MAX_BUDGET_USD};
use crate::store::budget::LedgerLimits;

/// The price entry that applies to every model without one of its own.
pub const ANY_MODEL: &str = "*";

/// How much longer than the model timeout a reservation stands if its holder never settles it.
const HOLD_MARGIN: Duration = Duration::from_secs(60);

/// What a model's tokens cost, in US dollars per million. Prompt tokens read from or written to
/// the provider's prompt cache (Anthropic's) cost their own prices when given, else the input
/// price.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input_per_million: f64,
    pub output_per_million: f64,
    #[serde(default)]
    pub cache_read_per_million: Option<f64>,
    #[serde(default)]
    pub cache_write_per_million: Option<f64>,
}

impl Price {
    /// The highest a prompt token may cost: a reservation made before the call cannot know
    /// which of its tokens the cache will serve or take.
    fn prompt_ceiling(&self) -> f64 {
        let input = self.input_per_million;
        input
            .max(self.cache_read_per_million.unwrap_or(input))
            .max(self.cache_write_per_million.unwrap_or(input))
    }

    /// The most a call of `prompt` prompt tokens and `output` answer tokens may cost, in
    /// nano-dollars, whatever the prompt cache does.
    pub fn worst_cost_nanos(&self, prompt: u64, output: u64) -> u64 {
        Price {
            input_per_million: self.prompt_ceiling(),
            ..*self
        }
        .cost_nanos(prompt, output)
    }

    /// What a call's reported `usage` cost, in nano-dollars, rounded up: cache reads and writes
    /// at their prices, the rest of the prompt at the input price.
    pub fn usage_cost_nanos(&self, usage: &crate::protocol::message::Usage) -> u64 {
        let input = self.input_per_million;
        let plain = usage
            .prompt_tokens
            .saturating_sub(usage.cache_read_tokens)
            .saturating_sub(usage.cache_write_tokens);
        let nanos = (plain as f64 * input
            + usage.cache_read_tokens as f64 * self.cache_read_per_million.unwrap_or(input)
            + usage.cache_write_tokens as f64 * self.cache_write_per_million.unwrap_or(input)
            + usage.completion_tokens as f64 * self.output_per_million)
            * 1000.0;
        usd_to_nanos(nanos.ceil() / 1e9)
    }

    /// The cost of `input` prompt and `output` completion tokens, in nano-dollars, rounded up
    /// (a worst case never comes out below the truth).
    pub fn cost_nanos(&self, input: u64, output: u64) -> u64 {
        // $x per million tokens is x * 1000 nano-dollars per token.
        let nanos = (input as f64 * self.input_per_million
            + output as f64 * self.output_per_million)
            * 1000.0;
        usd_to_nanos(nanos.ceil() / 1e9)
    }

    fn check(&self, model: &str) -> Result<(), String> {
        for (what, value) in [
            ("input_per_million", self.input_per_million),
            ("output_per_million", self.output_per_million),
            (
                "cache_read_per_million",
                self.cache_read_per_million.unwrap_or(0.0),
            ),
            (
                "cache_write_per_million",
                self.cache_write_per_million.unwrap_or(0.0),
            ),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(format!(
                    "price of {model:?}: {what} must be a number of at least 0, got {value}"
                ));
            }
        }
        Ok(())
    }
}

/// Prices by model name, with an optional [`ANY_MODEL`] entry for the rest.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prices(BTreeMap<String, Price>);

impl Prices {
    /// Reads `{"model": {"input_per_million": x, "output_per_million": y}, ...}`.
    pub fn parse(json: &str) -> Result<Self, String> {
        let prices: BTreeMap<String, Price> =
            serde_json::from_str(json).map_err(|e| format!("model prices: {e}"))?;
        for (model, price) in &prices {
            price.check(model)?;
        }
        Ok(Self(prices))
    }

    /// The price of `model`: its own; for a named provider's `NAME:MODEL`, else `MODEL`'s; else
    /// the [`ANY_MODEL`] entry.
    pub fn get(&self, model: &str) -> Option<&Price> {
        self.0
            .get(model)
            .or_else(|| {
                let (_, bare) =
                    model.split_once(crate::agent::model::providers::PROVIDER_SEPARATOR)?;
                self.0.get(bare)
            })
            .or_else(|| self.0.get(ANY_MODEL))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// One tenant's daily limits in the tenant budgets file; an absent one is the default's, 0 turns
/// it off for that tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantDaily {
    pub daily_tokens: Option<u64>,
    pub daily_cost_usd: Option<f64>,
}

/// The tenants' daily budgets: a default for every tenant, and entries by tenant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantBudgets {
    default: LedgerLimits,
    by_tenant: BTreeMap<String, LedgerLimits>,
}

impl TenantBudgets {
    /// Every tenant under `default`, except those `json` (`{"tenant": {"daily_tokens": n,
    /// "daily_cost_usd": x}}`) names.
    pub fn new(default: LedgerLimits, json: Option<&str>) -> Result<Self, String> {
        let entries: BTreeMap<String, TenantDaily> = match json {
            Some(json) => serde_json::from_str(json).map_err(|e| format!("tenant budgets: {e}"))?,
            None => BTreeMap::new(),
        };
        let mut by_tenant = BTreeMap::new();
        for (tenant, entry) in entries {
            let tokens = entry.daily_tokens.unwrap_or(default.tokens);
            let cost_nanos = match entry.daily_cost_usd {
                Some(usd) => {
                    daily_cost(usd).map_err(|e| format!("tenant budgets: {tenant}: {e}"))?
                }
                None => default.cost_nanos,
            };
            if tokens > MAX_BUDGET_TOKENS {
                return Err(format!(
                    "tenant budgets: {tenant}: daily_tokens must be at most {MAX_BUDGET_TOKENS}"
                ));
            }
            by_tenant.insert(tenant, LedgerLimits { tokens, cost_nanos });
        }
        Ok(Self { default, by_tenant })
    }

    /// `tenant`'s daily limits (off when both are 0).
    pub fn limits(&self, tenant: &str) -> LedgerLimits {
        self.by_tenant.get(tenant).copied().unwrap_or(self.default)
    }
}

/// A daily cost limit in nano-dollars; 0 turns it off.
fn daily_cost(usd: f64) -> Result<u64, String> {
    if !(usd.is_finite() && (0.0..=MAX_BUDGET_USD).contains(&usd)) {
        return Err(format!(
            "a daily cost must be 0 (off) to {MAX_BUDGET_USD} dollars, got {usd}"
        ));
    }
    Ok(usd_to_nanos(usd))
}

/// Everything the budget layer needs besides the store.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetSettings {
    pub prices: Prices,
    /// The most answer tokens an attempt under a budget may take: reserved as part of its worst
    /// case and sent to the server as its bound (less when the budget has less room left).
    pub max_output_tokens: u64,
    pub tenants: TenantBudgets,
    /// How long a reservation stands if its holder never settles it.
    pub hold: Duration,
}

impl Default for BudgetSettings {
    fn default() -> Self {
        Self {
            prices: Prices::default(),
            max_output_tokens: 4096,
            tenants: TenantBudgets::default(),
            hold: Duration::from_secs(120) + HOLD_MARGIN,
        }
    }
}

impl BudgetSettings {
    /// The settings `model` configures; an error names the setting at fault.
    pub fn from_config(model: &ModelConfig) -> Result<Self, String> {
        let prices = match &model.prices {
            Some(setting) => Prices::parse(&json_setting(setting, "model prices")?)?,
            None => Prices::default(),
        };
        if model.max_output_tokens == 0 || model.max_output_tokens > MAX_BUDGET_TOKENS {
            return Err(format!(
                "model max output tokens must be 1 to {MAX_BUDGET_TOKENS}"
            ));
        }
        let default = LedgerLimits {
            tokens: model.tenant_daily_tokens,
            cost_nanos: daily_cost(model.tenant_daily_cost_usd)
                .map_err(|e| format!("tenant daily cost: {e}"))?,
        };
        let tenants_json = match &model.tenant_budgets {
            Some(setting) => Some(json_setting(setting, "tenant budgets")?),
            None => None,
        };
        Ok(Self {
            prices,
            max_output_tokens: model.max_output_tokens,
            tenants: TenantBudgets::new(default, tenants_json.as_deref())?,
            hold: model.timeout + HOLD_MARGIN,
        })
    }
}

/// A JSON setting: the value itself when it starts with `{`, else the content of the file it
/// names.
fn json_setting(value: &str, what: &str) -> Result<String, String> {
    if value.trim_start().starts_with('{') {
        return Ok(value.to_owned());
    }
    std::fs::read_to_string(value).map_err(|e| format!("{what}: cannot read {value}: {e}"))
}

/// A rough count of a request's prompt tokens: a quarter of the bytes of its messages (with a
/// little framing each), tool specs and output schema, rounded up.
pub fn estimate_prompt_tokens(request: &ModelRequest) -> u64 {
    // Byte bounds (no JSON is built: this runs for every model call).
    use crate::agent::tokens::{schema_upper_bound, upper_bound};
    (upper_bound(&request.messages)
        + request.tools.upper_bound()
        + schema_upper_bound(request.output_schema.as_deref()))
    .div_ceil(4)
}

/// A rough count of an answer's tokens (for servers that report no usage).
pub fn estimate_text_tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::message::Message;

    #[test]
    fn prices_read_inline_with_a_fallback_entry() {
        let prices = Prices::parse(
            r#"{"gpt-4o": {"input_per_million": 2.5, "output_per_million": 10},
                "*": {"input_per_million": 1, "output_per_million": 2}}"#,
        )
        .expect("valid prices");
        assert_eq!(
            prices.get("gpt-4o").map(|p| p.output_per_million),
            Some(10.0)
        );
        assert_eq!(prices.get("other").map(|p| p.input_per_million), Some(1.0));
        let bad = Prices::parse(r#"{"m": {"input_per_million": -1, "output_per_million": 0}}"#)
            .expect_err("negative price");
        assert!(bad.contains("input_per_million"), "{bad}");
        assert!(Prices::parse(r#"{"m": {"input": 1}}"#).is_err());
        assert!(Prices::default().get("gpt-4o").is_none());
    }

    #[test]
    fn a_cost_is_in_nano_dollars_rounded_up() {
        let price = Price {
            input_per_million: 2.5,
            cache_read_per_million: None,
            cache_write_per_million: None,
            output_per_million: 10.0,
        };
        // 1000 input tokens at $2.50/M = $0.0025; 100 output at $10/M = $0.001.
        assert_eq!(price.cost_nanos(1000, 100), 3_500_000);
        let cheap = Price {
            input_per_million: 0.0001,
            cache_read_per_million: None,
            cache_write_per_million: None,
            output_per_million: 0.0,
        };
        assert_eq!(
            cheap.cost_nanos(1, 0),
            1,
            "a fraction of a nano-dollar counts as one"
        );
        assert_eq!(cheap.cost_nanos(0, 0), 0);
    }

    #[test]
    fn cache_reads_and_writes_cost_their_prices_and_a_reservation_their_highest() {
        let prices = Prices::parse(
            r#"{"claude-sonnet-4-5": {"input_per_million": 3, "output_per_million": 15,
                "cache_read_per_million": 0.3, "cache_write_per_million": 3.75}}"#,
        )
        .expect("valid prices");
        let price = prices
            .get("anthropic:claude-sonnet-4-5")
            .expect("a named provider's model has its bare name's price");
        let usage = crate::protocol::message::Usage {
            prompt_tokens: 1_000_000,
            completion_tokens: 100_000,
            cache_read_tokens: 500_000,
            cache_write_tokens: 200_000,
        };
        // 300k plain at $3/M + 500k read at $0.30/M + 200k written at $3.75/M + 100k out at $15/M.
        let expected_usd = 0.9 + 0.15 + 0.75 + 1.5;
        let cost = price.usage_cost_nanos(&usage);
        assert!(
            cost.abs_diff(usd_to_nanos(expected_usd)) <= 1,
            "{cost} nano-dollars, expected {expected_usd} USD"
        );
        assert_eq!(
            price.worst_cost_nanos(1_000_000, 0),
            usd_to_nanos(3.75),
            "a reservation prices every prompt token at the highest prompt rate"
        );
        assert!(price.worst_cost_nanos(1_000_000, 100_000) >= price.usage_cost_nanos(&usage));
        let bad = Prices::parse(
            r#"{"m": {"input_per_million": 1, "output_per_million": 1, "cache_read_per_million": -1}}"#,
        )
        .expect_err("a negative cache price");
        assert!(bad.contains("cache_read_per_million"), "{bad}");
    }

    #[test]
    fn tenant_entries_override_the_default_limit_by_limit() {
        let default = LedgerLimits {
            tokens: 1000,
            cost_nanos: 0,
        };
        let tenants = TenantBudgets::new(
            default,
            Some(r#"{"acme": {"daily_cost_usd": 2}, "globex": {"daily_tokens": 0}}"#),
        )
        .expect("valid tenants");
        assert_eq!(
            tenants.limits("acme"),
            LedgerLimits {
                tokens: 1000,
                cost_nanos: 2_000_000_000
            }
        );
        assert!(tenants.limits("globex").is_off());
        assert_eq!(tenants.limits("initech"), default);
        assert!(TenantBudgets::new(default, Some(r#"{"a": {"daily_cost_usd": -1}}"#)).is_err());
        assert!(TenantBudgets::new(default, Some(r#"{"a": {"tokens": 1}}"#)).is_err());
    }

    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        model: ModelConfig,
    }

    fn from_flags(flags: &[&str]) -> Result<BudgetSettings, String> {
        use clap::Parser;
        let args = std::iter::once("skein").chain(flags.iter().copied());
        let flags = Flags::try_parse_from(args).map_err(|e| e.to_string())?;
        BudgetSettings::from_config(&flags.model)
    }

    #[test]
    fn settings_come_from_the_model_flags_and_name_what_is_wrong() {
        let settings = from_flags(&[
            "--model-prices",
            r#"{"m": {"input_per_million": 1, "output_per_million": 2}}"#,
            "--model-max-output-tokens",
            "10",
            "--tenant-daily-tokens",
            "50",
            "--model-timeout",
            "30s",
        ])
        .expect("valid settings");
        assert!(settings.prices.get("m").is_some());
        assert_eq!(settings.max_output_tokens, 10);
        assert_eq!(settings.tenants.limits("anyone").tokens, 50);
        assert_eq!(settings.hold, Duration::from_secs(90));
        assert_eq!(
            from_flags(&[]).expect("the defaults are valid"),
            BudgetSettings::default()
        );
        for (flags, named) in [
            (&["--model-prices", "{not json"][..], "model prices"),
            (&["--model-max-output-tokens", "0"], "max output tokens"),
            (&["--tenant-daily-cost-usd=-1"], "tenant daily cost"),
            (&["--tenant-budgets", "{\"a\": 1}"], "tenant budgets"),
        ] {
            let refused = from_flags(flags).expect_err(named);
            assert!(refused.contains(named), "{refused}");
        }
    }

    #[test]
    fn json_settings_are_inline_or_a_file() {
        assert_eq!(
            json_setting(" {\"a\": 1}", "x").as_deref(),
            Ok(" {\"a\": 1}")
        );
        let dir = std::env::temp_dir().join(format!("skein-prices-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("prices.json");
        std::fs::write(&file, "{}").expect("written");
        let path = file.display().to_string();
        assert_eq!(json_setting(&path, "x").as_deref(), Ok("{}"));
        let missing = json_setting(&dir.join("nope").display().to_string(), "model prices")
            .expect_err("missing file");
        assert!(
            missing.starts_with("model prices: cannot read"),
            "{missing}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_prompt_estimate_grows_with_the_conversation() {
        let request = |text: &str| ModelRequest {
            model: "m".into(),
            agent: "a".into(),
            messages: std::sync::Arc::new(vec![Message::system("be brief"), Message::user(text)]),
            tools: Default::default(),
            max_output_tokens: None,
            output_schema: None,
        };
        let short = estimate_prompt_tokens(&request("hi"));
        let long = estimate_prompt_tokens(&request(&"x".repeat(4000)));
        assert!(short > 0);
        assert!(long > short + 990, "{short} {long}");
        assert_eq!(estimate_text_tokens("abcde"), 2);
    }
}
